package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/kvroute/kvroute/routing/pdbody"
)

// startWorker serves a worker configured by cfg on a loopback httptest server.
func startWorker(t *testing.T, cfg config) (*httptest.Server, *worker) {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	cfg.Address = srv.Listener.Addr().String()
	if cfg.Role == "" {
		cfg.Role = roleBoth
	}
	if cfg.DPSize == 0 {
		cfg.DPSize = 1
	}
	if cfg.BootstrapPort == 0 {
		cfg.BootstrapPort = 8998
	}
	w, err := newWorker(cfg)
	require.NoError(t, err)
	srv.Config.Handler = w.handler()
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, w
}

// post sends body to path with headers (name, value pairs) and returns the response and its body.
func post(t *testing.T, srv *httptest.Server, path, body string, headers ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

const (
	chatBody       = `{"model":"llama","messages":[{"role":"user","content":"Hello there"}]}`
	completionBody = `{"model":"llama","prompt":"Once upon a time"}`
	responsesBody  = `{"model":"llama","instructions":"Be brief.","input":[{"role":"user","content":[{"type":"input_text","text":"Hi"}]}]}`
)

func TestDirectChatEchoesHeadersAndFacts(t *testing.T) {
	srv, w := startWorker(t, config{Name: "w1", Role: roleDecode, DPSize: 2})
	resp, body := post(t, srv, "/v1/chat/completions", chatBody,
		"x-request-id", "req-1",
		"x-gateway-destination-endpoint", "10.0.0.1:8000",
		"x-data-parallel-rank", "1",
		"x-prefiller-host-port", "10.0.0.9:8000",
		"x-kvroute-decision", "sticky;pd=direct",
		"x-unrelated", "no")
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.Equal(t, "w1", resp.Header.Get("x-mock-served-by"))
	assert.Equal(t, "decode", resp.Header.Get("x-mock-role"))
	assert.Equal(t, "1", resp.Header.Get("x-mock-dp-rank"))
	assert.Equal(t, legDirect, resp.Header.Get("x-mock-leg"))
	assert.Equal(t, "req-1", resp.Header.Get("x-mock-saw-x-request-id"))
	assert.Equal(t, "10.0.0.1:8000", resp.Header.Get("x-mock-saw-x-gateway-destination-endpoint"))
	assert.Equal(t, "10.0.0.9:8000", resp.Header.Get("x-mock-saw-x-prefiller-host-port"))
	assert.Equal(t, "sticky;pd=direct", resp.Header.Get("x-mock-saw-x-kvroute-decision"))
	assert.Equal(t, "1", resp.Header.Get("x-mock-saw-x-data-parallel-rank"))
	assert.Empty(t, resp.Header.Get("x-mock-saw-x-unrelated"))
	assert.Empty(t, resp.Header.Get("x-mock-saw-x-session-id"), "only headers that came are echoed")

	res := gjson.ParseBytes(body)
	assert.Equal(t, "chat.completion", res.Get("object").Str)
	assert.Equal(t, "llama", res.Get("model").Str)
	assert.Equal(t, "assistant", res.Get("choices.0.message.role").Str)
	assert.Equal(t, "Hello from w1.", res.Get("choices.0.message.content").Str)
	assert.Equal(t, "stop", res.Get("choices.0.finish_reason").Str)
	assert.Equal(t, int64(4), res.Get("usage.completion_tokens").Int())

	mock := res.Get("mock")
	assert.Equal(t, "w1", mock.Get("served_by").Str)
	assert.Equal(t, "decode", mock.Get("role").Str)
	assert.Equal(t, legDirect, mock.Get("leg").Str)
	assert.Equal(t, int64(1), mock.Get("dp_rank").Int())
	assert.Equal(t, "/v1/chat/completions", mock.Get("api").Str)
	assert.Equal(t, "req-1", mock.Get("headers.x-request-id").Str)
	assert.Equal(t, "sticky;pd=direct", mock.Get("headers.x-kvroute-decision").Str)
	assert.False(t, mock.Get("kv_transfer_params").Exists())
	assert.False(t, mock.Get("disaggregated_params").Exists())
	assert.False(t, mock.Get("bootstrap").Exists())
	assert.Equal(t, int64(1), w.ranks[1].served.Load())
	assert.Equal(t, int64(0), w.ranks[0].served.Load())
}

func TestDefaultsNameAndRank(t *testing.T) {
	srv, _ := startWorker(t, config{})
	resp, body := post(t, srv, "/v1/completions", completionBody)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	addr := strings.TrimPrefix(srv.URL, "http://")
	assert.Equal(t, addr, resp.Header.Get("x-mock-served-by"), "name defaults to the listen address")
	assert.Equal(t, "0", resp.Header.Get("x-mock-dp-rank"))
	assert.Equal(t, "decode", resp.Header.Get("x-mock-role"), "role both names the leg: a direct request is decode")
	res := gjson.ParseBytes(body)
	assert.Equal(t, "text_completion", res.Get("object").Str)
	assert.Equal(t, "Hello from "+addr+".", res.Get("choices.0.text").Str)
}

func TestExtraEchoHeaders(t *testing.T) {
	srv, _ := startWorker(t, config{EchoHeaders: []string{" X-My-Dest ", ""}})
	resp, _ := post(t, srv, "/v1/completions", completionBody, "x-my-dest", "a:1")
	assert.Equal(t, "a:1", resp.Header.Get("x-mock-saw-x-my-dest"))
}

func TestResponsesAPI(t *testing.T) {
	srv, _ := startWorker(t, config{Name: "r"})
	resp, body := post(t, srv, "/v1/responses", responsesBody)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	res := gjson.ParseBytes(body)
	assert.Equal(t, "response", res.Get("object").Str)
	assert.Equal(t, "completed", res.Get("status").Str)
	assert.Equal(t, "Hello from r.", res.Get("output.0.content.0.text").Str)
	assert.Equal(t, "output_text", res.Get("output.0.content.0.type").Str)
	assert.Equal(t, "/v1/responses", res.Get("mock.api").Str)

	_, body = post(t, srv, "/v1/responses", `{"input":"x","max_output_tokens":2}`)
	res = gjson.ParseBytes(body)
	assert.Equal(t, "incomplete", res.Get("status").Str)
	assert.Equal(t, "Hello from", res.Get("output.0.content.0.text").Str)
}

func TestMaxTokensTruncates(t *testing.T) {
	srv, _ := startWorker(t, config{Name: "w"})
	_, body := post(t, srv, "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":2}`)
	assert.Equal(t, "length", gjson.GetBytes(body, "choices.0.finish_reason").Str)
	assert.Equal(t, "Hello from", gjson.GetBytes(body, "choices.0.message.content").Str)
	_, body = post(t, srv, "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":100,"max_completion_tokens":1}`)
	assert.Equal(t, "Hello", gjson.GetBytes(body, "choices.0.message.content").Str, "max_completion_tokens wins")
}

