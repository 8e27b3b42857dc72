package main

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// textReq is a hand-built request: blocks for hit accounting, text for the routers.
func textReq(index int, arrivalMS float64, blocks []uint64, input, output int, text string) *Request {
	r := &Request{Index: index, ArrivalMS: arrivalMS, Path: "/v1/completions", Model: "m",
		InputTokens: input, OutputTokens: output, Blocks: blocks, BlockTokens: 512}
	r.text = func() []byte { return []byte(text) }
	r.body = func() []byte { return completionBody("m", []byte(text), output) }
	r.prepareOne(2048)
	return r
}

func TestLRUEvictsLeastRecent(t *testing.T) {
	c := NewLRU(3)
	for _, k := range []uint64{1, 2, 3} {
		c.Touch(k)
	}
	c.Touch(1) // 2 is now the least recent
	ev, did := c.Touch(4)
	require.True(t, did)
	assert.Equal(t, uint64(2), ev)
	assert.False(t, c.Contains(2))
	for _, k := range []uint64{1, 3, 4} {
		assert.True(t, c.Contains(k), "key %d", k)
	}
	assert.Equal(t, 3, c.Len())
	s1, _ := c.Stamp(1)
	s4, _ := c.Stamp(4)
	assert.Less(t, s1, s4)

	c.Remove(3)
	assert.Equal(t, 2, c.Len())
	c.Touch(5)
	c.Touch(6) // evicts 1, the least recent of {1, 4, 5}
	assert.False(t, c.Contains(1))
	assert.True(t, c.Contains(4) && c.Contains(5) && c.Contains(6))
}

func TestLRUUnbounded(t *testing.T) {
	c := NewLRU(0)
	for k := uint64(0); k < 10000; k++ {
		_, did := c.Touch(k)
		require.False(t, did)
	}
	assert.Equal(t, 10000, c.Len())
}

func TestPrefixHitsStopAtFirstMiss(t *testing.T) {
	c := NewLRU(0)
	for _, k := range []uint64{1, 2, 4} {
		c.Touch(k)
	}
	// 3 is missing, so 4 is not a hit although it is cached: a KV cache reuses a prefix.
	assert.Equal(t, 2, c.PrefixHits([]uint64{1, 2, 3, 4}))
	assert.Equal(t, 0, c.PrefixHits([]uint64{9, 1}))
	assert.Equal(t, 3, c.PrefixHits([]uint64{1, 2, 4}))
}

func TestServeCountsThenHoldsAndEvictsTailFirst(t *testing.T) {
	c := NewLRU(4)
	assert.Equal(t, 0, c.Serve([]uint64{1, 2, 3}))
	assert.Equal(t, 3, c.Serve([]uint64{1, 2, 3}))
	assert.Equal(t, 2, c.Serve([]uint64{1, 2, 7, 8})) // a turn that shares two blocks
	// Capacity 4 holds {1, 2, 7, 8}: 3 went first. Blocks are touched tail first, so
	// the prompt's head is the most recent and its tail goes first under pressure.
	assert.False(t, c.Contains(3))
	c.Touch(9)
	assert.False(t, c.Contains(8), "the tail of the last prompt is evicted before its head")
	assert.True(t, c.Contains(1))
}

func TestOracleHitRate(t *testing.T) {
	reqs := []*Request{
		{Blocks: []uint64{1, 2}}, {Blocks: []uint64{1, 2, 3}}, {Blocks: []uint64{4}}, {Blocks: []uint64{1, 2, 3, 5}},
	}
	// Infinite: 0 + 2 + 0 + 3 of 10 blocks.
	assert.InDelta(t, 0.5, OracleHitRate(reqs, 0), 1e-9)
	// Two blocks: the second request finds {1, 2} and, touched tail first, keeps its
	// head {1, 2}; request 3 pushes 2 out; the last request finds only 1: 3 of 10.
	assert.InDelta(t, 0.3, OracleHitRate(reqs, 2), 1e-9)
}

// scripted sends request i to targets[i] and records every callback.
type scripted struct {
	targets []int
	log     []string
	fleet   *Fleet
	seen    []float64 // fleet clock at each Done
}

