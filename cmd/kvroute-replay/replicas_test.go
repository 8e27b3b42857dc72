package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/engine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
)

// TestMain lets the test binary be a replica child: the replicas policy starts
// os.Executable() with -replica, which in a test is this binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "-replica" {
		os.Exit(replicaMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

const testChatTrace = "../../testdata/replay/chat_sessions.jsonl"

func requireWasm(t *testing.T) []byte {
	t.Helper()
	wasm, err := os.ReadFile(testWasm)
	if err != nil {
		t.Fatalf("this test runs the compiled filter: %v (run `make build` first)", err)
	}
	return wasm
}

func TestReplicaProtocolRoundTrip(t *testing.T) {
	weird := "a b\nc\x00d\r\n ok\nS 3\n\"}{"
	msgs := []*replicaMsg{
		{Kind: "C", Index: 7, TimeMS: 1234.5678901234567, Path: "/v1/chat/completions",
			Headers: [][2]string{{"x-session-id", "conv 1\nT 0 0"}, {"empty", ""}, {"", "no name"}},
			Body:    []byte(`{"prompt":"` + weird + `"}`)},
		{Kind: "C", Index: 0, TimeMS: 0, Path: "", Body: []byte{}},
		{Kind: "C", Index: 1, Body: []byte{0xff, 0x00, '\n', 0xc3}},
		{Kind: "D", Index: 123456, TimeMS: 1e-7},
		{Kind: "F", Index: 7, TimeMS: 12.5},
		{Kind: "S"},
		{Kind: "S", Stats: &replicaStats{Routed: 3, Decisions: []Count{{Name: "sticky", N: 2}}, PD: "off"}},
		{Kind: "P", Body: []byte(weird)},
		{Kind: "P", Body: []byte{}},
		{Kind: "M", Text: "10.0.0.1:8000"},
		{Kind: "T", Target: 5, Text: "new-conversation"},
		{Kind: "T", Target: 0, Text: ""},
		{Kind: "ok"},
		{Kind: "E", Text: weird},
	}
	var buf bytes.Buffer
	w := newReplicaConn(nil, &buf)
	for _, m := range msgs {
		require.NoError(t, w.Send(m))
	}
	r := newReplicaConn(&buf, nil)
	for i, want := range msgs {
		got, err := r.Receive()
		require.NoError(t, err, "message %d", i)
		assert.Equal(t, want, got, "message %d", i)
	}
	_, err := r.Receive()
	assert.Equal(t, io.EOF, err, "the end of the stream between messages")

	for _, bad := range []string{`{"kind":"C","index":1`, "X\n", `{"kind":"T","target":"x"}`, `{"kind":"P","body":"!"}`, `{"index":1}`, `[]`} {
		_, err := newReplicaConn(strings.NewReader(bad), nil).Receive()
		assert.Error(t, err, "%q", bad)
		assert.NotEqual(t, io.EOF, err, "%q is a broken message, not the end", bad)
	}
}

func TestEnginePageParsesAsVLLM(t *testing.T) {
	cfg := FleetConfig{Endpoints: 2, DPSize: 2, CacheTokens: 512 * 64, PrefillMSPerToken: 1, DecodeMSPerToken: 1, MaxRunning: 64}
	f := NewFleet(cfg, 512)
	load(f, 3, 4) // endpoint 1 rank 1: 4 in flight, 3 waiting for the prefill
	load(f, 2, 1) // endpoint 1 rank 0: 1 running
	page := enginePage(f, 1)
	figures, err := engine.ParseEngineMetrics(config.FlavorVLLM, page, 2, 0)
	require.NoError(t, err, "%s", page)
	assert.Equal(t, 1.0, figures[0].Running)
	assert.Equal(t, 0.0, figures[0].Waiting)
	assert.Equal(t, 1.0, figures[1].Running)
	assert.Equal(t, 3.0, figures[1].Waiting)
	assert.InDelta(t, f.KVUtilization(3), figures[1].KVUsage, 1e-6)
	assert.Equal(t, float64(cfg.CacheTokens), figures[0].CacheTokens, "the prefix cache's size, per rank")
	assert.Equal(t, float64(cfg.CacheTokens), figures[1].CacheTokens)
	assert.Contains(t, string(page), `vllm:num_requests_waiting{engine="1",model_name="m"} 3.0`)
	idle, err := engine.ParseEngineMetrics(config.FlavorVLLM, enginePage(f, 0), 2, 0)
	require.NoError(t, err)
	assert.Equal(t, engine.EngineFigures{CacheTokens: float64(cfg.CacheTokens)}, idle[0])
}

func TestReplicaSpreadIsSeededAndUniform(t *testing.T) {
	counts := make([]int, 4)
	for i := 0; i < 40000; i++ {
		k := replicaOf(1, i, 4)
		require.Equal(t, k, replicaOf(1, i, 4))
		counts[k]++
	}
	for _, n := range counts {
		assert.InDelta(t, 10000, n, 400)
	}
	same := 0
	for i := 0; i < 1000; i++ {
		if replicaOf(1, i, 4) == replicaOf(2, i, 4) {
			same++
		}
	}
	assert.Less(t, same, 400, "another seed, another spread")
}

func TestVariantConfigs(t *testing.T) {
	base, err := replayConfig(testConfig, FleetConfig{Endpoints: 2, DPSize: 1})
	require.NoError(t, err)
	vs, err := selectReplicaVariants("hash+metrics, round_robin")
	require.NoError(t, err)
	require.Len(t, vs, 2)
	assert.Equal(t, "kvroute x4 (hash + engine metrics)", vs[0].Label(4))
	assert.Equal(t, "kvroute x4 (round_robin)", vs[1].Label(4))
	c, err := variantConfig(base, vs[0])
	require.NoError(t, err)
	v := gjson.ParseBytes(c)
	assert.Equal(t, "hash", v.Get("conversation.first_turn").String())
	assert.True(t, v.Get("engine_metrics.enabled").Bool())
	assert.Equal(t, int64(1000), v.Get("engine_metrics.interval_ms").Int())
	assert.Equal(t, int64(5000), v.Get("engine_metrics.stale_ms").Int())
	assert.Len(t, v.Get("pools.decode.endpoints").Array(), 2, "the fleet stays")
	c, err = variantConfig(base, vs[1])
	require.NoError(t, err)
	assert.False(t, gjson.GetBytes(c, "engine_metrics.enabled").Bool())
	all, err := selectReplicaVariants("all")
	require.NoError(t, err)
	assert.Len(t, all, 4)
	_, err = selectReplicaVariants("hash,score")
	assert.ErrorContains(t, err, `"score"`)
}

// TestReplicaChildLoopInProcess runs the child's loop over a real compiled filter
// against an in-memory pipe, the test playing the parent: engine metrics on, first
// turns by hash; one endpoint reports itself busy with other replicas' traffic.
func TestReplicaChildLoopInProcess(t *testing.T) {
	wasm := requireWasm(t)
	fc := FleetConfig{Endpoints: 3, DPSize: 1, CacheTokens: 512 * 64, PrefillMSPerToken: 1, DecodeMSPerToken: 1, MaxRunning: 64}
	base, err := replayConfig(testConfig, fc)
	require.NoError(t, err)
	config, err := variantConfig(base, replicaVariant{FirstTurn: "hash", Engine: true})
	require.NoError(t, err)
	p, err := newKVRouteWasm(wasm, config, fc)
	require.NoError(t, err)
	defer p.Close()

	toChild, fromParent := io.Pipe()
	toParent, fromChild := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := newReplicaServer(p, config, toChild, fromChild).Serve()
		fromChild.Close()
		done <- err
	}()
	parent := newReplicaConn(toParent, fromParent)

	// The fleet as the parent models it: endpoint 10.0.0.2 is busy.
	busy := NewFleet(fc, 512)
	load(busy, 1, 40)
	scraped := map[string]int{}
	await := func(want string) *replicaMsg {
		for {
			m, err := parent.Receive()
			require.NoError(t, err)
			if m.Kind == "M" {
				e := -1
				for i := 0; i < fc.Endpoints; i++ {
					if fc.Address(i) == m.Text {
						e = i
					}
				}
				require.GreaterOrEqual(t, e, 0, "a scrape of a fleet endpoint: %q", m.Text)
				scraped[m.Text]++
				require.NoError(t, parent.Send(&replicaMsg{Kind: "P", Body: enginePage(busy, e)}))
				continue
			}
			require.Equal(t, want, m.Kind, "reply %q: %s", m.Kind, m.Text)
			return m
		}
	}
	const n = 40
	for i := 0; i < n; i++ {
		now := float64(i) * 300
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"question %d"}]}`, i)
		require.NoError(t, parent.Send(&replicaMsg{Kind: "C", Index: i, TimeMS: now, Path: "/v1/chat/completions",
			Headers: [][2]string{{"x-session-id", fmt.Sprintf("conv-%d", i)}}, Body: []byte(body)}))
		m := await("T")
		assert.NotEqual(t, 1, m.Target, "request %d avoids the endpoint busy with the others' traffic", i)
		assert.True(t, strings.HasPrefix(m.Text, "new-conversation"), "decision %q", m.Text)
		require.NoError(t, parent.Send(&replicaMsg{Kind: "D", Index: i, TimeMS: now + 100}))
		await("ok")
	}
	for i := 0; i < fc.Endpoints; i++ {
		// One scrape per interval_ms (1000) of replay time: 40 × 300 ms ≈ 12 s.
		assert.InDelta(t, 12, scraped[fc.Address(i)], 2, "scrapes of %s", fc.Address(i))
	}
	require.NoError(t, parent.Send(&replicaMsg{Kind: "S"}))
	reply := await("S")
	require.NotNil(t, reply.Stats)
	st := *reply.Stats
	assert.Equal(t, uint64(n), st.Routed)
	assert.Equal(t, uint64(0), st.ActiveRequests, "every request's load released")
	assert.Equal(t, uint64(0), st.FailOpen)
	assert.Equal(t, 0, st.LateScrapes)
	assert.Greater(t, st.ExtraTicks, 0)
	byName := map[string]uint64{}
	for _, c := range st.Decisions {
		byName[c.Name] = c.N
	}
	assert.Equal(t, uint64(n), byName["new-conversation"])

	fromParent.Close()
	require.NoError(t, <-done, "the child ends cleanly when the parent closes its stdin")
}

// TestReplicasPolicyEndToEnd starts real replica processes (this test binary, see
// TestMain) and replays the start of the chat trace through two replicas.
func TestReplicasPolicyEndToEnd(t *testing.T) {
	requireWasm(t)
	o, err := parseFlags([]string{"-wasm", testWasm, "-config", testConfig, "-trace", testChatTrace, "-n", "300",
		"-speed", "8", "-cache-blocks", "32", "-replicas", "2", "-replica-configs", "round_robin,hash+metrics", "-svg", ""})
	require.NoError(t, err)
	reqs, _, err := loadTrace(o.trace, o.format, o.limit, o.charsPerToken, o.speed)
	require.NoError(t, err)
	runs, err := runReplicas(o, reqs)
	require.NoError(t, err)
	require.Len(t, runs, 2)
	for _, run := range runs {
		r := run.Result
		assert.Equal(t, 300, r.Requests, r.Policy)
		assert.Empty(t, r.Notes, r.Policy)
		var decided uint64
		for _, c := range r.Decisions {
			decided += c.N
		}
		assert.Equal(t, uint64(300), decided, "%s: one decision per request: %v", r.Policy, r.Decisions)
		require.Len(t, r.Kinds, 300)
		for i, k := range r.Kinds {
			assert.NotEmpty(t, k, "%s: request %d has a decision", r.Policy, i)
		}
		assert.Equal(t, runs[0].PerKid, run.PerKid, "every configuration sees the same spread")
		assert.Greater(t, min(run.PerKid[0], run.PerKid[1]), 100)
	}
	assert.Equal(t, "kvroute x2 (round_robin)", runs[0].Result.Policy)
	assert.Equal(t, "kvroute x2 (hash + engine metrics)", runs[1].Result.Policy)
	assert.Zero(t, runs[0].Pages)
	assert.Greater(t, runs[1].Pages, 0, "the engine-metrics replicas scraped the fleet model")
	assert.Greater(t, runs[1].Result.HitRate(), runs[0].Result.HitRate(),
		"hash keeps a conversation on one target whichever replica routes its turns")
}

// TestChatTraceIsTheGeneratorsOutput checks the shipped chat trace is what
// `kvroute-replay -gen-chat` writes, and what it is made of.
func TestChatTraceIsTheGeneratorsOutput(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, writeChatTrace(&buf, chatTraceDefaults))
	shipped, err := os.ReadFile(testChatTrace)
	require.NoError(t, err)
	sum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	require.Equal(t, sum(buf.Bytes()), sum(shipped), "testdata/replay/chat_sessions.jsonl is `go run ./cmd/kvroute-replay -gen-chat`'s output")

	recs, err := ReadOpenAI(bytes.NewReader(shipped), 0)
	require.NoError(t, err)
	require.Len(t, recs, 1800)
	reqs := OpenAIRequests(recs, 4, 1)
	byConv := map[string][]*Request{}
	for i, r := range reqs {
		require.NotEmpty(t, r.Conversation)
		if i > 0 {
			require.GreaterOrEqual(t, r.ArrivalMS, reqs[i-1].ArrivalMS)
		}
		byConv[r.Conversation] = append(byConv[r.Conversation], r)
	}
	require.Len(t, byConv, 300)
	for id, turns := range byConv {
		require.Len(t, turns, 6, id)
		for k := 1; k < len(turns); k++ {
			prev, cur := turns[k-1], turns[k]
			assert.GreaterOrEqual(t, cur.ArrivalMS-prev.ArrivalMS, 20000.0, "%s turn %d comes after the think time", id, k)
			assert.True(t, bytes.HasPrefix(cur.Text(), prev.Text()), "%s turn %d carries the history", id, k)
			assert.Greater(t, cur.InputTokens, prev.InputTokens+prev.OutputTokens, "%s turn %d", id, k)
		}
	}
}

func TestReplicaStartFailureIsReported(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	fc := FleetConfig{Endpoints: 2, DPSize: 1}
	_, err = startReplicas("kvroute x2 (hash)", 2, exe, "no/such/kvroute.wasm", testConfig, fc, 1, "")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "run `make build` first")
	assert.Contains(t, err.Error(), "replica 0")
}
