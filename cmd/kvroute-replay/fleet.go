package main

import (
	"container/heap"
	"fmt"
	"math"
	"sort"
)

// FleetConfig is the modelled fleet: Endpoints × DPSize targets, each an inference
// engine with its own prefix KV cache.
type FleetConfig struct {
	Endpoints int // inference servers, addressed 10.0.0.1:8000, 10.0.0.2:8000, …
	DPSize    int // data-parallel ranks per server; each rank is a target

	// CacheTokens is the prefix-cache capacity of one target, in tokens. Hit
	// accounting works in the trace's blocks (512 tokens for Mooncake), so the LRU
	// holds CacheTokens / block tokens blocks.
	CacheTokens int

	PrefillMSPerToken float64 // prefill time per uncached prompt token
	DecodeMSPerToken  float64 // decode time per output token
	MaxRunning        int     // requests a target runs at once; more wait in its queue

	// SlowEndpoints are the first endpoints whose service times are SlowFactor times
	// the others' (older GPUs in a mixed fleet); 0 or a factor of 1: none.
	SlowEndpoints int
	SlowFactor    float64
}

// serviceFactor is the multiplier of target i's prefill and decode times.
func (c FleetConfig) serviceFactor(i int) float64 {
	if c.SlowFactor > 0 && i/c.DPSize < c.SlowEndpoints {
		return c.SlowFactor
	}
	return 1
}

// TargetName is the address and rank of target i: endpoint-major order.
func (c FleetConfig) TargetName(i int) string {
	return fmt.Sprintf("%s#%d", c.Address(i/c.DPSize), i%c.DPSize)
}

// Address is the host:port of endpoint e.
func (c FleetConfig) Address(e int) string {
	return fmt.Sprintf("10.0.%d.%d:8000", (e+1)/256, (e+1)%256)
}

// Targets is the number of targets.
func (c FleetConfig) Targets() int { return c.Endpoints * c.DPSize }

// job is one request on its target.
type job struct {
	r            *Request
	target       int
	prefillStart float64
	done         float64
}

// target is one engine: an LRU prefix cache, a run queue with at most MaxRunning
// requests admitted, one prefill engine that works through admitted prompts in
// order (a GPU is compute-bound in prefill), and decode that runs alongside.
type target struct {
	cache         *LRU
	running       []*job // admitted: in prefill (or waiting for it) or decoding
	queue         []*job // waiting for a running slot
	prefillFreeAt float64
	kvTokens      int // prompt + output tokens of the running requests

	// statistics
	assigned   int
	work       float64 // service time: prefill of uncached tokens + decode, ms
	inflight   int     // assigned, not completed
	area       float64 // ∫ inflight dt, ms
	lastChange float64
}

// Fleet is the modelled fleet as the policies see it during a replay.
type Fleet struct {
	cfg         FleetConfig
	blockTokens int
	targets     []*target
	up          int // targets 0 … up−1 are in the fleet (a scaled replay moves it: scale.go)
	now         float64
	events      eventHeap
	seq         int

	hitBlocks, totalBlocks int64
	hitTokens, inputTokens int64
	ttft                   []float64
	choices                []int
	hits                   []int32   // per request index: prefix blocks served from cache
	ttftByIndex            []float64 // per request index
	departed               int       // requests a policy sent to a target that had left
}

// NewFleet builds an idle fleet whose caches count blocks of blockTokens tokens.
func NewFleet(cfg FleetConfig, blockTokens int) *Fleet {
	f := &Fleet{cfg: cfg, blockTokens: blockTokens}
	for i := 0; i < cfg.Targets(); i++ {
		f.targets = append(f.targets, &target{cache: NewLRU(cfg.CacheTokens / blockTokens)})
	}
	f.up = len(f.targets)
	return f
}

// N is the number of targets in the fleet now: targets 0 … N−1. A scaled replay
// grows and shrinks the fleet at its end (scale.go); otherwise it is every target.
func (f *Fleet) N() int { return f.up }

// Config is the fleet's configuration.
func (f *Fleet) Config() FleetConfig { return f.cfg }

// Now is the replay clock, ms.
func (f *Fleet) Now() float64 { return f.now }

// InFlight is the number of requests assigned to target i and not completed (what a
// router counts as its outstanding requests there).
func (f *Fleet) InFlight(i int) int { return f.targets[i].inflight }

// Waiting is the number of requests on target i whose prefill has not started: the
// queue for a running slot and the admitted prompts waiting for the prefill engine
// (an engine's num_requests_waiting).
func (f *Fleet) Waiting(i int) int {
	t := f.targets[i]
	n := len(t.queue)
	for _, j := range t.running {
		if j.prefillStart > f.now {
			n++
		}
	}
	return n
}

