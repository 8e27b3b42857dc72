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
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tidwall/gjson"
)

const (
	maxBodyBytes  = 64 << 20
	maxSlow       = 120 * time.Second
	kvCapacity    = 16 // requests that fill the mock KV cache when -max-running is 0
	defaultModel  = "m"
	headerPrefix  = "x-mock-saw-"
	rankHeader    = "x-data-parallel-rank"
	roleBoth      = "both"
	rolePrefill   = "prefill"
	roleDecode    = "decode"
	legDirect     = "direct"
	legVLLMPre    = "vllm-prefill"
	legVLLMDec    = "vllm-decode"
	legTRTContext = "trtllm-context"
	legTRTGen     = "trtllm-generation"
	legSGLPre     = "sglang-prefill"
	legSGLDec     = "sglang-decode"
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

var (
	failWord = regexp.MustCompile(`FAIL_(PREFILL_|DECODE_)?([0-9]{3})`)
	slowWord = regexp.MustCompile(`SLOW_(PREFILL_|DECODE_)?([0-9]{1,9})`)
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

// rankState is the load of one DP rank.
type rankState struct {
	running atomic.Int64
	waiting atomic.Int64
	served  atomic.Int64
	slots   chan struct{} // nil without -max-running
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

func (w *worker) readRequest(api string, body gjson.Result, rank int, seen map[string]string) *request {
	req := &request{api: api, body: body, rank: rank, seen: seen, leg: legDirect}
	req.model = body.Get("model").String()
	if req.model == "" {
		req.model = w.cfg.Model
	}
	req.stream = body.Get("stream").Bool()
	req.kvParams = body.Get("kv_transfer_params")
	req.dpParams = body.Get("disaggregated_params")
	switch {
	case req.kvParams.Get("do_remote_decode").Bool():
		req.leg, req.prefill = legVLLMPre, true
	case req.kvParams.Get("do_remote_prefill").Bool():
		req.leg = legVLLMDec
	case req.dpParams.Get("request_type").String() == "context_only":
		req.leg, req.prefill = legTRTContext, true
	case req.dpParams.Get("request_type").String() == "generation_only":
		req.leg = legTRTGen
	case body.Get("bootstrap_room").Exists() || body.Get("bootstrap_host").Exists():
		if w.cfg.Role == rolePrefill {
			req.leg, req.prefill = legSGLPre, true
		} else {
			req.leg = legSGLDec
		}
	}
	req.prompt = promptText(body)
	for _, k := range []string{"max_completion_tokens", "max_tokens", "max_output_tokens"} {
		if v := body.Get(k); v.Type == gjson.Number && v.Int() > 0 {
			req.maxToks = int(min(v.Int(), 1<<20))
			break
		}
	}
	return req
}

// promptText is the text the magic words are looked for in: chat messages, a completions
// prompt, a responses input and instructions.
func promptText(body gjson.Result) string {
	var b strings.Builder
	addContent := func(c gjson.Result) {
		if c.Type == gjson.String {
			b.WriteString(c.Str)
			b.WriteByte('\n')
			return
		}
		c.ForEach(func(_, part gjson.Result) bool {
			if t := part.Get("text"); t.Type == gjson.String {
				b.WriteString(t.Str)
				b.WriteByte('\n')
			} else if part.Type == gjson.String {
				b.WriteString(part.Str)
				b.WriteByte('\n')
			}
			return true
		})
	}
	body.Get("messages").ForEach(func(_, m gjson.Result) bool {
		addContent(m.Get("content"))
		return true
	})
	addContent(body.Get("prompt"))
	addContent(body.Get("instructions"))
	if in := body.Get("input"); in.Type == gjson.String {
		addContent(in)
	} else {
		in.ForEach(func(_, item gjson.Result) bool {
			addContent(item.Get("content"))
			return true
		})
	}
	return b.String()
}

// magicApplies reports whether a magic word's scope (PREFILL_, DECODE_ or none) covers req.
func (req *request) magicApplies(scope string) bool {
	switch scope {
	case "PREFILL_":
		return req.prefill
	case "DECODE_":
		return !req.prefill
	}
	return true
}

// magicFail is the status a FAIL_ word asks for, or 0.
func (req *request) magicFail() int {
	for _, m := range failWord.FindAllStringSubmatch(req.prompt, -1) {
		status, _ := strconv.Atoi(m[2])
		if status >= 400 && status <= 599 && req.magicApplies(m[1]) {
			return status
		}
	}
	return 0
}

// magicSlow is the wait a SLOW_ word asks for, or 0.
func (req *request) magicSlow() time.Duration {
	for _, m := range slowWord.FindAllStringSubmatch(req.prompt, -1) {
		if !req.magicApplies(m[1]) {
			continue
		}
		ms, _ := strconv.Atoi(m[2])
		return min(time.Duration(ms)*time.Millisecond, maxSlow)
	}
	return 0
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

// respond writes the answer of a request that is served.
func (w *worker) respond(rw http.ResponseWriter, req *request, mock map[string]any) {
	n := w.seq.Add(1)
	tokens := []string{"Hello", " from", " " + w.cfg.Name, "."}
	finish := "stop"
	switch req.leg {
	case legVLLMPre, legTRTContext:
		tokens, finish = tokens[:1], "length"
		if req.leg == legTRTContext && strings.Contains(req.prompt, "FINISH_IN_CONTEXT") {
			finish = "stop"
		}
		req.stream = false // a prefill leg is answered in one JSON body
	default:
		if req.maxToks > 0 && req.maxToks < len(tokens) {
			tokens, finish = tokens[:req.maxToks], "length"
		}
	}
	promptTokens := max(1, len(req.prompt)/4)
	if req.stream {
		w.stream(rw, req, mock, n, tokens, finish, promptTokens)
		return
	}
	text := strings.Join(tokens, "")
	created := time.Now().Unix()
	var body map[string]any
	switch req.api {
	case "/v1/responses":
		body = responsesObject(req, n, created, text, finish, promptTokens, len(tokens))
	default:
		choice := map[string]any{"index": 0, "finish_reason": finish, "logprobs": nil}
		object, id := "text_completion", fmt.Sprintf("cmpl-mock-%d", n)
		if req.api == "/v1/chat/completions" {
			object, id = "chat.completion", fmt.Sprintf("chatcmpl-mock-%d", n)
			choice["message"] = map[string]any{"role": "assistant", "content": text}
		} else {
			choice["text"] = text
		}
		if req.leg == legTRTContext {
			choice["disaggregated_params"] = map[string]any{
				"request_type":         "context_only",
				"first_gen_tokens":     []int{42},
				"ctx_request_id":       123,
				"encoded_opaque_state": "b3BhcXVl",
				"draft_tokens":         nil,
			}
		}
		body = map[string]any{
			"id": id, "object": object, "created": created, "model": req.model,
			"choices": []any{choice},
			"usage":   usage(promptTokens, len(tokens)),
		}
		if req.leg == legTRTContext {
			body["prompt_token_ids"] = []int{1, 2, 3}
		}
	}
	if req.leg == legVLLMPre {
		body["kv_transfer_params"] = map[string]any{
			"do_remote_prefill": true,
			"do_remote_decode":  false,
			"remote_engine_id":  w.cfg.Name,
			"remote_block_ids":  []int{1, 2, 3},
			"remote_request_id": req.seen["x-request-id"],
			"remote_host":       w.host,
			"remote_port":       w.port,
			"tp_size":           1,
		}
	}
	body["mock"] = mock
	writeJSON(rw, http.StatusOK, body)
}

func usage(prompt, completion int) map[string]any {
	return map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
}

// responsesObject is a /v1/responses response object.
func responsesObject(req *request, n uint64, created int64, text, finish string, in, out int) map[string]any {
	status := "completed"
	var incomplete any
	if finish == "length" {
		status = "incomplete"
		incomplete = map[string]any{"reason": "max_output_tokens"}
	}
	return map[string]any{
		"id": fmt.Sprintf("resp_mock_%d", n), "object": "response", "created_at": created,
		"status": status, "incomplete_details": incomplete, "model": req.model,
		"output": []any{map[string]any{
			"type": "message", "id": fmt.Sprintf("msg_mock_%d", n), "status": "completed", "role": "assistant",
			"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}},
		}},
		"usage": map[string]any{"input_tokens": in, "output_tokens": out, "total_tokens": in + out},
	}
}

// stream writes the answer as Server-Sent Events.
func (w *worker) stream(rw http.ResponseWriter, req *request, mock map[string]any, n uint64, tokens []string, finish string, promptTokens int) {
	h := rw.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	rw.WriteHeader(http.StatusOK)
	flusher, _ := rw.(http.Flusher)
	send := func(event string, v any) {
		b, _ := json.Marshal(v)
		if event != "" {
			fmt.Fprintf(rw, "event: %s\n", event)
		}
		fmt.Fprintf(rw, "data: %s\n\n", b)
		if flusher != nil {
			flusher.Flush()
		}
	}
	created := time.Now().Unix()
	if req.api == "/v1/responses" {
		final := responsesObject(req, n, created, strings.Join(tokens, ""), finish, promptTokens, len(tokens))
		started := map[string]any{"id": final["id"], "object": "response", "created_at": created, "status": "in_progress", "model": req.model, "output": []any{}, "mock": mock}
		send("response.created", map[string]any{"type": "response.created", "sequence_number": 0, "response": started})
		for i, t := range tokens {
			send("response.output_text.delta", map[string]any{
				"type": "response.output_text.delta", "sequence_number": i + 1,
				"item_id": fmt.Sprintf("msg_mock_%d", n), "output_index": 0, "content_index": 0, "delta": t,
			})
		}
		send("response.completed", map[string]any{"type": "response.completed", "sequence_number": len(tokens) + 1, "response": final})
		return
	}
	chat := req.api == "/v1/chat/completions"
	object, id := "text_completion", fmt.Sprintf("cmpl-mock-%d", n)
	if chat {
		object, id = "chat.completion.chunk", fmt.Sprintf("chatcmpl-mock-%d", n)
	}
	chunk := func(choice map[string]any) map[string]any {
		return map[string]any{"id": id, "object": object, "created": created, "model": req.model, "choices": []any{choice}}
	}
	piece := func(text string, reason any) map[string]any {
		c := map[string]any{"index": 0, "finish_reason": reason, "logprobs": nil}
		if chat {
			c["delta"] = map[string]any{"content": text}
			if text == "" {
				c["delta"] = map[string]any{}
			}
		} else {
			c["text"] = text
		}
		return c
	}
	if chat {
		first := chunk(map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "finish_reason": nil, "logprobs": nil})
		first["mock"] = mock
		send("", first)
	}
	for i, t := range tokens {
		c := chunk(piece(t, nil))
		if i == 0 && !chat {
			c["mock"] = mock
		}
		send("", c)
	}
	send("", chunk(piece("", finish)))
	if req.body.Get("stream_options.include_usage").Bool() {
		u := chunk(nil)
		u["choices"] = []any{}
		u["usage"] = usage(promptTokens, len(tokens))
		send("", u)
	}
	fmt.Fprint(rw, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}

// writeError writes an OpenAI error body (with the mock facts, when there are some).
func writeError(rw http.ResponseWriter, status int, msg string, mock map[string]any) {
	typ := "MockError"
	switch {
	case status == http.StatusBadRequest:
		typ = "BadRequestError"
	case status == http.StatusNotFound:
		typ = "NotFoundError"
	case status >= 500:
		typ = "InternalServerError"
	}
	body := map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": status}}
	if mock != nil {
		body["mock"] = mock
	}
	writeJSON(rw, status, body)
}

func writeJSON(rw http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"cannot encode the answer","type":"InternalServerError","param":null,"code":500}}`)
	}
	rw.Header().Set("Content-Type", "application/json")
	rw.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	rw.WriteHeader(status)
	rw.Write(append(b, '\n'))
}

// serveMetrics writes vLLM-style Prometheus text, one series per DP rank.
func (w *worker) serveMetrics(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeError(rw, http.StatusMethodNotAllowed, "use GET", nil)
		return
	}
	capacity := kvCapacity
	if w.cfg.MaxRunning > 0 {
		capacity = w.cfg.MaxRunning
	}
	var b strings.Builder
	family := func(name, typ, help string, value func(rs *rankState) float64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
		for i, rs := range w.ranks {
			fmt.Fprintf(&b, "%s{engine=\"%d\",model_name=%q} %s\n", name, i, w.cfg.Model, promFloat(value(rs)))
		}
	}
	family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
		func(rs *rankState) float64 { return float64(rs.running.Load()) })
	family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
		func(rs *rankState) float64 { return float64(rs.waiting.Load()) })
	family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
		func(rs *rankState) float64 { return min(1, float64(rs.running.Load())/float64(capacity)) })
	family("mock:requests_total", "counter", "Inference requests answered with 200 by this mock worker.",
		func(rs *rankState) float64 { return float64(rs.served.Load()) })
	rw.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	io.WriteString(rw, b.String())
}

// promFloat formats v as Prometheus' Python client does ("3.0", "0.25").
func promFloat(v float64) string {
	if v == float64(int64(v)) {
		return strconv.FormatInt(int64(v), 10) + ".0"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

func (w *worker) serveHealth(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeError(rw, http.StatusMethodNotAllowed, "use GET", nil)
		return
	}
	rw.WriteHeader(http.StatusOK)
}

func (w *worker) serveModels(rw http.ResponseWriter, r *http.Request) {
	writeJSON(rw, http.StatusOK, map[string]any{"object": "list", "data": []any{
		map[string]any{"id": w.cfg.Model, "object": "model", "created": 0, "owned_by": "kvroute-mockworker"},
	}})
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
