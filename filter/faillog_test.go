package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/routing"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFailLimiterOneLinePerSecond(t *testing.T) {
	var l failLimiter
	steps := []struct {
		now        int64
		ok         bool
		suppressed int
	}{
		{1_000_000, true, 0},
		{1_000_000, false, 0},
		{1_000_500, false, 0},
		{1_000_999, false, 0},
		{1_001_000, true, 3}, // a second later: written, saying 3 were held back
		{1_001_001, false, 0},
		{1_005_000, true, 1},
		{1_009_000, true, 0}, // nothing held back: no count
		{1_000_000, true, 0}, // a clock that went back never silences the log for long
	}
	for i, s := range steps {
		ok, n := l.allow(s.now)
		assert.Equal(t, s.ok, ok, "step %d", i)
		assert.Equal(t, s.suppressed, n, "step %d", i)
	}
}

// A panic inside a callback fails open, counts kvroute_fail_open every time and logs
// at most one line a second per VM. The fault is injected into the clock, made to
// panic once where the callback reads it.
func TestFailOpenLogIsRateLimited(t *testing.T) {
	withFaults(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, pdFleet("vllm", 10))
		h.advance(failLogPeriodMS) // an earlier test's fault in this module holds no line back
		// Request body: the decision panics; the request goes on untouched.
		for i := 0; i < 5; i++ {
			h.armFault()
			id, action := h.send(post("/v1/chat/completions", chat("x"), [2]string{"x-session-id", "s"}))
			assert.Equal(t, types.ActionContinue, action, "fail open: the request is not held")
			_, has := h.header(id, "x-gateway-destination-endpoint")
			assert.False(t, has, "no half-made decision reaches the upstream")
			h.respond(id, 200)
		}
		// The tick.
		h.armFault()
		h.Tick()
		// A prefill callback: the request resumes.
		id, action := h.send(post("/v1/chat/completions", longChat(50, "")))
		require.Equal(t, types.ActionPause, action)
		co := h.onlyCallout(id)
		h.armFault()
		h.CallOnHttpCallResponse(co.CalloutID, [][2]string{{":status", "200"}}, nil, []byte(`{}`))
		assert.Equal(t, types.ActionContinue, h.GetCurrentHttpStreamAction(id), "a fault in the callback resumes the request")
		h.respond(id, 200)

		assert.Equal(t, uint64(7), h.counter("kvroute_fail_open"), "every fault is counted")
		logs := h.GetErrorLogs()
		require.Len(t, logs, 1, "one line in the first second: %q", logs)
		assert.Contains(t, logs[0], "kvroute: recovered in request body, failing open: injected fault")

		h.advance(failLogPeriodMS)
		h.armFault()
		id, _ = h.send(post("/v1/completions", `{"prompt":"y"}`))
		h.respond(id, 200)
		logs = h.GetErrorLogs()
		require.Len(t, logs, 2)
		assert.True(t, strings.HasSuffix(logs[1], "(6 similar lines suppressed since the last one)"), logs[1])
		assert.Equal(t, uint64(8), h.counter("kvroute_fail_open"))
		// A request whose decision failed added no load.
		assert.Equal(t, routing.Load{}, h.poolLoad("decode"))
		// The callback's fault struck after the prefill's load was handed back (a
		// release reads no clock): nothing is left over.
		assert.Equal(t, routing.Load{}, h.poolLoad("prefill"))
	})
}

