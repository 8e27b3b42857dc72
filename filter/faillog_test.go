package main

import (
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
// at most one line a second per VM. A panic can be provoked only in the Go plugin:
// its clock is a test variable, made to panic once where the callback reads it.
func TestFailOpenLogIsRateLimited(t *testing.T) {
	saved := nowMS
	defer func() { nowMS = saved }()
	goClock = 1_700_000_000_000
	armed := false
	nowMS = func() int64 {
		if armed {
			armed = false
			panic("injected fault")
		}
		return goClock
	}
	failLog = failLimiter{}
	defer func() { failLog = failLimiter{} }()

	h := startHost(t, &vmContext{}, pdFleet("vllm", 10))
	// Request body: the decision panics; the request goes on untouched.
	for i := 0; i < 5; i++ {
		armed = true
		id, action := h.send(post("/v1/chat/completions", chat("x"), [2]string{"x-session-id", "s"}))
		assert.Equal(t, types.ActionContinue, action, "fail open: the request is not held")
		_, has := h.header(id, "x-gateway-destination-endpoint")
		assert.False(t, has, "no half-made decision reaches the upstream")
		h.respond(id, 200)
	}
	// The tick.
	armed = true
	h.Tick()
	// A prefill callback: the request resumes.
	id, action := h.send(post("/v1/chat/completions", longChat(50, "")))
	require.Equal(t, types.ActionPause, action)
	co := h.onlyCallout(id)
	armed = true
	h.CallOnHttpCallResponse(co.CalloutID, [][2]string{{":status", "200"}}, nil, []byte(`{}`))
	assert.Equal(t, types.ActionContinue, h.GetCurrentHttpStreamAction(id), "a fault in the callback resumes the request")
	h.respond(id, 200)

	assert.Equal(t, uint64(7), h.counter("kvroute_fail_open"), "every fault is counted")
	logs := h.GetErrorLogs()
	require.Len(t, logs, 1, "one line in the first second: %q", logs)
	assert.Contains(t, logs[0], "kvroute: recovered in request body, failing open: injected fault")

	goClock += failLogPeriodMS
	armed = true
	id, _ = h.send(post("/v1/completions", `{"prompt":"y"}`))
	h.respond(id, 200)
	logs = h.GetErrorLogs()
	require.Len(t, logs, 2)
	assert.True(t, strings.HasSuffix(logs[1], "(6 similar lines suppressed since the last one)"), logs[1])
	assert.Equal(t, uint64(8), h.counter("kvroute_fail_open"))
	// A request whose decision failed added no load.
	assert.Equal(t, routing.Load{}, h.poolLoad("decode"))
	// The callback's fault struck after the prefill's load was handed back (a release
	// reads no clock): nothing is left over.
	assert.Equal(t, routing.Load{}, h.poolLoad("prefill"))
}