func (s *scripted) Name() string { return "scripted" }
func (s *scripted) Choose(r *Request, f *Fleet) int {
	s.fleet = f
	s.log = append(s.log, "choose", itoa(r.Index))
	return s.targets[r.Index]
}
func (s *scripted) Done(r *Request, target int) {
	s.log = append(s.log, "done", itoa(r.Index))
	s.seen = append(s.seen, s.fleet.Now())
}

func itoa(i int) string { return string(rune('0' + i)) }

func oneTarget() FleetConfig {
	return FleetConfig{Endpoints: 1, DPSize: 1, CacheTokens: 512 * 100, PrefillMSPerToken: 1, DecodeMSPerToken: 10, MaxRunning: 8}
}

func TestCompletionsComeBeforeLaterArrivals(t *testing.T) {
	cfg := oneTarget()
	cfg.Endpoints = 2
	// r0 at 0: prefill 100 ms, decode 5 × 10 ms: done at 150.
	// r1 at 150 on the other target; r0's completion (at 150) must come first.
	// r2 at 151: r1 is still running.
	reqs := []*Request{
		textReq(0, 0, []uint64{1}, 100, 5, "a"),
		textReq(1, 150, []uint64{2}, 100, 5, "b"),
		textReq(2, 151, []uint64{3}, 100, 5, "c"),
	}
	p := &scripted{targets: []int{0, 1, 0}}
	res, err := Replay(reqs, cfg, p)
	require.NoError(t, err)
	assert.Equal(t, []string{"choose", "0", "done", "0", "choose", "1", "choose", "2", "done", "1", "done", "2"}, p.log)
	assert.Equal(t, []float64{150, 300, 301}, p.seen, "completions are delivered at their modelled time")
	assert.Equal(t, []int{0, 1, 0}, res.Choices)
	assert.Equal(t, 301.0, res.EndMS)
}

func TestPrefillIsSerialisedAndHitsShortenIt(t *testing.T) {
	cfg := oneTarget()
	// r0: 1024 tokens in 2 blocks, nothing cached: prefill 1024 ms (TTFT 1024).
	// r1 at 10 shares block 1: 512 uncached tokens, but it waits for r0's prefill:
	// starts at 1024, TTFT 1024+512-10.
	reqs := []*Request{
		textReq(0, 0, []uint64{1, 2}, 1024, 1, "a"),
		textReq(1, 10, []uint64{1, 3}, 1024, 1, "b"),
	}
	res, err := Replay(reqs, cfg, &scripted{targets: []int{0, 0}})
	require.NoError(t, err)
	assert.Equal(t, []float64{1024, 1526}, res.TTFT)
	assert.Equal(t, int64(1), res.HitBlocks)
	assert.Equal(t, int64(4), res.TotalBlocks)
	assert.Equal(t, []int32{0, 1}, res.Hits)
	assert.InDelta(t, 0.25, res.HitRate(), 1e-9)
	// work: prefills 1024 + 512, decodes 10 + 10
	assert.InDelta(t, 1556, res.Work[0], 1e-9)
}

func TestRunQueueAdmitsWhenASlotFrees(t *testing.T) {
	cfg := oneTarget()
	cfg.MaxRunning = 1
	cfg.PrefillMSPerToken = 0
	// r0 runs 0..100; r1 arrives at 10 and waits for the slot; it is admitted at 100
	// (TTFT 90) and done at 200.
	reqs := []*Request{
		textReq(0, 0, []uint64{1}, 10, 10, "a"),
		textReq(1, 10, []uint64{2}, 10, 10, "b"),
	}
	p := &scripted{targets: []int{0, 0}}
	var waiting []int
	p2 := &probe{scripted: p, onChoose: func(f *Fleet) { waiting = append(waiting, f.Waiting(0), f.InFlight(0)) }}
	res, err := Replay(reqs, cfg, p2)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 0, 0, 1}, waiting, "at r1's arrival r0 is running and nothing waits")
	assert.Equal(t, []float64{0, 90}, res.TTFT)
	assert.Equal(t, 200.0, res.EndMS)
	// in flight: 1 over [0,10), 2 over [10,100), 1 over [100,200): mean 290/200.
	assert.InDelta(t, 1.45, res.MeanInFlight[0], 1e-9)
}

