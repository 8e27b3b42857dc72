// Command kvroute-mockworker is a mock OpenAI-compatible inference server for kvroute's
// end-to-end tests behind a real Envoy. It speaks just enough of vLLM, TensorRT-LLM and SGLang
// for the filter's routing and prefill/decode protocols to be checked from the outside, and it
// tells the test exactly what reached it.
//
// Usage:
//
//	kvroute-mockworker -listen 127.0.0.1:8001 -role decode -dp-size 2
//
// Flags: -listen (host:port, port 0 picks one), -role decode|prefill|both, -name (defaults to
// the bound address), -dp-size N (DP ranks, chosen by the x-data-parallel-rank header),
// -bootstrap-port (this worker's SGLang bootstrap port), -model (model_name of the metrics),
// -max-running N (requests running at once per rank; the rest wait, 0 = no limit) and
// -echo-headers (more request headers to echo). It prints
// "kvroute-mockworker listening on ADDR" once it accepts connections.
//
// Endpoints: POST /v1/chat/completions, /v1/completions, /v1/responses; GET /metrics (vLLM's
// Prometheus text: vllm:num_requests_running, vllm:num_requests_waiting and
// vllm:kv_cache_usage_perc per engine="<rank>", plus mock:requests_total), GET /health and
// GET /v1/models.
//
// Every response carries x-mock-served-by, x-mock-role (prefill or decode; a worker of role
// "both" names the leg it served), x-mock-dp-rank, and for inference x-mock-leg (direct,
// vllm-prefill, vllm-decode, trtllm-context, trtllm-generation, sglang-prefill, sglang-decode)
// and x-mock-saw-<header> for each of x-request-id, x-gateway-destination-endpoint,
// x-data-parallel-rank, x-prefiller-host-port, x-prefiller-data-parallel-rank,
// x-kvroute-decision and x-session-id that the request had. The JSON body (the first chunk of
// a stream) holds the same facts in its "mock" object, with the kv_transfer_params,
// disaggregated_params and bootstrap_* values received.
//
// Protocols: a body with kv_transfer_params.do_remote_decode=true is a vLLM NixlConnector
// prefill: one token, non-streaming, and kv_transfer_params naming this worker. A body with
// disaggregated_params.request_type="context_only" is a TensorRT-LLM context leg: one token,
// finish_reason "length" ("stop" when the prompt says FINISH_IN_CONTEXT) and
// choices[0].disaggregated_params. bootstrap_host/port/room make an SGLang leg: a prefill leg
// on a worker of role prefill, a decode leg otherwise.
//
// Magic words in the prompt text: FAIL_<status> answers that status (4xx and 5xx) with an
// OpenAI error body, SLOW_<ms> waits first (at most 120 s); FAIL_PREFILL_<status>,
// SLOW_PREFILL_<ms>, FAIL_DECODE_<status> and SLOW_DECODE_<ms> do so only on prefill legs, or
// only on decode and direct ones. "stream": true answers Server-Sent Events: chat and
// completions chunks then "data: [DONE]"; /v1/responses the typed response.* events.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// config is what the flags set.
type config struct {
	Listen        string
	Name          string
	Role          string
	DPSize        int
	BootstrapPort int
	Model         string
	MaxRunning    int
	EchoHeaders   []string
	// Address is the bound host:port; the vLLM prefill answer names it as remote_host/port.
	Address string
}

// run parses args, listens, announces the address on out and serves until ctx ends.
func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("kvroute-mockworker", flag.ContinueOnError)
	fs.SetOutput(out)
	cfg := config{}
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:0", "address to listen on (host:port; port 0 picks a free one)")
	fs.StringVar(&cfg.Role, "role", roleBoth, "decode, prefill or both")
	fs.StringVar(&cfg.Name, "name", "", "name in x-mock-served-by (default: the bound address)")
	fs.IntVar(&cfg.DPSize, "dp-size", 1, "data-parallel ranks")
	fs.IntVar(&cfg.BootstrapPort, "bootstrap-port", 8998, "this worker's SGLang bootstrap port")
	fs.StringVar(&cfg.Model, "model", defaultModel, "model_name label of the metrics")
	fs.IntVar(&cfg.MaxRunning, "max-running", 0, "requests running at once per rank; more wait (0: no limit)")
	echo := fs.String("echo-headers", "", "comma-separated extra request headers to echo as x-mock-saw-<name>")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *echo != "" {
		cfg.EchoHeaders = strings.Split(*echo, ",")
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	cfg.Address = ln.Addr().String()
	w, err := newWorker(cfg)
	if err != nil {
		ln.Close()
		return err
	}
	srv := &http.Server{Handler: w.handler(), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	fmt.Fprintf(out, "kvroute-mockworker listening on %s name=%s role=%s dp_size=%d\n", cfg.Address, w.cfg.Name, cfg.Role, cfg.DPSize)
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		srv.Close()
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "kvroute-mockworker:", err)
		os.Exit(1)
	}
}