// KVUtilization is the share of target i's KV memory held by running requests
// (an engine's kv_cache_usage_perc; cached blocks of finished requests are free).
func (f *Fleet) KVUtilization(i int) float64 {
	return math.Min(1, float64(f.targets[i].kvTokens)/float64(max(1, f.cfg.CacheTokens)))
}

// CacheHolds reports whether target i's cache holds block key (tests and oracles).
func (f *Fleet) CacheHolds(i int, key uint64) bool { return f.targets[i].cache.Contains(key) }

// assign puts r on target t at the current time.
func (f *Fleet) assign(r *Request, t int) {
	tg := f.targets[t]
	f.setInflight(tg, tg.inflight+1)
	tg.assigned++
	f.choices = append(f.choices, t)
	j := &job{r: r, target: t}
	if len(tg.running) < f.cfg.MaxRunning {
		f.admit(tg, j)
	} else {
		tg.queue = append(tg.queue, j)
	}
}

// admit starts j on its target now: the cache is consulted, the prompt queues for
// the prefill engine, and the completion is scheduled.
func (f *Fleet) admit(tg *target, j *job) {
	r := j.r
	hits := tg.cache.Serve(r.Blocks)
	hitTokens := min(hits*r.BlockTokens, r.InputTokens)
	uncached := max(r.InputTokens-hitTokens, 1) // at least the last token is computed
	f.hitBlocks += int64(hits)
	for len(f.hits) <= r.Index {
		f.hits = append(f.hits, 0)
	}
	f.hits[r.Index] = int32(hits)
	for len(f.ttftByIndex) <= r.Index {
		f.ttftByIndex = append(f.ttftByIndex, 0)
	}
	f.totalBlocks += int64(len(r.Blocks))
	f.hitTokens += int64(hitTokens)
	f.inputTokens += int64(r.InputTokens)

	j.prefillStart = math.Max(f.now, tg.prefillFreeAt)
	slow := f.cfg.serviceFactor(j.target)
	prefillEnd := j.prefillStart + float64(uncached)*f.cfg.PrefillMSPerToken*slow
	tg.prefillFreeAt = prefillEnd
	decode := float64(r.OutputTokens) * f.cfg.DecodeMSPerToken * slow
	j.done = prefillEnd + decode
	tg.work += prefillEnd - j.prefillStart + decode
	tg.kvTokens += r.InputTokens + r.OutputTokens
	tg.running = append(tg.running, j)
	f.ttft = append(f.ttft, prefillEnd-r.ArrivalMS)
	f.ttftByIndex[r.Index] = prefillEnd - r.ArrivalMS
	f.seq++
	heap.Push(&f.events, event{at: prefillEnd, seq: f.seq, job: j, firstToken: true})
	f.seq++
	heap.Push(&f.events, event{at: j.done, seq: f.seq, job: j})
}

// advance delivers, in time order, every first token and completion due by until,
// telling p of each before anything that happens later. Responses are streamed: the
// first chunk reaches the router when the prefill ends (FirstToken), the rest at the
// completion (Done).
func (f *Fleet) advance(until float64, p Policy) {
	ft, _ := p.(FirstTokenPolicy)
	for len(f.events) > 0 && f.events[0].at <= until {
		e := heap.Pop(&f.events).(event)
		f.now = e.at
		j := e.job
		if e.firstToken {
			if ft != nil {
				ft.FirstToken(j.r, j.target)
			}
			continue
		}
		tg := f.targets[j.target]
		for k, x := range tg.running {
			if x == j {
				tg.running = append(tg.running[:k], tg.running[k+1:]...)
				break
			}
		}
		tg.kvTokens -= j.r.InputTokens + j.r.OutputTokens
		f.setInflight(tg, tg.inflight-1)
		p.Done(j.r, j.target)
		if len(tg.queue) > 0 && len(tg.running) < f.cfg.MaxRunning {
			next := tg.queue[0]
			tg.queue = tg.queue[1:]
			f.admit(tg, next)
		}
	}
	if until > f.now && !math.IsInf(until, 1) {
		f.now = until
	}
}

func (f *Fleet) setInflight(tg *target, n int) {
	tg.area += float64(tg.inflight) * (f.now - tg.lastChange)
	tg.lastChange = f.now
	tg.inflight = n
}

// Replay runs reqs (in arrival order) through a fresh fleet under p.
func Replay(reqs []*Request, cfg FleetConfig, p Policy) (*Result, error) {
	return ReplayScaled(reqs, cfg, p, nil)
}

