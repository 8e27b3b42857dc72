package main

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	testWasm   = "../../build/kvroute.wasm"
	testConfig = "../../testdata/replay/kvroute.json"
	testTrace  = "../../testdata/traces/mooncake_synthetic_trace.jsonl"
)

// TestReplayMooncakeThroughTheCompiledFilter replays the first 300 requests of the
// shipped Mooncake trace through build/kvroute.wasm and the baselines, end to end.
func TestReplayMooncakeThroughTheCompiledFilter(t *testing.T) {
	if _, err := os.Stat(testWasm); err != nil {
		t.Fatalf("this test replays through the compiled filter: %v (run `make build` first)", err)
	}
	o, err := parseFlags([]string{"-wasm", testWasm, "-config", testConfig, "-trace", testTrace, "-n", "300", "-svg", ""})
	require.NoError(t, err)
	rep, reqs, err := run(o)
	require.NoError(t, err)
	require.Len(t, reqs, 300)
	assert.Equal(t, "mooncake", rep.TraceKind)
	for _, n := range rep.Notes {
		assert.NotContains(t, n, "kvroute_active_requests", "every request's load is released")
		assert.NotContains(t, n, "kvroute_fail_open")
	}

	k := rep.KVRoute
	require.NotNil(t, k)
	assert.Equal(t, 300, k.Requests)
	require.Len(t, k.Choices, 300)
	var decided uint64
	byKind := map[string]uint64{}
	for _, c := range k.Decisions {
		decided += c.N
		byKind[c.Name] = c.N
	}
	assert.Equal(t, uint64(300), decided, "one decision per request: %v", k.Decisions)
	assert.Greater(t, byKind["continuation"]+byKind["prefix"], uint64(0), "the trace has conversations: some prefix decisions")
	for i, kind := range k.Kinds {
		assert.NotEmpty(t, kind, "request %d has a decision header", i)
	}
	used := map[int]bool{}
	for _, c := range k.Choices {
		used[c] = true
	}
	assert.Greater(t, len(used), 4, "the load spreads over the fleet")

	require.Len(t, rep.Baselines, len(baselineNames))
	byName := map[string]*Result{}
	for _, b := range rep.Baselines {
		byName[b.Policy] = b
		assert.Equal(t, 300, b.Requests, b.Policy)
	}
	assert.Greater(t, rep.OracleInfinite, 0.0)
	assert.GreaterOrEqual(t, rep.OracleInfinite, rep.OracleLRU)
	assert.Greater(t, k.HitRate(), byName["round-robin"].HitRate(), "prefix-aware routing beats round-robin")
	for _, r := range rep.Results() {
		assert.LessOrEqual(t, r.HitRate(), rep.OracleInfinite+1e-9, "%s cannot beat an infinite cache", r.Policy)
	}
	assert.Len(t, rep.Bars(), 3)
}

// TestIDSaltReseedsKVRoutesTieBreaks: -id-salt reaches the filter as the
// x-request-id it seeds its tie-break shuffle with, so a salted replay
// breaks some ties differently; no salt keeps the ids, and the choices, of a replay
// without the flag.
func TestIDSaltReseedsKVRoutesTieBreaks(t *testing.T) {
	if _, err := os.Stat(testWasm); err != nil {
		t.Fatalf("this test replays through the compiled filter: %v (run `make build` first)", err)
	}
	replay := func(extra ...string) *Result {
		args := append([]string{"-wasm", testWasm, "-config", testConfig, "-trace", testTrace,
			"-n", "200", "-svg", "", "-policies", "kvroute"}, extra...)
		o, err := parseFlags(args)
		require.NoError(t, err)
		rep, _, err := run(o)
		require.NoError(t, err)
		return rep.KVRoute
	}
	plain, unsalted, salted := replay(), replay("-id-salt", ""), replay("-id-salt", "b")
	assert.Equal(t, plain.Choices, unsalted.Choices)
	assert.NotEqual(t, plain.Choices, salted.Choices, "another request id breaks some load ties another way")
	assert.Equal(t, "replay-7", (&kvrouteWasm{}).requestID(7))
	assert.Equal(t, "replay-b-7", (&kvrouteWasm{idSalt: "b"}).requestID(7))
}