type probe struct {
	*scripted
	onChoose func(*Fleet)
}

func (p *probe) Choose(r *Request, f *Fleet) int {
	p.onChoose(f)
	return p.scripted.Choose(r, f)
}

func TestWaitingCountsPromptsQueuedForPrefill(t *testing.T) {
	cfg := oneTarget()
	reqs := []*Request{
		textReq(0, 0, []uint64{1}, 1000, 1, "a"), // prefill 0..1000
		textReq(1, 1, []uint64{2}, 1000, 1, "b"), // admitted, prefill waits until 1000
		textReq(2, 2, []uint64{3}, 1000, 1, "c"), // sees one waiting
		textReq(3, 3, []uint64{4}, 10, 1, "d"),   // sees two waiting
	}
	var waiting []int
	p := &probe{scripted: &scripted{targets: []int{0, 0, 0, 0}}, onChoose: func(f *Fleet) { waiting = append(waiting, f.Waiting(0)) }}
	_, err := Replay(reqs, cfg, p)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 0, 1, 2}, waiting)
}

func TestKVUtilization(t *testing.T) {
	cfg := oneTarget() // 51200 tokens of KV
	reqs := []*Request{textReq(0, 0, []uint64{1}, 25000, 600, "a"), textReq(1, 1, []uint64{2}, 10, 1, "b")}
	var util []float64
	p := &probe{scripted: &scripted{targets: []int{0, 0}}, onChoose: func(f *Fleet) { util = append(util, f.KVUtilization(0)) }}
	_, err := Replay(reqs, cfg, p)
	require.NoError(t, err)
	assert.Equal(t, 0.0, util[0])
	assert.InDelta(t, 25600.0/51200, util[1], 1e-9)
}

func TestReplayRejectsABadTarget(t *testing.T) {
	_, err := Replay([]*Request{textReq(0, 0, []uint64{1}, 10, 1, "a")}, oneTarget(), &scripted{targets: []int{3}})
	assert.ErrorContains(t, err, "chose target 3")
}

func TestResultStatistics(t *testing.T) {
	r := &Result{Work: []float64{1, 1, 1, 3}, MeanInFlight: []float64{2, 2}, TTFT: []float64{1, 2, 3, 4, 100}}
	assert.InDelta(t, 2.0, r.WorkImbalance(), 1e-9)
	assert.InDelta(t, 1.0, r.LoadImbalance(), 1e-9)
	assert.Equal(t, 3.0, r.TTFTQuantile(0.5))
	assert.Equal(t, 100.0, r.TTFTQuantile(0.99))
	assert.InDelta(t, 22.0, r.TTFTMean(), 1e-9)
	assert.Equal(t, 0.0, (&Result{}).HitRate())
	assert.False(t, math.IsNaN((&Result{}).LoadImbalance()))
}

func TestFleetNamesAreEndpointMajor(t *testing.T) {
	cfg := FleetConfig{Endpoints: 300, DPSize: 2}
	assert.Equal(t, "10.0.0.1:8000#0", cfg.TargetName(0))
	assert.Equal(t, "10.0.0.1:8000#1", cfg.TargetName(1))
	assert.Equal(t, "10.0.0.2:8000#0", cfg.TargetName(2))
	assert.Equal(t, "10.0.1.0:8000", cfg.Address(255))
	assert.Equal(t, 600, cfg.Targets())
}

// streamed records first tokens too.
type streamed struct{ scripted }

func (s *streamed) FirstToken(r *Request, target int) {
	s.log = append(s.log, "first", itoa(r.Index))
	s.seen = append(s.seen, s.fleet.Now())
}

