package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
)

// request is what the worker read from one inference request.
type request struct {
	api      string
	body     gjson.Result
	model    string
	stream   bool
	leg      string
	prefill  bool // a prefill leg (vLLM prefill, TensorRT-LLM context, SGLang prefill)
	rank     int
	prompt   string
	maxToks  int // 0: no limit asked
	seen     map[string]string
	kvParams gjson.Result
	dpParams gjson.Result
}

func (w *worker) serveInference(rw http.ResponseWriter, r *http.Request, api string) {
	seen := w.echoHeaders(rw, r)
	if r.Method != http.MethodPost {
		rw.Header().Set("Allow", http.MethodPost)
		writeError(rw, http.StatusMethodNotAllowed, "use POST", nil)
		return
	}
	rank, err := w.parseRank(r.Header.Get(rankHeader))
	if err != nil {
		writeError(rw, http.StatusBadRequest, err.Error(), nil)
		return
	}
	rw.Header().Set("x-mock-dp-rank", strconv.Itoa(rank))
	raw, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, maxBodyBytes))
	if err != nil {
		writeError(rw, http.StatusBadRequest, "cannot read the body: "+err.Error(), nil)
		return
	}
	if !gjson.ValidBytes(raw) || !gjson.ParseBytes(raw).IsObject() {
		writeError(rw, http.StatusBadRequest, "the body is not a JSON object", nil)
		return
	}
	req := w.readRequest(api, gjson.ParseBytes(raw), rank, seen)
	role := w.cfg.Role
	if role == roleBoth {
		role = roleDecode
		if req.prefill {
			role = rolePrefill
		}
	}
	rw.Header().Set("x-mock-role", role)
	rw.Header().Set("x-mock-leg", req.leg)
	mock := w.mockFacts(req, role)

	rs := w.ranks[rank]
	if !rs.acquire(r.Context()) {
		writeError(rw, http.StatusServiceUnavailable, "client went away while waiting", mock)
		return
	}
	defer rs.release()

	if d := req.magicSlow(); d > 0 {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		}
	}
	if status := req.magicFail(); status != 0 {
		writeError(rw, status, fmt.Sprintf("mock failure asked by the prompt (status %d)", status), mock)
		return
	}
	rs.served.Add(1)
	w.respond(rw, req, mock)
}

// echoHeaders copies the echoed request headers to x-mock-saw-* and returns them.
func (w *worker) echoHeaders(rw http.ResponseWriter, r *http.Request) map[string]string {
	seen := make(map[string]string)
	for _, name := range w.echo {
		if v := r.Header.Values(name); len(v) > 0 {
			joined := strings.Join(v, ",")
			seen[name] = joined
			rw.Header().Set(headerPrefix+name, joined)
		}
	}
	return seen
}

// parseRank reads x-data-parallel-rank: absent is rank 0; anything else must be a rank of
// this worker (vLLM refuses a rank outside [0, data_parallel_size)).
func (w *worker) parseRank(v string) (int, error) {
	if v == "" {
		return 0, nil
	}
	rank, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || rank < 0 || rank >= w.cfg.DPSize {
		return 0, fmt.Errorf("%s %q is not a rank in [0, %d)", rankHeader, v, w.cfg.DPSize)
	}
	return rank, nil
}

// readRequest reads what the worker answers by from an inference body.
func (w *worker) readRequest(api string, body gjson.Result, rank int, seen map[string]string) *request {
	req := &request{api: api, body: body, rank: rank, seen: seen, leg: legDirect}
	req.model = body.Get("model").String()
	if req.model == "" {
		req.model = w.cfg.Model
	}
	req.stream = body.Get("stream").Bool()
	req.kvParams = body.Get("kv_transfer_params")
	req.dpParams = body.Get("disaggregated_params")
	req.leg, req.prefill = w.requestLeg(body, req.kvParams, req.dpParams)
	req.prompt = promptText(body)
	for _, k := range []string{"max_completion_tokens", "max_tokens", "max_output_tokens"} {
		if v := body.Get(k); v.Type == gjson.Number && v.Int() > 0 {
			req.maxToks = int(min(v.Int(), 1<<20))
			break
		}
	}
	return req
}

// mockFacts is the "mock" object of a response: who served, and what arrived.
func (w *worker) mockFacts(req *request, role string) map[string]any {
	m := map[string]any{
		"served_by": w.cfg.Name,
		"role":      role,
		"leg":       req.leg,
		"dp_rank":   req.rank,
		"api":       req.api,
		"stream":    req.stream,
		"model":     req.model,
		"headers":   req.seen,
	}
	if req.kvParams.Exists() {
		m["kv_transfer_params"] = json.RawMessage(req.kvParams.Raw)
	}
	if req.dpParams.Exists() {
		m["disaggregated_params"] = json.RawMessage(req.dpParams.Raw)
	}
	boot := map[string]any{}
	for _, k := range []string{"bootstrap_host", "bootstrap_port", "bootstrap_room"} {
		if v := req.body.Get(k); v.Exists() {
			boot[k] = json.RawMessage(v.Raw)
		}
	}
	if len(boot) > 0 {
		if w.cfg.Role == rolePrefill {
			host := req.body.Get("bootstrap_host").String()
			host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
			boot["matches_self"] = host == w.host && req.body.Get("bootstrap_port").Int() == int64(w.cfg.BootstrapPort)
		}
		m["bootstrap"] = boot
	}
	return m
}