// A panic inside each request callback leaves the request going on as it was sent:
// the callback answers Continue, nothing of a half-made decision reaches the
// upstream, and the fault is counted and logged with where it struck. The fault is
// injected into the clock, which each callback here reads.
func TestAPanicInEachRequestCallbackFailsOpen(t *testing.T) {
	withFaults(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"pools":{"decode":{"endpoints":[
			{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"}]}}}`)
		h.advance(failLogPeriodMS) // an earlier test's fault in this module holds no line back
		faults := uint64(0)
		struck := func(where string) {
			t.Helper()
			require.False(t, h.faultPending(), "%s: the callback read the clock", where)
			faults++
			assert.Equal(t, faults, h.counter("kvroute_fail_open"), where)
			logs := h.GetErrorLogs()
			require.NotEmpty(t, logs, where)
			assert.Contains(t, logs[len(logs)-1], "kvroute: recovered in "+where+", failing open: injected fault")
			h.advance(failLogPeriodMS) // the next fault's line is not held back
		}
		untouched := func(id uint32, sent [][2]string, body string) {
			t.Helper()
			assert.Equal(t, sent, h.GetCurrentRequestHeaders(id), "the headers go on as sent")
			if body != "" {
				assert.Equal(t, body, string(h.GetCurrentRequestBody(id)), "the body goes on as sent")
			}
		}
		sent := func(n int) [][2]string {
			return [][2]string{{":method", "POST"}, {":path", "/v1/completions"}, {":authority", "gateway"},
				{"content-length", strconv.Itoa(n)}}
		}

		// Request headers: a request without a body is decided on its headers.
		id := h.InitializeHttpContext()
		h.armFault()
		hs := [][2]string{{":method", "POST"}, {":path", "/v1/completions"}, {":authority", "gateway"}}
		assert.Equal(t, types.ActionContinue, h.CallOnRequestHeaders(id, hs, true))
		struck("request headers")
		untouched(id, hs, "")
		h.respond(id, 200)

		// Request body.
		body := `{"prompt":"x"}`
		id = h.InitializeHttpContext()
		require.Equal(t, types.ActionPause, h.CallOnRequestHeaders(id, sent(len(body)), false))
		h.armFault()
		assert.Equal(t, types.ActionContinue, h.CallOnRequestBody(id, []byte(body), true))
		struck("request body")
		untouched(id, sent(len(body)), body)
		h.respond(id, 200)

		// Response headers (the health report reads the clock) and the response body
		// (the first chunk does), each on a routed request.
		for _, where := range []string{"response headers", "response body"} {
			id, action := h.send(post("/v1/completions", body))
			require.Equal(t, types.ActionContinue, action)
			_, routed := h.header(id, "x-gateway-destination-endpoint")
			require.True(t, routed)
			if where == "response headers" {
				h.armFault()
			}
			assert.Equal(t, types.ActionContinue, h.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false))
			if where == "response body" {
				h.armFault()
			}
			assert.Equal(t, types.ActionContinue, h.CallOnResponseBody(id, []byte("{}"), true))
			struck(where)
			h.CompleteHttpContext(id)
		}

		// Stream done: an upstream that failed before any response is reported there.
		flags := make([]byte, 8)
		flags[0] = 0x20 // UpstreamConnectionFailure
		require.NoError(t, h.SetProperty([]string{"response", "flags"}, flags))
		id, _ = h.send(post("/v1/completions", body))
		h.armFault()
		h.CompleteHttpContext(id)
		struck("stream done")
	})
}

// withFaults runs fn with the Go plugin and with build/kvroute-faults.wasm, each with
// faults injected into its clock (injectFaults): armFault makes the next reading panic.
func withFaults(t *testing.T, fn func(t *testing.T, vm types.VMContext)) {
	t.Run("go", func(t *testing.T) {
		saved := nowMS
		goClock = 1_700_000_000_000
		nowMS = func() int64 { return goClock }
		injectFaults()
		failLog = failLimiter{}
		defer func() { nowMS, failLog = saved, failLimiter{} }()
		fn(t, &vmContext{})
	})
	t.Run("wasm", func(t *testing.T) { fn(t, faulty.load(t)) })
}

// armFault makes the plugin's next clock reading panic.
func (h *host) armFault() {
	require.NoError(h.t, h.SetProperty([]string{faultProperty}, []byte("1")))
}

// faultPending says whether an armed fault has not struck yet.
func (h *host) faultPending() bool {
	v, err := h.GetProperty([]string{faultProperty})
	return err == nil && string(v) == "1"
}