// ReplayScaled is Replay on a fleet that scales on sched (nil: a fixed fleet). A
// request sent to a target that has left is served there all the same (a pod drains
// what it was sent while it terminates) and counted in Result.Departed.
func ReplayScaled(reqs []*Request, cfg FleetConfig, p Policy, sched *Schedule) (*Result, error) {
	blockTokens := MooncakeBlockTokens
	if len(reqs) > 0 {
		blockTokens = reqs[0].BlockTokens
	}
	f := NewFleet(cfg, blockTokens)
	next := 0 // the schedule's next step
	if sched != nil {
		f.up = sched.Start * cfg.DPSize
	}
	for _, r := range reqs {
		for sched != nil && next < len(sched.Steps) && sched.Steps[next].AtMS <= r.ArrivalMS {
			f.advance(sched.Steps[next].AtMS, p)
			f.up = sched.Steps[next].Endpoints * cfg.DPSize
			next++
		}
		f.advance(r.ArrivalMS, p) // completions due by the arrival come first
		t := p.Choose(r, f)
		if t < 0 || t >= len(f.targets) || (sched == nil && t >= f.N()) {
			return nil, fmt.Errorf("%s chose target %d for request %d (fleet has %d)", p.Name(), t, r.Index, f.N())
		}
		if t >= f.N() {
			f.departed++
		}
		f.assign(r, t)
	}
	f.advance(math.Inf(1), p)
	return f.result(p.Name()), nil
}

// Result is what one replay measured.
type Result struct {
	Policy                 string
	Requests               int
	HitBlocks, TotalBlocks int64
	HitTokens, InputTokens int64
	EndMS                  float64
	Assigned               []int
	Work                   []float64 // per target, ms
	MeanInFlight           []float64 // per target, time-averaged over [0, EndMS]
	TTFT                   []float64 // sorted, ms
	Choices                []int     // target per request, in arrival order
	Hits                   []int32   // prefix blocks served from cache, per request index
	TTFTByIndex            []float64 // TTFT per request index, ms
	Kinds                  []string  // the policy's decision per request, if it reports one
	Decisions              []Count   // the policy's own decision mix, if it reports one
	PD                     string    // P/D split, if the policy reports one
	Notes                  []string  // anomalies the policy reported
	Ticks                  int       // timer ticks delivered to the policy (kvroute)
	Departed               int       // requests sent to a target that had left (scaled replays)
}

// Count is a named count.
type Count struct {
	Name string
	N    uint64
}

func (f *Fleet) result(name string) *Result {
	res := &Result{Policy: name, Requests: len(f.choices), HitBlocks: f.hitBlocks, TotalBlocks: f.totalBlocks,
		HitTokens: f.hitTokens, InputTokens: f.inputTokens, EndMS: f.now, Choices: f.choices, Hits: f.hits, TTFTByIndex: f.ttftByIndex,
		Departed: f.departed}
	for _, tg := range f.targets {
		res.Assigned = append(res.Assigned, tg.assigned)
		res.Work = append(res.Work, tg.work)
		mean := 0.0
		if f.now > 0 {
			mean = (tg.area + float64(tg.inflight)*(f.now-tg.lastChange)) / f.now
		}
		res.MeanInFlight = append(res.MeanInFlight, mean)
	}
	res.TTFT = append([]float64(nil), f.ttft...)
	sort.Float64s(res.TTFT)
	return res
}

// HitRate is the prefix-block hit rate: blocks served from cache / all blocks.
func (r *Result) HitRate() float64 { return ratio(float64(r.HitBlocks), float64(r.TotalBlocks)) }

// WorkImbalance is max/mean of the per-target service time.
func (r *Result) WorkImbalance() float64 { return maxOverMean(r.Work) }

// LoadImbalance is max/mean of the per-target time-averaged in-flight requests.
func (r *Result) LoadImbalance() float64 { return maxOverMean(r.MeanInFlight) }

// TTFTQuantile returns the q-quantile of the TTFT estimates (nearest rank).
func (r *Result) TTFTQuantile(q float64) float64 {
	if len(r.TTFT) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(r.TTFT)))) - 1
	return r.TTFT[min(max(i, 0), len(r.TTFT)-1)]
}

// TTFTMean is the mean TTFT estimate.
func (r *Result) TTFTMean() float64 {
	s := 0.0
	for _, v := range r.TTFT {
		s += v
	}
	return ratio(s, float64(len(r.TTFT)))
}

func maxOverMean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	m, s := xs[0], 0.0
	for _, x := range xs {
		m = math.Max(m, x)
		s += x
	}
	return ratio(m, s/float64(len(xs)))
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// OracleHitRate replays the requests' blocks, in arrival order, through one LRU of
// capacityBlocks (<= 0: a cache that never evicts) and returns the prefix hit rate.
func OracleHitRate(reqs []*Request, capacityBlocks int) float64 {
	c := NewLRU(capacityBlocks)
	var hit, total int64
	for _, r := range reqs {
		hit += int64(c.Serve(r.Blocks))
		total += int64(len(r.Blocks))
	}
	return ratio(float64(hit), float64(total))
}

// event is a first token (the prefill is over) or a completion.
type event struct {
	at         float64
	seq        int
	job        *job
	firstToken bool
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