func TestFirstTokenComesAtTheEndOfThePrefill(t *testing.T) {
	cfg := oneTarget()
	// r0 at 0: prefill 100 ms (first token at 100), decode 50 ms: done at 150.
	// r1 at 120 waits for nothing: first token at 220, done at 270.
	// r2 at 130 queues behind r1's prefill: first token at 320.
	reqs := []*Request{
		textReq(0, 0, []uint64{1}, 100, 5, "a"),
		textReq(1, 120, []uint64{2}, 100, 5, "b"),
		textReq(2, 130, []uint64{3}, 100, 5, "c"),
	}
	p := &streamed{scripted{targets: []int{0, 0, 0}}}
	_, err := Replay(reqs, cfg, p)
	require.NoError(t, err)
	assert.Equal(t, []string{"choose", "0", "first", "0", "choose", "1", "choose", "2", "done", "0",
		"first", "1", "done", "1", "first", "2", "done", "2"}, p.log)
	assert.Equal(t, []float64{100, 150, 220, 270, 320, 370}, p.seen)
}

func TestSpeedsAndDrawsFlags(t *testing.T) {
	o, err := parseFlags([]string{"-speed", "1, 2.5", "-draws", "8"})
	require.NoError(t, err)
	assert.Equal(t, []float64{1, 2.5}, o.speeds)
	assert.Equal(t, 1.0, o.speed)
	assert.Equal(t, 8, o.draws)
	_, err = parseFlags([]string{"-speed", "1,0"})
	assert.ErrorContains(t, err, "-speed")
	_, err = parseFlags([]string{"-draws", "0"})
	assert.ErrorContains(t, err, "-draws")
	assert.Equal(t, "", drawSalt("", 0))
	assert.Equal(t, "xd3", drawSalt("x", 3))
	reqs := []*Request{textReq(0, 10, nil, 1, 1, "a"), textReq(1, 30, nil, 1, 1, "b")}
	fast := atSpeed(reqs, 2)
	assert.Equal(t, []float64{5, 15}, []float64{fast[0].ArrivalMS, fast[1].ArrivalMS})
	assert.Equal(t, 10.0, reqs[0].ArrivalMS, "the speed-1 requests are untouched")
}

func TestRunReplaysEverySpeedAndDraw(t *testing.T) {
	o, err := parseFlags([]string{"-trace", testTrace, "-n", "150", "-svg", "", "-policies", "least-loaded,gie",
		"-speed", "1,2", "-draws", "3"})
	require.NoError(t, err)
	rep, _, err := run(o)
	require.NoError(t, err)
	require.Len(t, rep.Cells, 6)
	assert.Equal(t, []float64{1, 2}, rep.Speeds())
	assert.Equal(t, rep.Cells[3].DurationMS*2, rep.Cells[0].DurationMS, "x2 compresses the arrivals")
	assert.NotEqual(t, rep.Cells[0].Baselines[1].Choices, rep.Cells[1].Baselines[1].Choices, "another draw reseeds GIE's picker")
	assert.NotEqual(t, rep.Cells[0].Baselines[0].Choices, rep.Cells[1].Baselines[0].Choices, "and moves least-loaded's round-robin start")
	st := rep.Stats(2)
	require.Len(t, st, 2)
	assert.LessOrEqual(t, st[1].TTFTMean.Min, st[1].TTFTMean.Mean)
	assert.GreaterOrEqual(t, st[1].TTFTMean.Max, st[1].TTFTMean.Mean)
}

func TestSlowEndpointsServeSlowerByTheirFactor(t *testing.T) {
	// Two endpoints of one rank each, the first 3 times as slow: the same 1024-token
	// prompt with 1 output token takes 3 × (1024 + 10) ms of work there.
	cfg := oneTarget()
	cfg.Endpoints, cfg.SlowEndpoints, cfg.SlowFactor = 2, 1, 3
	reqs := []*Request{
		textReq(0, 0, []uint64{1, 2}, 1024, 1, "a"),
		textReq(1, 0, []uint64{3, 4}, 1024, 1, "b"),
	}
	res, err := Replay(reqs, cfg, &scripted{targets: []int{0, 1}})
	require.NoError(t, err)
	assert.Equal(t, []float64{3072, 1024}, res.TTFTByIndex)
	assert.InDelta(t, 3*1034, res.Work[0], 1e-9)
	assert.InDelta(t, 1034, res.Work[1], 1e-9)
}