func TestVLLMPrefillLeg(t *testing.T) {
	srv, _ := startWorker(t, config{Name: "p0"})
	body := `{"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":true,` +
		`"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`
	resp, out := post(t, srv, "/v1/chat/completions", body, "x-request-id", "rid-7")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "prefill", resp.Header.Get("x-mock-role"))
	assert.Equal(t, legVLLMPre, resp.Header.Get("x-mock-leg"))
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"), "a prefill leg never streams")

	res := gjson.ParseBytes(out)
	assert.Equal(t, "Hello", res.Get("choices.0.message.content").Str, "one token")
	assert.Equal(t, "length", res.Get("choices.0.finish_reason").Str)
	kv := res.Get("kv_transfer_params")
	host, port, err := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	assert.Equal(t, gjson.True, kv.Get("do_remote_prefill").Type)
	assert.Equal(t, gjson.False, kv.Get("do_remote_decode").Type)
	assert.Equal(t, "p0", kv.Get("remote_engine_id").Str)
	assert.Equal(t, "[1,2,3]", kv.Get("remote_block_ids").Raw)
	assert.Equal(t, host, kv.Get("remote_host").Str)
	assert.Equal(t, port, kv.Get("remote_port").Raw)
	assert.Equal(t, "rid-7", kv.Get("remote_request_id").Str)
	assert.True(t, res.Get("mock.kv_transfer_params.do_remote_decode").Bool())
}

