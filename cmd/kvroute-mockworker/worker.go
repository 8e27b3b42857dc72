package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
)

const (
	maxBodyBytes = 64 << 20
	kvCapacity   = 16 // requests that fill the mock KV cache when -max-running is 0
	defaultModel = "m"
	headerPrefix = "x-mock-saw-"
	rankHeader   = "x-data-parallel-rank"
	roleBoth     = "both"
	rolePrefill  = "prefill"
	roleDecode   = "decode"
)

// echoedHeaders are the request headers a response echoes as x-mock-saw-<name>.
var echoedHeaders = []string{
	"x-request-id",
	"x-gateway-destination-endpoint",
	"x-data-parallel-rank",
	"x-prefiller-host-port",
	"x-prefiller-data-parallel-rank",
	"x-kvroute-decision",
	"x-session-id",
}

// worker serves one mock inference server.
type worker struct {
	cfg   config
	host  string
	port  int
	ranks []*rankState
	seq   atomic.Uint64
	echo  []string
}

func newWorker(cfg config) (*worker, error) {
	switch cfg.Role {
	case roleBoth, rolePrefill, roleDecode:
	default:
		return nil, fmt.Errorf("-role %q: want decode, prefill or both", cfg.Role)
	}
	if cfg.DPSize < 1 {
		return nil, fmt.Errorf("-dp-size %d: want at least 1", cfg.DPSize)
	}
	if cfg.MaxRunning < 0 {
		return nil, fmt.Errorf("-max-running %d: want 0 or more", cfg.MaxRunning)
	}
	if cfg.BootstrapPort < 0 || cfg.BootstrapPort > 65535 {
		return nil, fmt.Errorf("-bootstrap-port %d: want 0..65535", cfg.BootstrapPort)
	}
	if cfg.Model == "" {
		cfg.Model = defaultModel
	}
	host, portStr, err := net.SplitHostPort(cfg.Address)
	if err != nil {
		return nil, fmt.Errorf("address %q: %v", cfg.Address, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("address %q: bad port", cfg.Address)
	}
	if cfg.Name == "" {
		cfg.Name = cfg.Address
	}
	w := &worker{cfg: cfg, host: host, port: port}
	for i := 0; i < cfg.DPSize; i++ {
		r := &rankState{}
		if cfg.MaxRunning > 0 {
			r.slots = make(chan struct{}, cfg.MaxRunning)
		}
		w.ranks = append(w.ranks, r)
	}
	w.echo = append(w.echo, echoedHeaders...)
	for _, h := range cfg.EchoHeaders {
		if h = strings.ToLower(strings.TrimSpace(h)); h != "" && !contains(w.echo, h) {
			w.echo = append(w.echo, h)
		}
	}
	return w, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// handler routes the worker's endpoints.
func (w *worker) handler() http.Handler {
	mux := http.NewServeMux()
	for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/v1/responses"} {
		api := path
		mux.HandleFunc(path, func(rw http.ResponseWriter, r *http.Request) { w.serveInference(rw, r, api) })
	}
	mux.HandleFunc("/metrics", w.serveMetrics)
	mux.HandleFunc("/health", w.serveHealth)
	mux.HandleFunc("/v1/models", w.serveModels)
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		h := rw.Header()
		h.Set("x-mock-served-by", w.cfg.Name)
		h.Set("x-mock-role", w.cfg.Role)
		rank := r.Header.Get(rankHeader)
		if rank == "" {
			rank = "0"
		}
		h.Set("x-mock-dp-rank", rank)
		mux.ServeHTTP(rw, r)
	})
}

// rankState is the load of one DP rank.
type rankState struct {
	running atomic.Int64
	waiting atomic.Int64
	served  atomic.Int64
	slots   chan struct{} // nil without -max-running
}

// acquire takes a running slot, counting the request as waiting until it has one.
func (rs *rankState) acquire(ctx context.Context) bool {
	if rs.slots != nil {
		rs.waiting.Add(1)
		select {
		case rs.slots <- struct{}{}:
			rs.waiting.Add(-1)
		case <-ctx.Done():
			rs.waiting.Add(-1)
			return false
		}
	}
	rs.running.Add(1)
	return true
}

func (rs *rankState) release() {
	rs.running.Add(-1)
	if rs.slots != nil {
		<-rs.slots
	}
}

func (w *worker) serveHealth(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeError(rw, http.StatusMethodNotAllowed, "use GET", nil)
		return
	}
	rw.WriteHeader(http.StatusOK)
}