func TestVLLMDecodeLeg(t *testing.T) {
	srv, _ := startWorker(t, config{Name: "d0", Role: roleDecode})
	params := `{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"p0","remote_block_ids":[1,2,3],"remote_host":"10.0.0.5","remote_port":5600}`
	resp, out := post(t, srv, "/v1/completions", `{"prompt":"hi","kv_transfer_params":`+params+`}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, legVLLMDec, resp.Header.Get("x-mock-leg"))
	assert.Equal(t, "decode", resp.Header.Get("x-mock-role"))
	assert.JSONEq(t, params, gjson.GetBytes(out, "mock.kv_transfer_params").Raw)
	assert.Equal(t, "stop", gjson.GetBytes(out, "choices.0.finish_reason").Str)
	assert.False(t, gjson.GetBytes(out, "kv_transfer_params").Exists())
}

func TestTRTLLMContextLeg(t *testing.T) {
	srv, _ := startWorker(t, config{Name: "ctx", Role: rolePrefill})
	for _, api := range []string{"/v1/chat/completions", "/v1/completions"} {
		body := `{"model":"llama","prompt":"abc","messages":[{"role":"user","content":"abc"}],"stream":false,"disaggregated_params":{"request_type":"context_only"}}`
		resp, out := post(t, srv, api, body)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, legTRTContext, resp.Header.Get("x-mock-leg"))
		assert.Equal(t, "prefill", resp.Header.Get("x-mock-role"))
		res := gjson.ParseBytes(out)
		assert.Equal(t, "length", res.Get("choices.0.finish_reason").Str, api)
		dp := res.Get("choices.0.disaggregated_params")
		assert.Equal(t, "context_only", dp.Get("request_type").Str)
		assert.Equal(t, "[42]", dp.Get("first_gen_tokens").Raw)
		assert.Equal(t, "123", dp.Get("ctx_request_id").Raw)
		assert.Equal(t, "b3BhcXVl", dp.Get("encoded_opaque_state").Str)
		assert.Equal(t, "[1,2,3]", res.Get("prompt_token_ids").Raw)
	}
	_, out := post(t, srv, "/v1/chat/completions", `{"messages":[{"role":"user","content":"say FINISH_IN_CONTEXT"}],"disaggregated_params":{"request_type":"context_only"}}`)
	assert.Equal(t, "stop", gjson.GetBytes(out, "choices.0.finish_reason").Str)
}

func TestTRTLLMGenerationLeg(t *testing.T) {
	srv, _ := startWorker(t, config{Name: "gen"})
	params := `{"request_type":"generation_only","first_gen_tokens":[42],"ctx_request_id":123,"encoded_opaque_state":"b3BhcXVl"}`
	resp, out := post(t, srv, "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"disaggregated_params":`+params+`}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, legTRTGen, resp.Header.Get("x-mock-leg"))
	assert.Equal(t, "decode", resp.Header.Get("x-mock-role"))
	assert.JSONEq(t, params, gjson.GetBytes(out, "mock.disaggregated_params").Raw)
	assert.False(t, gjson.GetBytes(out, "choices.0.disaggregated_params").Exists())
}

func TestSGLangLegs(t *testing.T) {
	pre, _ := startWorker(t, config{Name: "sp", Role: rolePrefill, BootstrapPort: 30001})
	dec, _ := startWorker(t, config{Name: "sd", Role: roleDecode})
	host, _, _ := net.SplitHostPort(strings.TrimPrefix(pre.URL, "http://"))
	body := `{"messages":[{"role":"user","content":"x"}],"bootstrap_host":"` + host + `","bootstrap_port":30001,"bootstrap_room":9223372036854775807}`

	resp, out := post(t, pre, "/v1/chat/completions", body)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, legSGLPre, resp.Header.Get("x-mock-leg"))
	boot := gjson.GetBytes(out, "mock.bootstrap")
	assert.Equal(t, `"`+host+`"`, boot.Get("bootstrap_host").Raw)
	assert.Equal(t, "30001", boot.Get("bootstrap_port").Raw)
	assert.Equal(t, "9223372036854775807", boot.Get("bootstrap_room").Raw, "the room's digits are kept")
	assert.True(t, boot.Get("matches_self").Bool())

	resp, out = post(t, dec, "/v1/chat/completions", body)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, legSGLDec, resp.Header.Get("x-mock-leg"))
	assert.Equal(t, "9223372036854775807", gjson.GetBytes(out, "mock.bootstrap.bootstrap_room").Raw)
	assert.False(t, gjson.GetBytes(out, "mock.bootstrap.matches_self").Exists())

	_, out = post(t, pre, "/v1/chat/completions", strings.Replace(body, "30001", "8998", 1))
	assert.False(t, gjson.GetBytes(out, "mock.bootstrap.matches_self").Bool(), "wrong bootstrap port")
}

// sseEvents splits an SSE body into its events: the event name (or "") and the data.
func sseEvents(t *testing.T, body []byte) (names, data []string) {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(body))
	name := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			names = append(names, name)
			data = append(data, strings.TrimPrefix(line, "data: "))
			name = ""
		case line == "":
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	return names, data
}

func TestStreamingChat(t *testing.T) {
	srv, _ := startWorker(t, config{Name: "s"})
	resp, body := post(t, srv, "/v1/chat/completions",
		`{"messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}}`, "x-request-id", "sr")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	assert.Equal(t, "sr", resp.Header.Get("x-mock-saw-x-request-id"))
	_, data := sseEvents(t, body)
	require.GreaterOrEqual(t, len(data), 4)
	assert.Equal(t, "[DONE]", data[len(data)-1])
	var text strings.Builder
	finish := ""
	for i, d := range data[:len(data)-1] {
		res := gjson.Parse(d)
		require.True(t, res.IsObject(), d)
		assert.Equal(t, "chat.completion.chunk", res.Get("object").Str)
		if i == 0 {
			assert.Equal(t, "assistant", res.Get("choices.0.delta.role").Str)
			assert.Equal(t, "s", res.Get("mock.served_by").Str)
			assert.True(t, res.Get("mock.stream").Bool())
		}
		text.WriteString(res.Get("choices.0.delta.content").Str)
		if f := res.Get("choices.0.finish_reason"); f.Type == gjson.String {
			finish = f.Str
		}
	}
	assert.Equal(t, "Hello from s.", text.String())
	assert.Equal(t, "stop", finish)
	usage := gjson.Parse(data[len(data)-2])
	assert.Equal(t, int64(4), usage.Get("usage.completion_tokens").Int())
	assert.Equal(t, "[]", usage.Get("choices").Raw)
}

func TestStreamingCompletionsAndResponses(t *testing.T) {
	srv, _ := startWorker(t, config{Name: "s"})
	_, body := post(t, srv, "/v1/completions", `{"prompt":"x","stream":true,"max_tokens":3}`)
	_, data := sseEvents(t, body)
	assert.Equal(t, "[DONE]", data[len(data)-1])
	var text strings.Builder
	for _, d := range data[:len(data)-1] {
		assert.Equal(t, "text_completion", gjson.Get(d, "object").Str)
		text.WriteString(gjson.Get(d, "choices.0.text").Str)
	}
	assert.Equal(t, "Hello from s", text.String())
	assert.Equal(t, "length", gjson.Get(data[len(data)-2], "choices.0.finish_reason").Str)
	assert.Equal(t, "s", gjson.Get(data[0], "mock.served_by").Str)

	_, body = post(t, srv, "/v1/responses", `{"input":"x","stream":true}`)
	names, data := sseEvents(t, body)
	require.GreaterOrEqual(t, len(names), 3)
	assert.Equal(t, "response.created", names[0])
	assert.Equal(t, "response.completed", names[len(names)-1])
	assert.Equal(t, "s", gjson.Get(data[0], "response.mock.served_by").Str)
	text.Reset()
	for i, n := range names {
		assert.Equal(t, n, gjson.Get(data[i], "type").Str)
		if n == "response.output_text.delta" {
			text.WriteString(gjson.Get(data[i], "delta").Str)
		}
	}
	assert.Equal(t, "Hello from s.", text.String())
	assert.Equal(t, "Hello from s.", gjson.Get(data[len(data)-1], "response.output.0.content.0.text").Str)
}

func TestMagicFailures(t *testing.T) {
	srv, w := startWorker(t, config{Name: "f"})
	resp, body := post(t, srv, "/v1/chat/completions", `{"messages":[{"role":"user","content":"please FAIL_500 now"}]}`, "x-request-id", "e1")
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	assert.Equal(t, "e1", resp.Header.Get("x-mock-saw-x-request-id"))
	assert.Equal(t, "f", resp.Header.Get("x-mock-served-by"))
	assert.Equal(t, int64(500), gjson.GetBytes(body, "error.code").Int())
	assert.Equal(t, "f", gjson.GetBytes(body, "mock.served_by").Str)

	resp, body = post(t, srv, "/v1/completions", `{"prompt":["FAIL_400"]}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	res := gjson.ParseBytes(body)
	assert.Equal(t, "BadRequestError", res.Get("error.type").Str)
	assert.NotEmpty(t, res.Get("error.message").Str)
	assert.True(t, res.Get("error.param").Exists())
	assert.Equal(t, int64(400), res.Get("error.code").Int())

	resp, _ = post(t, srv, "/v1/responses", `{"instructions":"FAIL_503","input":"x"}`)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)

	// Leg-scoped words: FAIL_PREFILL_ fails the prefill leg only, FAIL_DECODE_ the others.
	prefill := `{"messages":[{"role":"user","content":"FAIL_PREFILL_502 FAIL_DECODE_504"}],"kv_transfer_params":{"do_remote_decode":true}}`
	decode := `{"messages":[{"role":"user","content":"FAIL_PREFILL_502 FAIL_DECODE_504"}],"kv_transfer_params":{"do_remote_prefill":true}}`
	direct := `{"messages":[{"role":"user","content":"FAIL_PREFILL_502"}]}`
	resp, _ = post(t, srv, "/v1/chat/completions", prefill)
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	resp, _ = post(t, srv, "/v1/chat/completions", decode)
	assert.Equal(t, http.StatusGatewayTimeout, resp.StatusCode)
	resp, _ = post(t, srv, "/v1/chat/completions", direct)
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	assert.Equal(t, int64(1), w.ranks[0].served.Load(), "failures are not counted as served")
	assert.Equal(t, int64(0), w.ranks[0].running.Load())
}

func TestBadRequests(t *testing.T) {
	srv, _ := startWorker(t, config{DPSize: 2})
	resp, body := post(t, srv, "/v1/chat/completions", `{"messages":`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Equal(t, "BadRequestError", gjson.GetBytes(body, "error.type").Str)
	resp, _ = post(t, srv, "/v1/chat/completions", `[1]`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	for _, rank := range []string{"2", "-1", "x"} {
		resp, body = post(t, srv, "/v1/chat/completions", chatBody, "x-data-parallel-rank", rank)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, rank)
		assert.Contains(t, gjson.GetBytes(body, "error.message").Str, "x-data-parallel-rank")
		assert.Equal(t, rank, resp.Header.Get("x-mock-dp-rank"))
	}
	get, err := srv.Client().Get(srv.URL + "/v1/chat/completions")
	require.NoError(t, err)
	get.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, get.StatusCode)
	assert.NotEmpty(t, get.Header.Get("x-mock-served-by"))
}

func TestHealthAndModels(t *testing.T) {
	srv, _ := startWorker(t, config{Name: "h", Model: "mm"})
	resp, err := srv.Client().Get(srv.URL + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "h", resp.Header.Get("x-mock-served-by"))
	assert.Equal(t, "0", resp.Header.Get("x-mock-dp-rank"))

	resp, err = srv.Client().Get(srv.URL + "/v1/models")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "mm", gjson.GetBytes(b, "data.0.id").Str)
}

// scrape reads /metrics and returns each sample as "name{labels}" → value, checking that
// every sample line belongs to a family declared by # TYPE.
func scrape(t *testing.T, srv *httptest.Server) map[string]float64 {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain"))
	samples := make(map[string]float64)
	typed := make(map[string]bool)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "# TYPE ") {
			f := strings.Fields(line)
			require.Len(t, f, 4, line)
			typed[f[2]] = true
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		require.Positive(t, sp, line)
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		require.NoError(t, err, line)
		series := line[:sp]
		name := series
		if i := strings.IndexByte(series, '{'); i >= 0 {
			name = series[:i]
			require.True(t, strings.HasSuffix(series, "}"), line)
		}
		require.True(t, typed[name], "sample before its # TYPE: %s", line)
		samples[series] = v
	}
	require.NoError(t, sc.Err())
	return samples
}

func TestMetricsReflectInFlightRequests(t *testing.T) {
	srv, _ := startWorker(t, config{Name: "m", DPSize: 2})
	m := scrape(t, srv)
	for _, rank := range []string{"0", "1"} {
		for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "mock:requests_total"} {
			v, ok := m[name+`{engine="`+rank+`",model_name="m"}`]
			assert.True(t, ok, "%s rank %s missing", name, rank)
			assert.Zero(t, v)
		}
	}

	// Two slow requests on rank 1, one on rank 0.
	var wg sync.WaitGroup
	slow := `{"messages":[{"role":"user","content":"SLOW_600"}]}`
	for _, rank := range []string{"1", "1", "0"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _ := post(t, srv, "/v1/chat/completions", slow, "x-data-parallel-rank", rank)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
		}()
	}
	require.Eventually(t, func() bool {
		m := scrape(t, srv)
		return m[`vllm:num_requests_running{engine="1",model_name="m"}`] == 2 &&
			m[`vllm:num_requests_running{engine="0",model_name="m"}`] == 1
	}, 2*time.Second, 10*time.Millisecond)
	m = scrape(t, srv)
	assert.Equal(t, 2.0/kvCapacity, m[`vllm:kv_cache_usage_perc{engine="1",model_name="m"}`])
	wg.Wait()
	m = scrape(t, srv)
	assert.Zero(t, m[`vllm:num_requests_running{engine="1",model_name="m"}`])
	assert.Equal(t, 2.0, m[`mock:requests_total{engine="1",model_name="m"}`])
	assert.Equal(t, 1.0, m[`mock:requests_total{engine="0",model_name="m"}`])
}

func TestMetricsWaitingWithMaxRunning(t *testing.T) {
	srv, _ := startWorker(t, config{Name: "m", MaxRunning: 1, Model: "llama"})
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _ := post(t, srv, "/v1/completions", `{"prompt":"SLOW_300"}`)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
		}()
	}
	require.Eventually(t, func() bool {
		m := scrape(t, srv)
		return m[`vllm:num_requests_running{engine="0",model_name="llama"}`] == 1 &&
			m[`vllm:num_requests_waiting{engine="0",model_name="llama"}`] == 2 &&
			m[`vllm:kv_cache_usage_perc{engine="0",model_name="llama"}`] == 1
	}, 2*time.Second, 5*time.Millisecond)
	wg.Wait()
	assert.GreaterOrEqual(t, time.Since(start), 900*time.Millisecond, "one at a time")
	m := scrape(t, srv)
	assert.Zero(t, m[`vllm:num_requests_waiting{engine="0",model_name="llama"}`])
}

func TestSlowScopedToLeg(t *testing.T) {
	srv, _ := startWorker(t, config{})
	start := time.Now()
	resp, _ := post(t, srv, "/v1/completions", `{"prompt":"SLOW_PREFILL_2000"}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Less(t, time.Since(start), time.Second, "a direct request is not a prefill leg")
	start = time.Now()
	resp, _ = post(t, srv, "/v1/completions", `{"prompt":"SLOW_PREFILL_150","disaggregated_params":{"request_type":"context_only"}}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond)
}

// TestProtocolsWithRoutingBuilders runs the P/D bodies kvroute builds through the mock, as
// the filter does: prefill leg, then the decode body built from the prefill answer.
func TestProtocolsWithRoutingBuilders(t *testing.T) {
	pre, _ := startWorker(t, config{Name: "pre", Role: rolePrefill, BootstrapPort: 30001})
	dec, _ := startWorker(t, config{Name: "dec", Role: roleDecode})
	orig := []byte(`{"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":50}`)

	// vLLM NixlConnector.
	pb, err := pdbody.VLLMPrefillBody(orig)
	require.NoError(t, err)
	resp, presp := post(t, pre, "/v1/chat/completions", string(pb))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, legVLLMPre, resp.Header.Get("x-mock-leg"))
	db, err := pdbody.VLLMDecodeBody(orig, presp)
	require.NoError(t, err)
	resp, dresp := post(t, dec, "/v1/chat/completions", string(db))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, legVLLMDec, resp.Header.Get("x-mock-leg"))
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"), "the decode leg streams as the client asked")
	_, data := sseEvents(t, dresp)
	assert.Equal(t, "pre", gjson.Get(data[0], "mock.kv_transfer_params.remote_engine_id").Str)

	// TensorRT-LLM, both finish reasons.
	cb, err := pdbody.TRTLLMContextBody(orig)
	require.NoError(t, err)
	resp, cresp := post(t, pre, "/v1/chat/completions", string(cb))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	gb, pass, err := pdbody.TRTLLMGenerationBody(orig, cresp)
	require.NoError(t, err)
	require.False(t, pass)
	resp, gresp := post(t, dec, "/v1/chat/completions", string(gb))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, legTRTGen, resp.Header.Get("x-mock-leg"))
	_, data = sseEvents(t, gresp)
	assert.Equal(t, "123", gjson.Get(data[0], "mock.disaggregated_params.ctx_request_id").Raw)

	finished := []byte(`{"messages":[{"role":"user","content":"FINISH_IN_CONTEXT"}]}`)
	cb, err = pdbody.TRTLLMContextBody(finished)
	require.NoError(t, err)
	_, cresp = post(t, pre, "/v1/chat/completions", string(cb))
	gb, pass, err = pdbody.TRTLLMGenerationBody(finished, cresp)
	require.NoError(t, err)
	assert.True(t, pass)
	assert.Nil(t, gb)

	// SGLang bootstrap: the same body to both.
	host := pdbody.HostOfAddress(strings.TrimPrefix(pre.URL, "http://"))
	sb, err := pdbody.SGLangBootstrapBody(orig, host, 30001, pdbody.BootstrapRoom(42))
	require.NoError(t, err)
	_, sp := post(t, pre, "/v1/chat/completions", string(sb))
	_, data = sseEvents(t, sp)
	assert.True(t, gjson.Get(data[0], "mock.bootstrap.matches_self").Bool())
	_, sd := post(t, dec, "/v1/chat/completions", string(sb))
	_, data = sseEvents(t, sd)
	assert.Equal(t, strconv.FormatUint(pdbody.BootstrapRoom(42), 10), gjson.Get(data[0], "mock.bootstrap.bootstrap_room").Raw)
}

func TestNewWorkerRejectsBadConfig(t *testing.T) {
	good := config{Role: roleBoth, DPSize: 1, Address: "127.0.0.1:1"}
	for name, mut := range map[string]func(*config){
		"role":           func(c *config) { c.Role = "router" },
		"dp-size":        func(c *config) { c.DPSize = 0 },
		"max-running":    func(c *config) { c.MaxRunning = -1 },
		"bootstrap-port": func(c *config) { c.BootstrapPort = 70000 },
		"address":        func(c *config) { c.Address = "nohost" },
	} {
		c := good
		mut(&c)
		_, err := newWorker(c)
		assert.Error(t, err, name)
	}
	_, err := newWorker(good)
	assert.NoError(t, err)
}

// syncBuffer is an io.Writer the test can read while run writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestRunServesAndStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-listen", "127.0.0.1:0", "-role", "prefill", "-name", "runner", "-dp-size", "2"}, &out)
	}()
	var addr string
	require.Eventually(t, func() bool {
		s := out.String()
		const prefix = "kvroute-mockworker listening on "
		if !strings.HasPrefix(s, prefix) {
			return false
		}
		addr = strings.Fields(strings.TrimPrefix(s, prefix))[0]
		return true
	}, 5*time.Second, 10*time.Millisecond)

	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "runner", resp.Header.Get("x-mock-served-by"))
	assert.Equal(t, "prefill", resp.Header.Get("x-mock-role"))

	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("run did not stop")
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-role", "x"},
		{"-dp-size", "0"},
		{"-listen", "256.0.0.1:99999"},
		{"-nope"},
		{"extra"},
	} {
		err := run(context.Background(), args, io.Discard)
		assert.Error(t, err, "%v", args)
	}
}
