package routing

import (
	"math"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/engine"
	"github.com/kvroute/kvroute/routing/extract"
	"github.com/kvroute/kvroute/routing/hashx"
	"github.com/kvroute/kvroute/routing/prefix"
	"github.com/kvroute/kvroute/routing/state"
)

// Router makes every routing decision of one plugin instance. Its state lives in a
// Store shared by all VMs; the Router itself holds only the config and the expanded
// target lists, so any number of Routers over one Store behave as one.
type Router struct {
	cfg     *config.Config
	now     func() int64 // milliseconds
	decode  *poolState
	prefill *poolState

	// localCursor is the VM-local round robin used when shared state fails.
	localCursor uint64
	// hashed is each request's prompt hashed for the prefix index, reused (a Router
	// serves one VM, one request at a time).
	hashed prefix.Prompt
	// prompt is the decode pool's prefix view of the request being decided, reused.
	prompt prompt
}

// poolState is one pool's targets and the shared records kept for it.
type poolState struct {
	name    string
	targets *PoolTargets
	ledger  *LoadLedger
	health  *HealthBoard
	cursor  *Cursor
	index   *prefix.PrefixIndex
	conv    *ConversationTable
	engine  *engine.EngineBoard // nil unless engine_metrics.enabled

	// engineFigures is the board as last read, with when (a VM reads it at most every
	// engineReadMS: figures change once per scrape).
	engineFigures map[uint64]engine.EngineFigures
	engineReadAt  int64

	view         poolView // reused by every decision
	viewLoads    []Load
	viewAhead    []int64
	viewEligible []int
	everyTarget  []int // 0, 1, …: the view's eligible targets when every one is (read only)
	candBuf      []int
	copyBuf      []int                         // the candidates copyPlaces keeps
	newCopyBuf   []int                         // the candidates placeCopy keeps
	byID32       targetIndex                   // low 32 bits of a target id → index, as the prefix index keeps them
	matchedBuf   []int                         // per target index: matched blocks of the request being decided
	tokensBuf    []int                         // per target index: matched tokens, gated
	waitBuf      []int64                       // per target index: a first turn's wait (soonest)
	soonBuf      []int                         // the targets soonest keeps
	known        func(uint32) bool             // whether the prefix index's 32-bit id is a target here
	clockOf      func(uint32) (uint32, uint32) // a target's write clock and cache (0: unknown) in the view, in blocks
	syncLoads    []Load                        // the ledger read on the tick, for the index's clocks
	// Zero, per target index, copied to clear the per-target buffers: in wasm a copy
	// is one host call, a clear one per doubling of the length.
	zeroLoads []Load
	zeroInts  []int

	disc *poolDiscovery // nil for a static pool

	// nextRank is, per target index, the next target of the same endpoint (itself for
	// an endpoint of one rank), around.
	nextRank []int

	// sendsFromMS is when the pool's recent sends began, as far as this VM can tell:
	// the last view that found none, else long before (its first view found some).
	sendsFromMS int64
	viewed      bool // whether a view has been taken (sendsFromMS is set)

	// decodeTime is the pool's requests past their first chunk times the ms they have
	// run, summed over this VM's views (the count of one view held until the next)
	// and halved as the decode stays are; decodeEpoch is its stay half-life epoch.
	// decoding and decodeAt are the count and time of the last view. The count is
	// requests in flight less those with prefill queued, so a request whose prompt was
	// all cached counts from its send: the ledger does not tell when its chunk came.
	decodeTime                      float64
	decodeEpoch, decoding, decodeAt int64
}

// NewRouter builds a Router over store. now returns the current time in milliseconds.
func NewRouter(cfg *config.Config, store state.Store, now func() int64) *Router {
	ns, retries := cfg.State.Namespace, cfg.State.MaxCASRetries
	newPool := func(name string, p config.Pool) *poolState {
		ps := &poolState{
			name:   name,
			ledger: NewLoadLedger(store, ns, name, cfg.State.LeaseMS, retries),
			health: NewHealthBoard(store, ns, name, cfg.Health, retries),
			cursor: NewCursor(store, ns, name, retries),
			index:  prefix.NewPrefixIndex(store, ns, name, cfg.Prefix.CapacityBlocks, retries),
			conv:   NewConversationTable(store, ns, name, cfg.Conversation.MaxSessions, retries),
		}
		ps.setTargets(p.Endpoints)
		ps.ledger.keepClock = func(id uint64) bool { return ps.targets.Index(id) >= 0 }
		ps.ledger.configuredCache = cfg.Prefix.TargetCacheTokens
		ps.known = func(t uint32) bool { return ps.byID32.get(uint64(t)) >= 0 }
		bt := int64(max(1, cfg.Prefix.BlockTokens))
		configured := cfg.Prefix.TargetCacheTokens
		ps.clockOf = func(t uint32) (uint32, uint32) {
			if i := ps.byID32.get(uint64(t)); i >= 0 && i < len(ps.view.loads) {
				l := &ps.view.loads[i]
				return uint32(l.Written / bt), uint32(min(l.CacheOr(configured)/bt, 1<<30))
			}
			return 0, 0
		}
		if cfg.EngineMetrics.Enabled {
			ps.engine = engine.NewEngineBoard(store, ns, name, cfg.EngineMetrics.StaleMS, retries)
			ps.engineFigures = map[uint64]engine.EngineFigures{}
			ps.engineReadAt = -engineReadMS
		}
		if p.Discovery != nil {
			ps.disc = newPoolDiscovery(store, ns, name, p, retries)
		}
		return ps
	}
	return &Router{
		cfg:     cfg,
		now:     now,
		decode:  newPool("decode", cfg.Pools.Decode),
		prefill: newPool("prefill", cfg.Pools.Prefill),
	}
}

// setTargets makes eps the pool's endpoints: at start, and whenever discovery changes
// them. Every record kept per target (ledger, prefix index, conversations, health,
// engine figures) is keyed by target id, so it carries over; a target that left is
// simply no longer found (docs/behaviour.md, State).
func (ps *poolState) setTargets(eps []config.Endpoint) {
	ps.targets = NewPoolTargets(config.Pool{Endpoints: eps})
	n := len(ps.targets.Targets)
	ps.byID32 = newTargetIndex(n)
	for i, t := range ps.targets.Targets {
		ps.byID32.put(uint64(prefix.PrefixTargetID(t.ID)), i)
	}
	ps.matchedBuf = make([]int, n)
	ps.syncLoads = make([]Load, n)
	ps.tokensBuf = make([]int, n)
	ps.waitBuf = make([]int64, n)
	ps.soonBuf = make([]int, 0, n)
	ps.viewLoads = make([]Load, n)
	ps.zeroLoads = make([]Load, n)
	ps.zeroInts = make([]int, n)
	ps.viewAhead = make([]int64, n)
	ps.viewEligible = make([]int, 0, n)
	ps.everyTarget = make([]int, n)
	for i := range ps.everyTarget {
		ps.everyTarget[i] = i
	}
	ps.candBuf = make([]int, 0, n)
	ps.copyBuf = make([]int, 0, n)
	ps.newCopyBuf = make([]int, 0, n)
	ps.nextRank = make([]int, n)
	last := map[uint64]int{}
	first := map[uint64]int{}
	for i, t := range ps.targets.Targets {
		if j, ok := last[t.EndpointFP]; ok {
			ps.nextRank[j] = i
		} else {
			first[t.EndpointFP] = i
		}
		last[t.EndpointFP] = i
	}
	for fp, j := range last {
		ps.nextRank[j] = first[fp]
	}
}

// DecodeTargets and PrefillTargets expose the expanded pools (for gauges and tools).
func (r *Router) DecodeTargets() []Target  { return r.decode.targets.Targets }
func (r *Router) PrefillTargets() []Target { return r.prefill.targets.Targets }

// MaxRequestBytes and MaxRequestTokens bound what a request can claim: far above any
// real prompt, and small enough that a ledger's sums over any number of requests held
// within a lease cannot overflow.
const (
	MaxRequestBytes  = 1 << 40
	MaxRequestTokens = 1 << 36
)

// NoRank means the client named no (trusted) DP rank.
const NoRank = -1

// poolView is a pool as one decision sees it: who is eligible, their load and the cap.
type poolView struct {
	pool     *poolState
	eligible []int   // indices into pool.targets.Targets, endpoint-first
	loads    []Load  // per index of pool.targets.Targets
	ahead    []int64 // per index: queued prefill estimated ahead of this request (eligible only)
	total    Load    // over the eligible targets: Requests, Tokens and RecentSent only
	cap      int64
	busiest  int64 // the most requests an eligible target has
	// perRequest is the pool's recent mean of uncached tokens per request: the wait
	// a soft cap charges on a target for each request it has from one below the cap up.
	perRequest int64
	// sentInFlight is the requests in flight that the ledger counts, over the eligible
	// targets: those the recent sends count too, where an engine's report may add
	// others' (slotWait).
	sentInFlight int64
	// rate is the pool's observed prefill rate, tokens per ms (0: none seen yet).
	rate float64
	// nowMS is the time of the decision.
	nowMS int64
	// slotsNow and slotsSeen are runningSlots' counts, slotWaitTokens slotWait at
	// slotsSeen (0 with none seen).
	slotsNow, slotsSeen int64
	slotWaitTokens      float64
	// copyTokens is the tokens of the request's prefix when its demand needs another
	// copy (copiesNeeded), else 0: a target without them counts computing them once.
	copyTokens int
	// copyNow says the prefix's holders are backlogged at their slots
	// (holdersBacklogged): the request goes where a copy is made.
	copyNow bool
}

// view reads health and load and works out eligibility and the fair-share cap.
func (r *Router) view(p *poolState, rank int, nowMS int64) (*poolView, error) {
	var ejected map[uint64]bool
	if !p.health.cleanNow(nowMS) {
		var err error
		if ejected, err = p.health.Ejected(nowMS); err != nil {
			return nil, err
		}
	}
	// A VM decides one request at a time: the pool's view reuses its buffers, filled
	// through locals (in wasm each store to a field of the view goes to the heap).
	loads, ahead := p.viewLoads, p.viewAhead
	copy(loads, p.zeroLoads)
	if err := p.ledger.LoadsInto(nowMS, p.targets.Index, loads); err != nil {
		return nil, err
	}
	p.addDecodeTime(loads, nowMS)
	// Without a rank asked for or an endpoint ejected every target is eligible: no
	// loop of tests, each a few jumps through the dispatcher in wasm.
	eligible := p.everyTarget
	if rank != NoRank || ejected != nil {
		eligible = p.eligibleTargets(rank, ejected)
	}
	// Field by field, as a struct literal would be zeroed and copied by host calls
	// in wasm; the total's other fields stay zero.
	v := &p.view
	v.pool, v.loads, v.ahead, v.eligible = p, loads, ahead, eligible
	var requests, tokens, busiest, recent, sent, rtok, rms, sentInFlight int64
	sighted := false // some eligible target carries a sighting out of running slots
	if p.engine != nil {
		for _, i := range eligible {
			sentInFlight += loads[i].Requests
		}
		r.addEngineLoad(p, v, nowMS)
	}
	for _, i := range eligible {
		requests += loads[i].Requests
		tokens += loads[i].Tokens
		busiest = max(busiest, loads[i].Requests)
		recent += loads[i].Recent
		sent += loads[i].RecentSent
		rtok += loads[i].RateTokens
		rms += loads[i].RateMS
		sighted = sighted || loads[i].FullAt != 0
	}
	// A target that has returned no first chunk yet is taken to compute at the rate
	// another rank of its endpoint has shown (they share a server), else at its
	// peers' (engines of one pool are alike): counting all it has queued as still
	// ahead would send every prompt to the targets whose rate is known, back to back,
	// in a fleet's first seconds.
	for _, i := range eligible {
		l := &loads[i]
		if l.RateMS == 0 {
			for j := p.nextRank[i]; j != i; j = p.nextRank[j] {
				if loads[j].RateMS > 0 {
					l.RateTokens, l.RateMS = loads[j].RateTokens, loads[j].RateMS
					break
				}
			}
		}
		if l.RateMS > 0 || rms == 0 {
			ahead[i] = l.PrefillAhead(nowMS)
		} else {
			ahead[i] = l.PrefillAheadAt(nowMS, rtok, rms)
		}
	}
	v.total.Requests, v.total.Tokens, v.total.Recent, v.total.RecentSent, v.busiest = requests, tokens, recent, sent, busiest
	poolSent := sent
	if len(eligible) < len(loads) {
		poolSent = 0
		for i := range loads {
			poolSent += loads[i].RecentSent
		}
	}
	if poolSent == 0 {
		p.sendsFromMS = nowMS
	} else if !p.viewed {
		p.sendsFromMS = math.MinInt64 / 2
	}
	p.viewed = true
	if p.engine == nil {
		sentInFlight = requests
	}
	v.sentInFlight = sentInFlight
	v.cap = fairShareCap(r.cfg.Balance.FairShareMultiplier, requests, len(eligible))
	// A target that has stalled while running many requests past their first chunk has
	// run out of running slots (slotsFullRunning): requests in flight, not prefill
	// queued, then set the wait, and the cap is the fair share itself, so that they are
	// spread evenly.
	if share := fairShareCap(1, requests, len(eligible)); share < v.cap {
		for _, i := range eligible {
			if running := loads[i].Requests - loads[i].Prefills; running >= max(share, slotsFullRunning) && loads[i].Stalled(nowMS) {
				v.cap = share
				break
			}
		}
	}
	v.perRequest = 0
	if sent > 0 {
		v.perRequest = recent * countUnit / sent
	}
	v.rate, v.nowMS, v.copyTokens, v.copyNow = 0, nowMS, 0, false
	if rms > 0 {
		v.rate = float64(rtok) / float64(rms)
	}
	v.slotsNow, v.slotsSeen, v.slotWaitTokens = 0, 0, 0
	// Only a target running slotsFullRunning or more can be out of slots now, and
	// only a kept sighting counts otherwise: the common case spares the loop.
	if busiest >= slotsFullRunning || sighted {
		v.slotsNow, v.slotsSeen = v.runningSlots()
		if v.slotsSeen > 0 {
			v.slotWaitTokens = v.slotWait(v.slotsSeen)
		}
	}
	return v, nil
}

// slotCharge is the wait for running slots charged on target i: slotWaitTokens for
// each request it has from the slot count seen up (0 below it, or with none seen). A
// target is seen full only once it is, and what was placed there on the way stays:
// so how many a target ran when last seen out of slots is kept in the ledger
// (Load.FullRunning) for slotsMemoryMS, and every VM's decisions go by the most of
// those.
func (v *poolView) slotCharge(i int) int64 {
	if v.slotsSeen <= 0 {
		return 0
	}
	return v.slotChargeOver(i)
}

// atSlots reports whether target i has as many requests in flight as the slot count
// seen, or more: a request sent there waits for a slot (slotCharge).
func (v *poolView) atSlots(i int) bool {
	return v.slotsSeen > 0 && v.loads[i].Requests >= v.slotsSeen
}

// slotChargeOver is slotCharge with a slot count seen, out of line so that the common
// answer is inlined where it is asked.
func (v *poolView) slotChargeOver(i int) int64 {
	if over := v.loads[i].Requests - v.slotsSeen + 1; over > 0 {
		return int64(math.Min(float64(over)*v.slotWaitTokens, maxSlotWait))
	}
	return 0
}

// eligibleTargets is the targets of rank (any with NoRank) whose endpoint is not
// ejected; if none, every target of rank, since health never fails a request closed.
func (p *poolState) eligibleTargets(rank int, ejected map[uint64]bool) []int {
	ts := p.targets.Targets
	eligible := p.viewEligible[:0]
	for i := range ts {
		if (rank == NoRank || ts[i].Rank == rank) && !ejected[ts[i].EndpointFP] {
			eligible = append(eligible, i)
		}
	}
	if len(eligible) == 0 {
		for i := range ts {
			if rank == NoRank || ts[i].Rank == rank {
				eligible = append(eligible, i)
			}
		}
	}
	return eligible
}

// engineReadMS is how often a VM re-reads the engine board.
const engineReadMS = 100

// addEngineLoad applies engine-reported load: while a target's engine figures are fresh,
// its load is the larger of the ledger's and the engine's running + waiting requests.
// Engines report requests, not tokens; the extra requests are counted at the tokens per
// request of the ledger's own (the target's, else the pool's), so the token-based cost
// sees them too. Unless prefix.target_cache_tokens is set, a cache size the engine
// reports is the target's cache until its first chunks have taught a smaller one. A
// board that cannot be read leaves the ledger's figures.
func (r *Router) addEngineLoad(p *poolState, v *poolView, nowMS int64) {
	r.readEngine(p, nowMS)
	if len(p.engineFigures) == 0 {
		return
	}
	ts := p.targets.Targets
	if r.cfg.Prefix.TargetCacheTokens <= 0 {
		for i := range ts {
			if f, ok := p.engineFigures[ts[i].ID]; ok && f.CacheTokens >= 1 {
				v.loads[i].Cache = v.loads[i].CacheOr(int64(f.CacheTokens))
			}
		}
	}
	var poolReq, poolTok int64
	for _, i := range v.eligible {
		poolReq += v.loads[i].Requests
		poolTok += v.loads[i].Tokens
	}
	for _, i := range v.eligible {
		f, ok := p.engineFigures[ts[i].ID]
		if !ok {
			continue
		}
		engine := int64(math.Round(f.Running + f.Waiting))
		l := &v.loads[i]
		if engine <= l.Requests {
			continue
		}
		perRequest := int64(0)
		switch {
		case l.Requests > 0:
			perRequest = l.Tokens / l.Requests
		case poolReq > 0:
			perRequest = poolTok / poolReq
		}
		l.Tokens += (engine - l.Requests) * perRequest
		l.Requests = engine
	}
}

// readEngine re-reads the engine board into p.engineFigures once the last read is
// engineReadMS old, or the clock went back. A board that cannot be read leaves no
// figures.
func (r *Router) readEngine(p *poolState, nowMS int64) {
	if nowMS-p.engineReadAt >= engineReadMS || nowMS < p.engineReadAt {
		if err := p.engine.ReadInto(p.engineFigures, nowMS, r.cfg.EngineMetrics.StaleMS); err != nil {
			clear(p.engineFigures)
		}
		p.engineReadAt = nowMS
	}
}

// PublishEngineFigures stores a scrape of one endpoint: figures per DP rank, numbered
// as its targets are (ParseEngineMetrics's keys).
func (r *Router) PublishEngineFigures(prefill bool, address string, byRank map[int]engine.EngineFigures) error {
	p := r.decode
	if prefill {
		p = r.prefill
	}
	if p.engine == nil {
		return nil
	}
	figures := make(map[uint64]engine.EngineFigures, len(byRank))
	for rank, f := range byRank {
		id := TargetID(address, rank)
		if p.targets.Index(id) >= 0 {
			figures[id] = f
		}
	}
	err := p.engine.Publish(r.now(), figures)
	p.engineReadAt = -engineReadMS // read our own scrape back at the next decision
	return err
}

// slotsFullRunning is the fewest requests past their first chunk at which a target that
// has stalled (Load.Stalled) is taken to be out of running slots. Such an engine starts
// a request only when another ends, so a request sent there waits for every one queued
// before it to get a slot, whatever it caches there; a cap above the fair share lets
// the targets that cache the busiest prompts fill up while others idle. Engines run
// more slots than this, and a target running fewer has stalled on a prefill that took
// longer than its rate says (a copy gone from its cache, a longer prompt), which
// spreading the pool's requests does not help. It is Load.OutOfSlots's floor too: under
// it, requests without a first chunk are more likely replies that are not streamed, or
// short prompts an engine step makes late, than requests waiting for a slot.
// BENCHMARKS.md has the replays behind it.
const slotsFullRunning = 16

// minPaceMS is the prefill time a target's own rate must have been observed over
// before its recent work is counted at it (spreadLoad): a few first chunks misjudge
// it.
const minPaceMS = 1000

// slotsMemoryMS is how long a target's running slots, once seen out of them
// (Load.FullRunning), count for decisions after it was last recorded so (at least
// every eighth of it while it is seen). An engine's slot count is its configuration
// (max_num_seqs, max_running_requests), so it holds while the engine runs; the limit
// lets a count misread, or an engine restarted with more slots, be forgotten.
const slotsMemoryMS = 10 * 60 * 1000

// runningSlots is the most requests an eligible target out of running slots runs
// (slots, 0: none is), and the most of those and of the sightings kept
// (Load.SlotsSeen; seen, 0: none). It records each target out of slots in the
// ledger, when its count changed or its sighting is an eighth of slotsMemoryMS old.
func (v *poolView) runningSlots() (slots, seen int64) {
	ts := v.pool.targets.Targets
	most := int64(0)
	for i := range v.loads {
		most = max(most, v.loads[i].Requests-v.loads[i].Prefills)
	}
	for _, i := range v.eligible {
		l := &v.loads[i]
		if !v.outOfSlots(i, most) {
			seen = max(seen, l.SlotsSeen(v.nowMS))
			continue
		}
		running := l.Requests - l.Prefills
		slots = max(slots, running)
		if running != l.FullRunning || v.nowMS-l.FullAt >= slotsMemoryMS/8 {
			// A failed write stays in the batch for the next flush.
			_ = v.pool.ledger.SeenFull(ts[i].ID, running, v.nowMS)
		}
	}
	return slots, max(seen, slots)
}

// outOfSlots is Load.OutOfSlots for target i, and no target of the pool runs more
// requests past their first chunk than it (most: over every target, eligible or not,
// so that a request confined to one rank judges it as any other would). Engines of one
// pool are alike: one that runs fewer than another is not at its slot count, and its
// late requests are prompts that took longer than its rate says. Taken for a sighting,
// such a count would charge every target running as many the wait for a slot that is
// free.
func (v *poolView) outOfSlots(i int, most int64) bool {
	l := &v.loads[i]
	return l.Requests-l.Prefills >= most && l.OutOfSlots(v.ahead[i])
}

// slotWait estimates how long a request waits for a running slot on a target that runs
// all of its slots, in tokens of prefill at the pool's rate: the time between two
// requests' ends there. By Little's law a request stays in the pool its in-flight
// requests over the rate they are sent, which the recent sends give over their
// window (sendsWindow); on a target of slots running ones, one ends every slots-th of
// that. Both counts are the ledger's own: what an engine reports may include requests
// other gateways sent, which the recent sends do not count.
func (v *poolView) slotWait(slots int64) float64 {
	if v.total.RecentSent <= 0 || v.rate <= 0 || slots <= 0 {
		return 0
	}
	stay := float64(v.sentInFlight*countUnit) * sendsWindow(v.pool.sendsFromMS, v.nowMS) / float64(v.total.RecentSent)
	return stay / float64(slots) * v.rate
}

// sendsWindow is the time, in ms, over which recent work sent at a steady rate since
// fromMS counts in full at nowMS: halved at every recentHalfLifeMS boundary, it is
// that rate times this. Long after fromMS, it is a half-life and the time since the
// last halving; in a pool's first half-life, only the time since its sends began,
// which the steady-state figure would overstate many times.
func sendsWindow(fromMS, nowMS int64) float64 {
	if fromMS >= nowMS {
		return 1
	}
	return halvedSpan(fromMS, nowMS, recentHalfLifeShift)
}

// halvedSpan is the ms from fromMS to nowMS as a sum that halves at every multiple of
// 2^shift ms holds them at nowMS: each ms counts half for every multiple passed since.
func halvedSpan(fromMS, nowMS int64, shift uint) float64 {
	if fromMS >= nowMS {
		return 0
	}
	epoch, first := nowMS>>shift, fromMS>>shift
	if epoch == first {
		return float64(nowMS - fromMS)
	}
	// This epoch's part in full, each whole epoch between halved once more than the
	// one after it, and the first epoch's part halved as often as epochs have passed.
	k := int(min(epoch-first, 62))
	firstPart := float64((first+1)<<shift - fromMS)
	return float64(nowMS-epoch<<shift) + math.Ldexp(1, int(shift))*(1-math.Ldexp(1, 1-k)) + math.Ldexp(firstPart, -k)
}

// maxSlotWait bounds a target's slot wait, in tokens, so that an estimate from a
// handful of requests, which may be far off, cannot wrap the wait it is added to.
const maxSlotWait = 1 << 40

// fairShareCap is the fair-share cap: max(1, ceil(m × ceil((active+1)/n))).
func fairShareCap(multiplier float64, active int64, n int) int64 {
	if n < 1 {
		n = 1
	}
	share := (active + 1 + int64(n) - 1) / int64(n)
	c := int64(math.Ceil(multiplier * float64(share)))
	if c < 1 {
		c = 1
	}
	return c
}

func (v *poolView) atCap(i int) bool { return v.loads[i].Requests >= v.cap }

// overCap is the wait a soft cap charges on target i: perRequest for each request it
// has from one below the cap up (0 below the cap).
func (v *poolView) overCap(i int) int64 {
	if over := v.loads[i].Requests - v.cap + 1; over > 0 {
		return over * v.perRequest
	}
	return 0
}

// position returns the index of target id if it is eligible, else -1.
func (v *poolView) position(id uint64) int {
	i := v.pool.targets.Index(id)
	if i < 0 {
		return -1
	}
	for _, e := range v.eligible {
		if e == i {
			return i
		}
	}
	return -1
}

// candidates are the eligible targets under the cap, or every eligible target when
// all are at it (capped reports that case: then the least loaded wins).
func (v *poolView) candidates() (out []int, capped bool) {
	if v.busiest < v.cap { // none at the cap: every eligible target, without the loop
		return v.eligible, false
	}
	out = v.pool.candBuf[:0]
	for _, i := range v.eligible {
		if !v.atCap(i) {
			out = append(out, i)
		}
	}
	if len(out) == 0 {
		return v.eligible, true
	}
	return out, false
}

func (r *Router) loadOf(l Load) int64 {
	if r.cfg.Balance.LoadMetric == config.LoadMetricTokens {
		return l.Tokens
	}
	return l.Requests
}

// cheapest applies the cost (docs/behaviour.md, The cost) with matched tokens per
// target index (nil: no match anywhere). The cost estimates, in prefill tokens (time
// at the pool's prefill rate), how long the request would wait for its first token
// on a target:
//
//	cost(t) = pace(t) × (prefill_ahead(t) + (6 + prefills(t)) × (request_tokens − matched(t)))
//	        + slot_wait(t)
//	        + load_weight × active_tokens(t) / max(total_active_tokens, request_tokens) × request_tokens
//
// pace(t) is the time t takes over a prefill token against the pool's (requestPace):
// on engines of mixed speeds a prompt goes where its prefill ends soonest.
// prefill_ahead(t) is what is estimated left of the uncached tokens of the requests
// sent to t whose first response chunk has not come back (Load.PrefillAhead): their
// prefill is queued or running, ahead of this one. slot_wait(t) is the wait for a
// running slot on a target at the slot count seen (poolView.slotCharge).
// request_tokens − matched(t) is this request's own prefill there, weighted by
// ownWeight plus prefills(t), the number of those requests: an engine batches the
// prefills it holds into the same steps, so each of them is delayed by the tokens this
// one computes (in an engine that prefills one prompt at a time the term still pays:
// long prompts keep off the targets where many short ones queue, so the short ones
// that follow there do not wait behind them). The last term is the decode load, which
// slows a prefill sharing the engine with it and holds the KV memory new requests
// need. While the request's prefix is in demand (copiesNeeded), a target without it
// counts the prefix's tokens once instead of (6 + prefills(t)) times. Ties go to fewer
// active tokens, then to a shuffle seeded by the request identity, so every VM and
// replica picks alike.
func (r *Router) cheapest(v *poolView, cands []int, req *extract.Request, matched []int) int {
	return r.cheapestFrom(v, cands, req, matched, -1, 0, 0)
}

// cheapestFrom is cheapest with stay added to the cost of home and leave to the cost
// of every other target.
func (r *Router) cheapestFrom(v *poolView, cands []int, req *extract.Request, matched []int, home int, stay, leave float64) int {
	if len(cands) == 0 {
		return -1
	}
	reqTokens := float64(req.Tokens)
	// math.Max of the three, written out: it is a call in wasm (as is max of floats),
	// and neither NaN nor -0 can occur here.
	denom := float64(v.total.Tokens)
	if reqTokens > denom {
		denom = reqTokens
	}
	if denom < 1 {
		denom = 1
	}
	w := r.cfg.Balance.LoadWeight
	best, bestCost := -1, 0.0
	ts := v.pool.targets.Targets
	// Weighing a copy, each candidate's prefill of this request also delays the
	// requests the target draws meanwhile beyond its share of the pool's recent sends
	// (a share in proportion to its prefill rate): they come back to it for what it
	// caches, and wait behind that prefill half its time on average. So a copy keeps
	// off the home of another prompt in demand.
	var drawnWait, sentPerSpeed float64
	if v.copyTokens > 0 && v.rate > 0 {
		drawnWait = 1 / (2 * countUnit * sendsWindow(v.pool.sendsFromMS, v.nowMS) * v.rate)
		speeds := 0.0
		for _, j := range v.eligible {
			speeds += v.speedOf(j)
		}
		sentPerSpeed = float64(v.total.RecentSent) / speeds
	}
	for _, i := range cands {
		m := 0.0
		if matched != nil {
			m = float64(matched[i])
		}
		l := &v.loads[i]
		prefill := float64(v.ahead[i]) + (ownWeight+float64(l.Prefills))*(reqTokens-m)
		if hot := float64(v.copyTokens); hot > m {
			prefill -= (ownWeight - 1) * (hot - m)
		}
		if pace := v.requestPace(i); pace != 1 {
			prefill *= pace
		}
		cost := prefill + float64(v.slotCharge(i)) + w*float64(l.Tokens)/denom*reqTokens
		if drawnWait > 0 {
			// A slower target takes longer over the prefill, and its share is smaller.
			speed := v.speedOf(i)
			own := (reqTokens - m) / speed
			cost += drawnWait * max(0, float64(l.RecentSent)-sentPerSpeed*speed) * own * own
		}
		if i == home {
			cost += stay
		} else {
			cost += leave
		}
		if best < 0 || cost < bestCost ||
			(cost == bestCost && tieBefore(req.Identity, &ts[i], v.loads[i], &ts[best], v.loads[best])) {
			best, bestCost = i, cost
		}
	}
	return best
}

// tieBefore orders two equally good targets: fewer active tokens first, then the
// request-seeded shuffle.
func tieBefore(identity uint64, a *Target, la Load, b *Target, lb Load) bool {
	if la.Tokens != lb.Tokens {
		return la.Tokens < lb.Tokens
	}
	return hashx.RendezvousScore(identity, a.ID) > hashx.RendezvousScore(identity, b.ID)
}

// leastLoaded returns the candidates with the lowest load by balance.load_metric.
func (r *Router) leastLoaded(v *poolView, cands []int) []int {
	var ties []int
	low := int64(math.MaxInt64)
	for _, i := range cands {
		l := r.loadOf(v.loads[i])
		switch {
		case l < low:
			low, ties = l, append(ties[:0], i)
		case l == low:
			ties = append(ties, i)
		}
	}
	return ties
}

// roundRobin picks from cands with the pool's shared cursor.
func (r *Router) roundRobin(p *poolState, cands []int) (int, error) {
	if len(cands) == 1 {
		return cands[0], nil
	}
	n, err := p.cursor.Next()
	if err != nil {
		return -1, err
	}
	return cands[n%uint64(len(cands))], nil
}

// rendezvous picks the candidate with the highest random weight for key.
func rendezvous(p *poolState, cands []int, key uint64) int {
	best, bestScore := -1, uint64(0)
	for _, i := range cands {
		s := hashx.RendezvousScore(key, p.targets.Targets[i].ID)
		if best < 0 || s > bestScore {
			best, bestScore = i, s
		}
	}
	return best
}

// prompt is the prefix view of one request: its checkpoints and matches.
type prompt struct {
	hashed   *prefix.Prompt // its checkpoints (none without prefix matching) and blocks
	matched  []int          // matched blocks per target index of the pool; nil until looked up
	search   *prefix.PrefixSearch
	complete bool // matched has every target's match, not only the deepest
}

// Decide routes one request: a decode target and, when disaggregation classifies
// it so, a prefill target. rank is a trusted client DP rank, or NoRank; it is in the
// rank header's numbering (a target's Rank), and one no target has is ignored. It
// never fails: when shared state does, it decides without it (decision fallback).
func (r *Router) Decide(req *extract.Request, rank int) Decision {
	var d Decision
	r.DecideInto(&d, req, rank)
	return d
}

// DecideInto is Decide writing into d, which must be zero (a new request's). The
// decision is written in place, field by field: in wasm a struct of more than 16
// bytes is copied, and one of more than 32 zeroed, by a call to the host (wazero
// fills by doubling copies), and passing a decision by value takes dozens.
func (r *Router) DecideInto(d *Decision, req *extract.Request, rank int) {
	nowMS := r.now()
	if r.decode.disc != nil || r.prefill.disc != nil { // static pools: spare the call
		r.applyDiscovered()
	}
	if len(r.decode.targets.Targets) == 0 {
		d.Kind = KindFallback // no endpoint: Envoy's own balancing picks
		return
	}
	// Estimates come from client-controlled sizes: bound them so ledger sums can't wrap.
	req.Tokens = max(0, min(req.Tokens, MaxRequestTokens))
	if rank != NoRank && !r.rankExists(r.decode, rank) {
		rank = NoRank
	}
	blockBytes := req.BlockBytes
	if !r.cfg.Prefix.Enabled {
		blockBytes = 0 // no checkpoints
	}
	r.hashed.Hash(req.Model, req.Prompt, blockBytes)
	pr := &r.prompt // a VM decides one request at a time
	pr.hashed, pr.matched, pr.search, pr.complete = &r.hashed, nil, nil, false
	kind, matched, failed, err := r.choose(r.decode, req, pr, rank, nowMS, &d.Target, &d.Ticket)
	if err != nil {
		*d = r.fallback(r.decode, req, rank)
	} else {
		d.Kind, d.StateFailed, d.MatchedTokens = kind, failed, matched
	}
	if r.cfg.Disaggregation.Mode == config.ModeOff {
		return
	}
	d.PD = PDDirect
	if len(r.prefill.targets.Targets) == 0 || !r.disaggregate(req, d) {
		return
	}
	_, matched, failed, err = r.choose(r.prefill, req, &prompt{hashed: &r.hashed}, NoRank, nowMS,
		&d.Prefill, &d.PrefillTicket)
	if err != nil {
		// No prefill state: still disaggregate, on a stateless choice.
		d.Prefill, matched, failed = r.fallback(r.prefill, req, NoRank).Target, 0, true
	}
	d.PD, d.MatchedTokens = PDDisaggregated, matched
	// The decode target's first chunk then times the prefill target's work and the
	// KV transfer, not whether its own copy was there, nor whether it waited for a
	// running slot.
	d.Ticket.Cached, d.Ticket.DueMS = 0, 0
	d.StateFailed = d.StateFailed || failed
}

// disaggregate classifies a request for P/D: at least threshold_tokens estimated prompt
// tokens, and with uncached_only at least that many not already cached on the decode
// target.
func (r *Router) disaggregate(req *extract.Request, d *Decision) bool {
	threshold := r.cfg.Disaggregation.ThresholdTokens
	if req.Tokens < threshold {
		return false
	}
	if !r.cfg.Disaggregation.UncachedOnly || threshold == 0 {
		return true
	}
	return req.Tokens-d.MatchedTokens >= threshold
}

// choose decides over one pool (docs/behaviour.md, The decision): place the request,
// record its prefix against the chosen target and add its load. It writes the target
// and the load ticket to target and ticket, and returns how it placed the request,
// the tokens of the request the target held before it was recorded there, and
// whether the prefix record or the load update failed. An error means shared state
// failed before a choice could be made (nothing is written).
func (r *Router) choose(p *poolState, req *extract.Request, pr *prompt, rank int, nowMS int64,
	target *Target, ticket *LoadTicket) (kind Kind, matched int, failed bool, err error) {
	v, err := r.view(p, rank, nowMS)
	if err != nil {
		return 0, 0, false, err
	}
	var choice int
	if req.HasConversation && r.cfg.Conversation.Enabled {
		if choice, kind, err = r.placeConversation(v, req, pr); err != nil {
			return 0, 0, false, err
		}
	} else {
		choice, kind = r.placeByPrefix(v, req, pr)
	}
	*target = p.targets.Targets[choice]
	id := target.ID
	uncached := int64(req.Tokens)
	age, head := int64(-1), 0
	if len(pr.hashed.Checkpoints) > 0 {
		matched = r.matchedOn(v, req, pr, choice)
		uncached -= min(int64(matched), uncached)
		bt := int64(max(1, r.cfg.Prefix.BlockTokens))
		if matched > 0 {
			age, head = r.copyAge(v, pr, choice, matched)
		}
		// Peers hear of a copy in use at least every eighth of the cache.
		refresh := uint32(min(v.loads[choice].CacheOr(r.cfg.Prefix.TargetCacheTokens)/bt, 1<<30)) / 8
		p.index.Record(pr.hashed.Checkpoints, id, uint32((v.loads[choice].Written+uncached)/bt), refresh)
	}
	since := v.loads[choice].SinceAfterSend(nowMS)
	err = p.ledger.acquireInto(ticket, id, int64(req.Tokens), uncached, since, nowMS)
	if l := &v.loads[choice]; uncached > 0 {
		// Its first chunk is due once what is queued ahead and its own prefill are
		// computed, at the target's rate, else its peers' (LoadLedger.FirstChunk).
		rate := v.rate
		if l.RateMS > 0 {
			rate = float64(l.RateTokens) / float64(l.RateMS)
		}
		if rate > 0 {
			ticket.DueMS = nowMS + int64(float64(v.ahead[choice]+uncached)/rate)
		}
	}
	if age >= 0 {
		// The first chunk judges the copy's tail past the head; the head counts in
		// its age, as the cache must hold it for the tail to be there.
		ticket.Cached, ticket.CacheAge = int64(matched-head), age+int64(head)
		ticket.CacheLimit = r.cacheLimit(p, id)
	}
	// An error leaves the load held in the batch all the same.
	return kind, matched, err != nil, nil
}

// cacheLimit is the most target id's cache holds, in tokens: prefix.target_cache_tokens,
// else the size its engine reports while fresh (0: unknown).
func (r *Router) cacheLimit(p *poolState, id uint64) int64 {
	if r.cfg.Prefix.TargetCacheTokens > 0 {
		return r.cfg.Prefix.TargetCacheTokens
	}
	if len(p.engineFigures) == 0 { // no engine metrics: spare the map's call
		return 0
	}
	if f, ok := p.engineFigures[id]; ok && f.CacheTokens >= 1 {
		return int64(f.CacheTokens)
	}
	return 0
}

// copyAge is how much target choice has written since it recorded the copy of the
// request's prefix that its match of matched tokens counts on, in tokens; -1 when
// that is not known (the match is a prefix taken to be held everywhere). head is the
// tokens of that match which a later record on the target vouches for
// (PrefixSearch.YoungerHead): their blocks were touched since, so they outlive the
// copy, and a first chunk can only tell whether the rest was there.
func (r *Router) copyAge(v *poolView, pr *prompt, choice, matched int) (age int64, head int) {
	if pr.search == nil {
		return -1, 0
	}
	bt := r.cfg.Prefix.BlockTokens
	t32 := prefix.PrefixTargetID(v.pool.targets.Targets[choice].ID)
	for _, m := range pr.search.Found() {
		if m.Target == t32 && min(m.Blocks*bt, matched) == matched {
			now := uint32(v.loads[choice].Written / int64(max(1, bt)))
			if now < m.Clock {
				return 0, 0 // recorded at a clock this view has not seen yet
			}
			age = int64(now-m.Clock) * int64(bt)
			// VMs hear of each other's records every eighth of the cache (choose):
			// a copy younger than that cannot be told from a head recorded later. A
			// head whose entry names as many holders as it can (CommonDepth) is
			// taken to be held, and kept fresh, everywhere, as lookup takes it.
			if cache := v.loads[choice].CacheOr(r.cfg.Prefix.TargetCacheTokens); cache > 0 && 8*age >= cache {
				head = min(max(pr.search.YoungerHead(t32, m.Blocks, m.Clock), pr.search.CommonDepth())*bt, matched)
			}
			return age, head
		}
	}
	return -1, 0
}

// matchedOn is the tokens of the request that target choice holds, looked up before
// the request is recorded against it. A placement that looked up no match (a sticky
// conversation, a round-robin first turn) or only the deepest one without choice in
// it pays for the full lookup here: the match it finds is also what disaggregation's
// uncached_only must see, not the request's own record.
func (r *Router) matchedOn(v *poolView, req *extract.Request, pr *prompt, choice int) int {
	if req.Tokens <= 0 {
		return 0
	}
	if pr.matched == nil || !pr.complete && pr.matched[choice] == 0 {
		r.lookup(v, pr)
		if pr.matched == nil {
			return 0
		}
	}
	return min(pr.matched[choice]*r.cfg.Prefix.BlockTokens, req.Tokens)
}

// lookup fills pr.matched from the pool's prefix index: every target's match.
func (r *Router) lookup(v *poolView, pr *prompt) {
	if pr.complete || len(pr.hashed.Checkpoints) == 0 {
		return
	}
	if pr.search == nil {
		r.lookupDeepest(v, pr)
	}
	for pr.search.Next() {
	}
	r.fillMatched(v.pool, pr)
	if common := pr.search.CommonDepth(); common > 0 {
		for _, i := range v.eligible {
			pr.matched[i] = max(pr.matched[i], common)
		}
	}
	pr.complete = true
}

// lookupDeepest fills pr.matched with the deepest match only (every target that
// holds it): enough to find a continuation, which the longest match wins.
func (r *Router) lookupDeepest(v *poolView, pr *prompt) {
	if pr.search != nil || len(pr.hashed.Checkpoints) == 0 {
		return
	}
	p := v.pool
	pr.search = p.index.StartPromptMatch(pr.hashed, p.known, p.clockOf)
	pr.search.Next()
	r.fillMatched(p, pr)
	pr.complete = pr.search.Done()
}

func (r *Router) fillMatched(p *poolState, pr *prompt) {
	pr.matched = p.matchedBuf // a VM decides one request at a time
	copy(pr.matched, p.zeroInts)
	for _, m := range pr.search.Found() {
		pr.matched[p.byID32.get(uint64(m.Target))] = m.Blocks
	}
}

// matchedTokens converts matched blocks into tokens for the cost, gated: when the
// best match rate over cands is not strictly above prefix.match_rate_threshold every
// match counts as 0 (nil).
func (r *Router) matchedTokens(v *poolView, req *extract.Request, pr *prompt, cands []int) []int {
	if pr.matched == nil || req.Tokens <= 0 {
		return nil
	}
	out := v.pool.tokensBuf
	copy(out, v.pool.zeroInts)
	best := 0
	for _, i := range cands {
		out[i] = min(pr.matched[i]*r.cfg.Prefix.BlockTokens, req.Tokens)
		best = max(best, out[i])
	}
	if float64(best)/float64(req.Tokens) <= r.cfg.Prefix.MatchRateThreshold {
		return nil
	}
	return out
}

// placeByPrefix places a request without an explicit id: implicit continuation, else
// the gated cost (pure load when nothing matched). A holder keeps a continuation
// outright when it is under the fair-share cap and what is queued there is no more
// than its cache is worth (queueFits), unless a holder as deep that keeps none
// outright costs less (cheapestHolder); otherwise it keeps it only if it is still the
// cheapest of the candidates and itself, its cost charged overCap: a prefix many
// requests share at once (a burst) is copied to other targets once its holder reaches
// the cap with them, instead of filling the running slots of one engine.
func (r *Router) placeByPrefix(v *poolView, req *extract.Request, pr *prompt) (int, Kind) {
	cands, capped := v.candidates()
	if capped {
		cands = r.leastLoaded(v, cands)
	}
	// The deepest match alone decides a continuation (the longest match wins); the
	// other targets' shorter matches are looked up only when there is none.
	r.lookupDeepest(v, pr)
	copying := r.copiesNeeded(v, req, pr)
	if copying {
		// No holder keeps it outright: each is weighed against a new copy.
		r.lookup(v, pr)
		cands = r.copyPlaces(v, cands, pr)
		if v.copyNow {
			if i, kind := r.placeCopy(v, req, pr, cands); i >= 0 {
				return i, kind
			}
		}
	} else {
		// The deepest checkpoint's holders include those that hold the prompt a little
		// further, to its last turn's end (PrefixSearch.Next): one of them left out at
		// the cap is weighed below, with what its cache saves.
		if i := r.continuation(v, req, pr, cands, true); i >= 0 && pr.matched[i] >= deepestAtCap(v, pr) {
			return r.cheapestHolder(v, req, pr, i), KindContinuation
		}
		r.lookup(v, pr)
	}
	h := r.continuation(v, req, pr, v.eligible, false)
	// A shorter match keeps the request outright only when no target holds more: a
	// deeper holder past the cap or with a longer queue is weighed below, with what
	// its cache saves.
	if !copying {
		if i := r.continuation(v, req, pr, cands, true); i >= 0 && (h < 0 || pr.matched[i] >= pr.matched[h]) {
			return r.cheapestHolder(v, req, pr, i), KindContinuation
		}
	}
	if h >= 0 {
		extra := !contains(cands, h)
		if extra {
			cands = append(cands, h)
		}
		matched := r.matchedTokens(v, req, pr, cands)
		if i := r.cheapestFrom(v, cands, req, matched, h, float64(v.overCap(h)), 0); i == h {
			return h, KindContinuation
		}
		if extra {
			cands = cands[:len(cands)-1]
		}
	}
	matched := r.matchedTokens(v, req, pr, cands)
	i := r.cheapest(v, cands, req, matched)
	if matched != nil && pr.matched[i] > 0 {
		return i, KindPrefix
	}
	return i, KindLoad
}

// cheapestHolder is i, a holder whose queue fits, or the cheapest of the holders as
// deep that keep no request outright, at the slot count seen or at the cap (charged
// overCap), where that costs less than i. A new holder's queue fits while it computes
// the prefix, as long as that takes, where the holders before it are only waiting for
// slots: without them, it would take every request on the prefix meanwhile.
func (r *Router) cheapestHolder(v *poolView, req *extract.Request, pr *prompt, i int) int {
	if v.ahead[i] == 0 || v.slotsSeen <= 0 && v.busiest < v.cap {
		return i
	}
	best := i
	for _, h := range v.eligible {
		if h == best || pr.matched[h] != pr.matched[i] || !v.atSlots(h) && !v.atCap(h) {
			continue
		}
		pair := [2]int{best, h}
		if r.cheapestFrom(v, pair[:], req, r.matchedTokens(v, req, pr, pair[:]), h, float64(v.overCap(h)), 0) == h {
			best = h
		}
	}
	return best
}

// deepestAtCap is the most blocks of the request's prompt found on an eligible target
// at the fair-share cap (0 with none at it): such a target is no candidate, and a
// shorter match elsewhere keeps the request outright only when it holds no more.
func deepestAtCap(v *poolView, pr *prompt) int {
	deepest := 0
	if v.busiest < v.cap {
		return 0
	}
	for _, i := range v.eligible {
		if v.atCap(i) {
			deepest = max(deepest, pr.matched[i])
		}
	}
	return deepest
}

// copiesNeeded reports whether the prefix of the request's deepest match is in
// demand: the tokens of their own that the prefix's other requests brought lately
// (Demand), at that pace, take more than copyLoad of its holders' time, or every
// holder has stalled (holdersStalled), or the requests queued for it on every holder
// wait longer than a copy takes (holdersQueued), or every holder's backlog for its
// running slots outlasts a copy (holdersBacklogged, which sets v.copyNow). Before
// the pool has shown a rate, only the queue counts, for a further holder while the
// pool has room for it (coldCopyFits). Then
// v.copyTokens is set to the prefix's tokens, which a target without them weighs as
// its user's wait alone, and the cost decides whether this request makes a copy (with
// v.copyNow, where among the places without the prefix: placeCopy).
func (r *Router) copiesNeeded(v *poolView, req *extract.Request, pr *prompt) bool {
	if pr.search == nil {
		return false
	}
	found := pr.search.Found() // the holders of the deepest checkpoint matched, or more
	if len(found) == 0 || len(found) >= maxCopies(len(v.eligible)) {
		return false
	}
	bt := r.cfg.Prefix.BlockTokens
	shared := pr.search.DeepestBlocks() * bt
	own := req.Tokens - shared
	if own <= 0 {
		return false
	}
	ownBlocks := (own + bt - 1) / bt
	demand, span := pr.search.Demand(v.nowMS, ownBlocks)
	if v.rate <= 0 {
		// A prefill pool never shows a rate (its first chunks come back on the decode
		// legs): its placement is left to the cost.
		if v.pool != r.prefill && coldCopyFits(v, pr, found, int64(shared)) &&
			holdersQueued(v, pr, int64(shared), bt) {
			v.copyTokens = shared
			return true
		}
		return false
	}
	// The holders' own rate: their first chunks time these requests' tokens from the
	// index's deepest checkpoint on, as own counts them.
	var rtok, rms int64
	for _, m := range found {
		if i := v.pool.byID32.get(uint64(m.Target)); i >= 0 {
			rtok += v.loads[i].RateTokens
			rms += v.loads[i].RateMS
		}
	}
	rate := v.rate
	if rms > 0 {
		rate = float64(rtok) / float64(rms)
	}
	// The tokens of their own the prefix's requests bring a ms of late; in requests
	// of this one's own blocks, what its holders are sent now.
	perMS := float64(demand*bt) / float64(max(span, minDemandSpanMS))
	if holdersBacklogged(v, pr, found, int64(shared), rate, perMS/float64(ownBlocks*bt)) {
		v.copyTokens, v.copyNow = shared, true
		return true
	}
	// Neither demand seen over the last seconds nor requests queued now say whether
	// the prefix is wanted as long as a longer copy takes to make, and a longer copy
	// delays more of what its target is sent meanwhile.
	if float64(shared)/rate > 2*prefix.HeatWindowMS {
		return false
	}
	if perMS/rate <= copyLoad*float64(len(found)) && !holdersStalled(v, found) &&
		!holdersQueued(v, pr, int64(shared), bt) {
		return false
	}
	v.copyTokens = shared
	return true
}

// coldCopyFits reports whether a pool that has returned no first chunk yet (no rate)
// has room for a further copy of a prefix of prefixTokens held by found: with it, the
// prefix's holders would be at most half of the eligible targets, up to as many as a
// prefix may have (maxCopies), that other prompts' queued prefill leaves it. Until a
// first chunk comes back, every prompt sent is still queued, the prefix's first
// computation too, so a request for it waits about as long on a holder as on a copy,
// while a copy made later, once the holders have drained, costs its request the whole
// prefix; and no demand can be timed yet. Nor is it known yet how fast each target
// computes or how many requests it runs at once: the requests that queue behind one
// first computation all start when it ends, and a target slower than the rest, or one
// with fewer running slots than they are, keeps them all waiting. Spread over several
// holders they wait on whichever is done first, a few on each. But the pool's first
// seconds also bring other prompts' first computations, which want idle targets: each
// prefix takes at most half of what the others leave, and the rest stays idle for
// prompts to come. Rounded up while no other prompt has taken an idle target since the
// prefix's first computation began (each target's Since is when it took its first
// prompt, as no first chunk has come back yet): none comes as often as its requests,
// and an odd target kept idle for one would wait idle while they queue.
func coldCopyFits(v *poolView, pr *prompt, found []prefix.PrefixMatch, prefixTokens int64) bool {
	// A holder's queue is at least the prefix while it computes it (holdersQueued
	// asks more): the cheap test first, as it fails on nearly every request.
	if i := v.pool.byID32.get(uint64(found[0].Target)); i < 0 || v.ahead[i] < prefixTokens {
		return false
	}
	var holders, busy int
	started := int64(math.MaxInt64) // when the prefix's first holder took it
	for _, m := range found {
		// A holder that is not eligible has no queue in the view (holdersQueued
		// then makes no copy).
		i := v.pool.byID32.get(uint64(m.Target))
		if i < 0 || len(v.eligible) < len(v.loads) && !contains(v.eligible, i) {
			return false
		}
		if v.ahead[i] > 0 {
			holders++
			started = min(started, v.loads[i].Since)
		}
	}
	later := false // another prompt has taken an idle target since
	for _, i := range v.eligible {
		if v.ahead[i] > 0 {
			busy++
			later = later || pr.matched[i] == 0 && v.loads[i].Since > started
		}
	}
	// A copy goes only to the places copyPlaces allows: in a pool of more targets the
	// room is theirs, not the pool's.
	room := min(len(v.eligible), maxCopies(len(v.eligible))) - (busy - holders)
	if !later {
		room++ // half of it, rounded up
	}
	return 2*(holders+1) <= room
}

// holdersStalled reports whether every holder of the prefix has stalled
// (Load.Stalled): its requests then wait there for running slots, however little
// prefill they bring, and a copy elsewhere is weighed as for a prefix in demand.
func holdersStalled(v *poolView, found []prefix.PrefixMatch) bool {
	for _, m := range found {
		i := v.pool.byID32.get(uint64(m.Target))
		if i < 0 || !v.loads[i].Stalled(v.nowMS) {
			return false
		}
	}
	return true
}

// addDecodeTime adds to the pool's decode time the ms since the last view at the
// count of requests past their first chunk it saw, halved as the stays are, and
// takes the count loads show now: this gateway's requests alone, as the stays are,
// before the engines' own counts are added.
func (p *poolState) addDecodeTime(loads []Load, nowMS int64) {
	var decoding int64
	for i := range loads {
		l := &loads[i]
		decoding += l.Requests - l.Prefills
	}
	decoding = max(0, decoding)
	if p.viewed && nowMS > p.decodeAt {
		epoch := nowMS >> stayHalfLifeShift
		p.decodeTime = math.Ldexp(p.decodeTime, -int(min(epoch-p.decodeEpoch, 62))) +
			float64(p.decoding)*halvedSpan(p.decodeAt, nowMS, stayHalfLifeShift)
		p.decodeEpoch = epoch
	}
	p.decoding, p.decodeAt = decoding, nowMS
}

// meanStay is the pool's recent decode stay in ms (0: no reply has ended lately).
// Two figures bound it while replies that began together run: the mean of those that
// ended is short, as the short ones end first, and the decode time over the ends
// (Little's law) is long, as few have had time to end. In a steady state both are
// the mean; in between, their geometric mean, never below the ends' own.
func (v *poolView) meanStay() float64 {
	var stayMS, stays int64
	for i := range v.loads {
		stayMS += v.loads[i].StayMS
		stays += v.loads[i].Stays
	}
	if stays <= 0 || stayMS <= 0 {
		return 0
	}
	ends := float64(stays) / countUnit
	ended := float64(stayMS) / ends
	return math.Sqrt(ended * max(ended, v.pool.decodeTime/ends))
}

// holdersBacklogged reports whether every holder of the prefix runs all its running
// slots (the count seen) with more requests waiting for one than its slots free
// before a copy of the prefix could be made elsewhere. Its slots free as requests
// end: the count seen over the pool's recent decode stay (meanStay) a ms, less the
// requests the holder is sent a ms (its recent sends over their window, or its share
// of the prefix's arriving a ms), which take the slots as they free. A copy takes the
// prefix's tokens and what waits least ahead of them on an eligible target without
// the prefix, at the holders' rate. The backlog then outlasts a copy, and the copy
// serves the prefix's requests from then on; a new copy, far from its slots, calls
// for no other.
func holdersBacklogged(v *poolView, pr *prompt, found []prefix.PrefixMatch, prefixTokens int64, rate, arriving float64) bool {
	if v.slotsSeen <= 0 || v.total.RecentSent <= 0 || rate <= 0 {
		return false
	}
	least := int64(math.MaxInt64)
	for _, i := range v.eligible {
		if pr.matched[i] == 0 {
			least = min(least, v.ahead[i]+v.slotCharge(i))
		}
	}
	stay := v.meanStay()
	if stay <= 0 || least == math.MaxInt64 {
		return false
	}
	window := sendsWindow(v.pool.sendsFromMS, v.nowMS)
	frees := float64(v.slotsSeen) / stay
	copyMS := float64(prefixTokens+least) / rate
	for _, m := range found {
		i := v.pool.byID32.get(uint64(m.Target))
		if i < 0 || len(v.eligible) < len(v.loads) && !contains(v.eligible, i) {
			return false
		}
		backlog := v.loads[i].Requests - v.slotsSeen
		if backlog <= 0 {
			return false
		}
		// Sends over the last minute or so understate a new prefix's: a backlog of
		// half the slots or more is taken to be sent at least its share of the
		// prefix's requests now. A shorter one clears within a fraction of a stay,
		// and a burst's first seconds would make copies done only as it ends.
		sent := float64(v.loads[i].RecentSent) / countUnit / window
		if 2*backlog >= v.slotsSeen {
			sent = max(sent, arriving/float64(len(found)))
		}
		if spare := frees - sent; spare > 0 && float64(backlog) <= spare*copyMS {
			return false
		}
	}
	return true
}

// placeCopy places a request whose prefix's holders are backlogged at their slots
// (holdersBacklogged) on the cheapest of cands that holds less than the prefix, where
// its copy is made (-1 with none).
func (r *Router) placeCopy(v *poolView, req *extract.Request, pr *prompt, cands []int) (int, Kind) {
	bt := r.cfg.Prefix.BlockTokens
	out := v.pool.newCopyBuf[:0]
	for _, i := range cands {
		if pr.matched[i]*bt < v.copyTokens {
			out = append(out, i)
		}
	}
	v.pool.newCopyBuf = out
	if len(out) == 0 {
		return -1, 0
	}
	matched := r.matchedTokens(v, req, pr, out)
	i := r.cheapest(v, out, req, matched)
	if matched != nil && pr.matched[i] > 0 {
		return i, KindPrefix
	}
	return i, KindLoad
}

// holdersQueued reports whether the requests already queued for the prefix on every
// holder wait longer than computing it elsewhere takes: what is queued there up to the
// last request that recorded the prefix (which computed it, or used it), still
// without its first chunk, is at least the prefix's tokens more than the least queued
// eligible target without the prefix has. A copy computed there would have come
// sooner for them (the cost then weighs the places a copy may go), and the requests
// that share the prefix get a second place to go. Only while the pool's mean queue is
// at most the prefix's tokens: the copy's time is then time the pool has to spare,
// where in a backlogged pool it is taken from other requests. A holder busy with
// other prompts sent after the prefix's last request does not count: that wait is
// not the prefix's, and the cost spreads it; nor, as a rule, does a conversation's
// next turn, whose deepest checkpoint is its own history and whose turn before has
// been answered. A record another VM made carries the clock this VM saw when it
// synced, so the test is exact only for this VM's own records.
func holdersQueued(v *poolView, pr *prompt, prefixTokens int64, bt int) bool {
	least, poolQueued := int64(math.MaxInt64), int64(0)
	for _, i := range v.eligible {
		poolQueued += v.ahead[i]
		if pr.matched[i] == 0 {
			least = min(least, v.ahead[i])
		}
	}
	if least == math.MaxInt64 || poolQueued > prefixTokens*int64(len(v.eligible)) {
		return false // every target holds it, or the pool has no time to spare
	}
	for _, m := range pr.search.Found() {
		i := v.pool.byID32.get(uint64(m.Target))
		// A holder that is not eligible (ejected, another rank) has no queue in the
		// view, and takes no request.
		if i < 0 || len(v.eligible) < len(v.loads) && !contains(v.eligible, i) {
			return false
		}
		// The tokens sent to the holder since the prefix's last record there, to
		// the block the clock counts in, are queued after that request, if at all
		// (an age past 2^31 blocks is a record newer than the view's clock).
		after := int64(0)
		if age := uint32(v.loads[i].Written/int64(max(1, bt))) - m.Clock; age < 1<<31 {
			after = (int64(age) + 1) * int64(bt)
		}
		if v.ahead[i]-after < prefixTokens+least {
			return false
		}
	}
	return true
}

// copyPlaces narrows cands for a prefix in demand to its holders and the targets
// where its copies go: the maxCopies eligible targets its hash ranks first
// (rendezvous). Every VM and gateway replica copies a prefix onto the same
// few targets, whatever load each of them sees, so their copies do not multiply.
func (r *Router) copyPlaces(v *poolView, cands []int, pr *prompt) []int {
	p := v.pool
	key := pr.search.DeepestHash()
	// The rendezvous scores of the eligible targets; the places are those with one
	// of the maxCopies highest.
	var scores [prefix.TargetsPerEntry]uint64
	top := scores[:maxCopies(len(v.eligible))]
	for _, i := range v.eligible {
		s := hashx.RendezvousScore(key, p.targets.Targets[i].ID)
		for k := range top {
			if s > top[k] {
				copy(top[k+1:], top[k:len(top)-1])
				top[k] = s
				break
			}
		}
	}
	least := top[len(top)-1]
	out := p.copyBuf[:0]
	for _, i := range cands {
		if pr.matched[i]*r.cfg.Prefix.BlockTokens >= v.copyTokens ||
			hashx.RendezvousScore(key, p.targets.Targets[i].ID) >= least {
			out = append(out, i)
		}
	}
	if len(out) == 0 {
		return cands // every place is at the cap: the cap's own choice
	}
	p.copyBuf = out
	return out
}

// maxCopies is the most holders copies by demand give a prefix in a pool of n
// eligible targets: as many as its index entry names, or one fewer in a pool more
// than twice that size. A full entry counts the prefix as held on every target, and in
// such a pool a burst's holders reach the fair-share cap (twice the mean share), so the
// burst would then spread over the whole pool, each target computing the prefix.
func maxCopies(n int) int {
	if n > 2*prefix.TargetsPerEntry {
		return prefix.TargetsPerEntry - 1
	}
	return prefix.TargetsPerEntry
}

// copyLoad is the share of its holders' time a prefix's demand takes before a copy
// is weighed at its user's wait alone: less, and a copy would serve too few of its
// requests to be worth the cache it evicts. minDemandSpanMS is the least time demand
// is counted over, so that requests a moment apart are not taken for a flood.
const (
	copyLoad        = 0.2
	minDemandSpanMS = 256
)

// queueFits reports whether the prefill queued on target i is no more than what the
// request's cache there is worth (ownWeight × its cached tokens): then waiting there
// costs less than computing the whole prompt on an idle target, and affinity needs no
// weighing. Never at the slot count seen (atSlots): the test takes leaving to
// compute all the target caches again, which overstates it when others hold much of
// it (a shared system prompt). A queued prefill drains within a prefill's time, so
// that costs little; a wait for a slot is a share of whole requests' stays and grows
// with each request kept there, so there the cost decides, which counts what each
// other target holds.
func (r *Router) queueFits(v *poolView, req *extract.Request, pr *prompt, i int) bool {
	if v.atSlots(i) {
		return false
	}
	return r.waitFits(v, req, pr, i, v.ahead[i])
}

// waitFits is queueFits for a wait of q tokens on target i.
func (r *Router) waitFits(v *poolView, req *extract.Request, pr *prompt, i int, q int64) bool {
	if q == 0 {
		return true
	}
	if pr.matched == nil {
		return false
	}
	cached := min(int64(pr.matched[i])*int64(r.cfg.Prefix.BlockTokens), int64(req.Tokens))
	return float64(q) <= ownWeight*float64(cached)
}

// ownWeight is what a token of this request's own prefill costs against a token
// queued ahead of it. The request waits for its own prefill once; what it computes
// also delays the requests that queue behind it, and what it recomputes away from
// the target that caches it is written to a second cache, evicting other prompts'
// prefixes there, while the first copy goes unused. BENCHMARKS.md has the replays
// behind the value.
const ownWeight = 6.0

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// continuation finds a candidate holding at least continuation_threshold of the
// request's blocks (leaving out the first skip_blocks on both sides): the longest
// match wins, then the lower cost. -1 if none.
// With fitting, only holders whose queued prefill fits (queueFits) qualify.
func (r *Router) continuation(v *poolView, req *extract.Request, pr *prompt, cands []int, fitting bool) int {
	skip := r.cfg.Prefix.SkipBlocks
	if pr.matched == nil || pr.hashed.Blocks <= skip {
		return -1
	}
	need := r.cfg.Prefix.ContinuationThreshold * float64(pr.hashed.Blocks-skip)
	longest := 0
	var qualified []int
	for _, i := range cands {
		m := pr.matched[i]
		if m <= skip || float64(m-skip) < need || fitting && !r.queueFits(v, req, pr, i) {
			continue
		}
		switch {
		case m > longest:
			longest, qualified = m, append(qualified[:0], i)
		case m == longest:
			qualified = append(qualified, i)
		}
	}
	if len(qualified) == 0 {
		return -1
	}
	return r.cheapest(v, qualified, req, r.matchedTokens(v, req, pr, qualified))
}

// placeConversation places a request with an explicit conversation id: sticky,
// overflow or new-conversation.
func (r *Router) placeConversation(v *poolView, req *extract.Request, pr *prompt) (int, Kind, error) {
	mapped, found, err := v.pool.conv.Lookup(req.Conversation)
	if err != nil {
		return -1, 0, err
	}
	if found {
		if i := v.position(mapped); i >= 0 {
			// The wait there: the prefill queued, and for a running slot.
			wait := v.ahead[i] + v.slotCharge(i)
			if !v.atCap(i) && (wait == 0 || len(pr.hashed.Checkpoints) == 0) {
				// Without a prompt to look up, nothing says the wait costs more
				// than the history cached there.
				return i, KindSticky, nil
			}
			// The cap is soft for a turn whose history can be looked up: at or
			// over it, the target's wait is charged overCap too, and the turn stays
			// while that wait is no more than its cache there is worth; at the slot
			// count (queueFits says why), or with none of the history cached there
			// that no other target caches (holdsHistory), the cost decides.
			if len(pr.hashed.Checkpoints) > 0 {
				r.lookup(v, pr)
				if !v.atSlots(i) && holdsHistory(v, pr, i) && r.waitFits(v, req, pr, i, wait+v.overCap(i)) {
					return i, KindSticky, nil
				}
			}
			// With more to wait for there than its cache is worth, or at the cap
			// with no prompt to weigh, the mapped target keeps the turn only if it
			// is still the cheapest.
			if c := r.scoredFrom(v, req, pr, i); c != i {
				return c, KindOverflow, nil
			}
			return i, KindSticky, nil
		}
	}
	choice, err := r.firstTurn(v, req, pr)
	if err != nil {
		return -1, 0, err
	}
	if err := v.pool.conv.Record(req.Conversation, v.pool.targets.Targets[choice].ID); err != nil {
		return -1, 0, err
	}
	return choice, KindNewConversation, nil
}

// scored is the gated cost over the candidates.
func (r *Router) scored(v *poolView, req *extract.Request, pr *prompt) int {
	cands, capped := v.candidates()
	if capped {
		cands = r.leastLoaded(v, cands)
	}
	r.lookup(v, pr)
	return r.cheapest(v, cands, req, r.matchedTokens(v, req, pr, cands))
}

// holdsHistory reports whether a conversation's mapped target home caches more of
// the looked-up prompt than every other eligible target: some of the conversation's
// history that no other target has. Otherwise keeping the turn there saves nothing
// over another target, and home's copy of the history is gone (its cache turned over
// since the last turn, or an overflow took that turn and its history elsewhere): the
// copy this turn would write there is likely gone by the next, so leaving is not
// charged for it either.
func holdsHistory(v *poolView, pr *prompt, home int) bool {
	for _, i := range v.eligible {
		if i != home && pr.matched[i] >= pr.matched[home] {
			return false
		}
	}
	return true
}

// scoredFrom weighs a conversation's mapped target home against the candidates.
// The mapping outlives an overflow, so a turn placed elsewhere leaves its own uncached
// tokens off home's copy of the history, and the next turn, back on home, computes
// them again: leaving costs that prefill on top of this one's, while home holds some
// of the history (holdsHistory). Without a prompt to look up nothing is known of the
// history, and leaving costs nothing more.
func (r *Router) scoredFrom(v *poolView, req *extract.Request, pr *prompt, home int) int {
	cands, capped := v.candidates()
	if capped {
		cands = r.leastLoaded(v, cands)
	}
	if !contains(cands, home) {
		cands = append(cands, home)
	}
	r.lookup(v, pr)
	matched := r.matchedTokens(v, req, pr, cands)
	m := 0
	if matched != nil {
		m = matched[home]
	}
	leave := 0.0
	if len(pr.hashed.Checkpoints) > 0 && holdsHistory(v, pr, home) {
		leave = ownWeight * float64(max(0, req.Tokens-m))
	}
	return r.cheapestFrom(v, cands, req, matched, home, 0, leave)
}

// firstTurn places a new conversation by conversation.first_turn.
func (r *Router) firstTurn(v *poolView, req *extract.Request, pr *prompt) (int, error) {
	switch r.cfg.Conversation.FirstTurn {
	case config.FirstTurnLeastLoaded, config.FirstTurnHash:
		cands, capped := v.candidates()
		if capped {
			cands = r.leastLoaded(v, cands)
		}
		if r.cfg.Conversation.FirstTurn == config.FirstTurnHash {
			return rendezvous(v.pool, cands, req.Conversation), nil
		}
		return r.roundRobin(v.pool, r.leastLoaded(v, cands))
	case config.FirstTurnScore:
		return r.scored(v, req, pr), nil
	default:
		return r.roundRobin(v.pool, r.soonest(v, req, pr))
	}
}

// soonest narrows a round-robin first turn to the eligible targets where its first
// token would come soonest, and of those to the ones whose prefill has worked least
// lately. A conversation brings its later turns to the target its first turn takes,
// so the first turn is where load is spread, and where a shared system prompt is
// cached or recomputed.
//
// The wait on a target is the prefill queued there plus the turn's own uncached
// tokens (the hit-rate gate applies), plus what the soft cap charges there (overCap):
// a holder of a long prompt keeps taking its conversations until what they queue
// there outweighs computing the prompt again elsewhere, while a short prompt spreads
// as soon as its holders fill. Of the
// targets within one block of the lowest wait, those within one block of the least
// recent work are kept (Load.Recent), and the cursor rotates over them: a prompt
// nobody caches yet, a new application's, goes to the target with the least work
// lately rather than to the next in turn. A target that caches the turn's prompt
// also counts its recent requests (spreadLoad). Once a slot count has been seen
// (slotsSeen), those with the fewest requests in flight are kept instead.
//
// While a target is out of running slots (poolView.outOfSlots), the engines of the pool
// are taken to run as many as it does, and a target with that many requests in flight
// is left out (it is full, or this turn would fill it; one out of slots has more),
// while some other is not: the turn would wait there for a request to end, whatever
// it caches, and so would the conversation's later turns.
//
// A target at the slot count seen (poolView.slotCharge) is charged the wait for a
// slot, as in the cost, rather than left out: a long prompt cached there may still
// cost more to compute again than the wait.
//
// While the holders of the turn's deepest match carry more than their share of the
// pool's requests, at a load that costs there (holdersOverShare), every candidate is
// weighed as holding it: the copy is paid once, by this turn.
func (r *Router) soonest(v *poolView, req *extract.Request, pr *prompt) []int {
	slots := v.slotsNow
	cands := v.eligible
	if slots > 0 {
		cands = v.pool.candBuf[:0]
		for _, i := range v.eligible {
			if v.loads[i].Requests < slots {
				cands = append(cands, i)
			}
		}
		if len(cands) == 0 {
			cands = v.eligible
		}
	}
	r.lookup(v, pr)
	matched := r.matchedTokens(v, req, pr, cands)
	cachedTurn := matched != nil // false while a copy is paid for (holdersOverShare)
	if matched != nil {
		if deepest := r.holdersOverShare(v, req, pr, cands, matched); deepest > 0 {
			cachedTurn = false
			for _, i := range cands {
				matched[i] = deepest
			}
		}
	}
	wait := v.pool.waitBuf
	low := int64(math.MaxInt64)
	for _, i := range cands {
		w := v.ahead[i] + int64(req.Tokens)
		if matched != nil {
			w -= int64(matched[i])
		}
		w += v.overCap(i) + v.slotCharge(i)
		wait[i] = w
		low = min(low, w)
	}
	block := int64(r.cfg.Prefix.BlockTokens)
	out := v.pool.soonBuf[:0]
	least, within := int64(math.MaxInt64), block
	if v.slotsSeen > 0 {
		within = 0
	}
	for _, i := range cands {
		if wait[i] <= low+block {
			out = append(out, i)
			least = min(least, v.spreadLoad(i, cachedTurn && matched[i] > 0))
		}
	}
	kept := out[:0]
	for _, i := range out {
		if v.spreadLoad(i, cachedTurn && matched[i] > 0) <= least+within {
			kept = append(kept, i)
		}
	}
	return kept
}

// holdersOverShare returns the tokens of the deepest match among cands when every
// candidate should be weighed as holding it (0 otherwise). A first turn commits its
// conversation's later turns to its target, and by its own wait it always keeps a long
// prompt on its holders: so while they carry more of the pool's recent requests (each
// at its target's pace, requestPace: a slower engine takes longer over each) than
// their share would be with one more holder, and that load costs there (they run as
// many as an engine has running slots, or their recent work reaches 1/turnoverShare of
// the prefix cache stated for them, evicting their conversations' histories), a copy
// elsewhere is worth its one prefill. Holders whose first chunks have shown copies gone
// that their stated cache should have kept are evicting those histories already: any
// share over theirs is too much there. Any is too much, too, while a candidate is idle
// (idleCandidate), at half the load that costs otherwise, unless the copy would make
// as many holders as copies by demand do (maxCopies, past which the index counts the
// prompt as held by every target) in a pool larger than that. The holders are counted
// over every eligible target, the slot filter's too. A size learned from first chunks
// is not compared with the recent work (early on it can be far too small): only its
// fall below the stated one counts, as evidence.
func (r *Router) holdersOverShare(v *poolView, req *extract.Request, pr *prompt, cands, matched []int) int {
	deepest, least := 0, math.MaxInt
	for _, i := range cands {
		deepest, least = max(deepest, matched[i]), min(least, matched[i])
	}
	if deepest == 0 || least == deepest || v.total.RecentSent <= 0 {
		return 0
	}
	bt := r.cfg.Prefix.BlockTokens
	copies := int64(maxCopies(len(v.eligible)))
	var holders, running, recentWork, cache, learned int64
	var sent, total float64
	for _, i := range v.eligible {
		l := &v.loads[i]
		at := float64(l.RecentSent) * v.requestPace(i)
		total += at
		if min(pr.matched[i]*bt, req.Tokens) < deepest {
			continue
		}
		holders++
		sent += at
		running += l.Requests
		if size := r.cacheLimit(v.pool, v.pool.targets.Targets[i].ID); size > 0 {
			recentWork += l.Recent
			cache += size
			learned += l.CacheOr(size)
		}
	}
	// A learned cache a tenth below the stated one takes several copies found gone,
	// not one misjudged chunk (learnCache).
	evicting := cache > 0 && 10*learned <= 9*cache
	// The holder that fills the prompt's index entry has it counted as held
	// everywhere: true only in a pool no larger than an entry names.
	idle := (holders+1 < copies || copies >= int64(len(v.eligible))) &&
		idleCandidate(v, pr, cands, deepest, bt, running/holders)
	share := holders + 1
	if evicting || idle {
		share = holders
	}
	if holders >= copies || sent*float64(len(v.eligible)) <= total*float64(share) {
		return 0
	}
	if evicting {
		return deepest
	}
	slots := v.slotsSeen
	if slots <= 0 {
		slots = slotsFullRunning // the fewest an engine is taken to have
	}
	// An idle target's cache serves no one and nothing queues there: a copy onto it
	// pays at half the holders' load.
	weight := int64(1)
	if idle {
		weight = 2
	}
	if weight*running >= slots*holders || cache > 0 && weight*turnoverShare*recentWork >= cache {
		return deepest
	}
	return 0
}

// idleCandidate reports whether some candidate that does not hold the deepest match
// is idle: it runs under half as many requests as a holder does on average (perHolder),
// and its recent work (Load.Recent) is under half the match's tokens, so it has
// computed nothing of the prompt's size lately and its cache serves no one. A target
// that has just taken a copy of another prompt of that size is not idle, so idle
// targets take one prompt's copy each, not every prompt's at once.
func idleCandidate(v *poolView, pr *prompt, cands []int, deepest, bt int, perHolder int64) bool {
	for _, i := range cands {
		if pr.matched[i]*bt < deepest && 2*v.loads[i].Requests < perHolder && v.loads[i].Recent < int64(deepest/2) {
			return true
		}
	}
	return false
}

// turnoverShare: holders whose recent work (Load.Recent, the uncached tokens sent
// there, halved every recentHalfLifeMS) reaches 1/turnoverShare of their stated prefix
// cache are taken to evict their conversations' histories between turns. An engine's
// LRU evicts the blocks touched least lately, and every turn touches its whole history
// again while only its new tokens are written: a cache turns over several times faster
// than its writes alone would fill it.
const turnoverShare = 4

// spreadLoad is the load a round-robin first turn spreads over the targets where its
// first token would come soonest: the target's recent prefill work (Load.Recent) as
// the time it took there, in tokens at the pool's rate (a target that computes at half
// the pool's rate counts its work twice), or, once a slot count has been seen
// (slotsSeen), its requests in flight. A slower engine computes each of the
// conversation's later turns more slowly too, so it takes fewer conversations. The
// engines' running slots bind instead once seen: each later turn takes one while it
// decodes, and the target with the fewest in flight is the furthest from its count.
//
// For a turn whose prompt the target caches (cached), its recent requests
// (Load.RecentSent) at the pool's mean work per request count instead where that is
// more. Such a turn adds little work there at once, and its conversation's later turns
// come after: by work alone, the holder that has worked least takes every new
// conversation on the prompt until those turns arrive, and then computes them all at
// once. The requests are counted at the target's pace (requestPace).
func (v *poolView) spreadLoad(i int, cached bool) int64 {
	if v.slotsSeen > 0 {
		return v.loads[i].Requests
	}
	l := &v.loads[i]
	work := l.Recent
	if slow, ok := v.slowness(i); ok {
		work = int64(float64(l.Recent) * slow)
	}
	if t := &v.total; cached && t.RecentSent > 0 {
		requests := float64(l.RecentSent) * float64(t.Recent) / float64(t.RecentSent)
		work = max(work, int64(requests*v.requestPace(i)))
	}
	return work
}

// requestPace is what a request sent to target i counts for against the others': the
// pool's rate over the target's, once its first chunks have timed a second of its
// prefill and where the two are more than sameRate apart; 1 otherwise. Requests come
// in few whole numbers, often equal on two targets, and rates a few hundredths apart
// tell the queueing in their samples, not a slower engine.
func (v *poolView) requestPace(i int) float64 {
	if slow, ok := v.slowness(i); ok && (slow > sameRate || slow*sameRate < 1) {
		return slow
	}
	return 1
}

// slowness is the pool's prefill rate over target i's: how many times longer the
// target takes over a token. ok is false until the target's first chunks have timed
// minPaceMS of its prefill.
func (v *poolView) slowness(i int) (slow float64, ok bool) {
	l := &v.loads[i]
	if v.rate <= 0 || l.RateMS < minPaceMS || l.RateTokens <= 0 {
		return 1, false
	}
	return v.rate * float64(l.RateMS) / float64(l.RateTokens), true
}

// speedOf is target i's observed prefill rate over the pool's (1 before it has one).
// Unlike slowness it counts from the first chunk on, without minPaceMS or sameRate: a
// faster target draws more requests from a fleet's first seconds, and its share of
// the sends must follow at once.
func (v *poolView) speedOf(i int) float64 {
	if l := &v.loads[i]; l.RateMS > 0 && l.RateTokens > 0 && v.rate > 0 {
		return float64(l.RateTokens) / float64(l.RateMS) / v.rate
	}
	return 1
}

// sameRate: a target whose measured rate is within this factor of the pool's counts its
// requests as the pool's (requestPace).
const sameRate = 1.25

// fallback decides without shared state: rendezvous hashing for an explicit
// conversation (every VM and replica agrees), a VM-local round robin otherwise.
func (r *Router) fallback(p *poolState, req *extract.Request, rank int) Decision {
	var cands []int
	for i := range p.targets.Targets {
		if rank == NoRank || p.targets.Targets[i].Rank == rank {
			cands = append(cands, i)
		}
	}
	var choice int
	if req.HasConversation && r.cfg.Conversation.Enabled {
		choice = rendezvous(p, cands, req.Conversation)
	} else {
		choice = cands[r.localCursor%uint64(len(cands))]
		r.localCursor++
	}
	return Decision{Target: p.targets.Targets[choice], Kind: KindFallback, StateFailed: true}
}

func (r *Router) rankExists(p *poolState, rank int) bool {
	for i := range p.targets.Targets {
		if p.targets.Targets[i].Rank == rank {
			return true
		}
	}
	return false
}

// FirstChunk records that the decode target's first response chunk came back: the
// request's prefill is over, and its queued prefill tokens leave the ledger.
func (r *Router) FirstChunk(t *LoadTicket) error {
	if !t.Valid {
		return nil
	}
	if t.Cached > 0 {
		// A size stated or reported since the decision bounds its news too: the
		// first scrape often comes after a fleet's first requests.
		if limit := r.cacheLimit(r.decode, t.Target); limit > 0 {
			t.CacheLimit = limit
		}
	}
	now := r.now()
	t.ChunkMS = now
	return r.decode.ledger.FirstChunk(t, now)
}

// Release hands a decode ticket back. An error means the batch it joined could not be
// written yet; the release itself is kept and written at the next flush.
func (r *Router) Release(t LoadTicket) error {
	if !t.Valid {
		return nil
	}
	return r.decode.ledger.Release(t, r.now)
}

// ReleasePrefill hands a prefill ticket back.
func (r *Router) ReleasePrefill(t LoadTicket) error {
	if !t.Valid {
		return nil
	}
	return r.prefill.ledger.Release(t, r.now)
}

// ReportHealth records a response from a decode (or prefill) target. It returns true
// when this report ejected the endpoint.
func (r *Router) ReportHealth(t Target, prefill bool, failed bool) (bool, error) {
	p := r.decode
	if prefill {
		p = r.prefill
	}
	if t.Address == "" {
		return false, nil // a pass-through decision: no target served
	}
	fp := t.EndpointFP // taken when the target was made: hashing costs more
	if fp == 0 {
		fp = hashx.FingerprintString(t.Address) // a Target made by hand
	}
	now := r.now()
	if !failed && p.health.cleanNow(now) {
		return false, nil // what Report answers a success on a clean board
	}
	return p.health.Report(fp, failed, now)
}

// SyncPrefixes shares this VM's prefix records with the other VMs and takes theirs
// (see prefix.PrefixIndex), at the write clocks of this VM's view of the ledger. It runs on
// the tick.
func (r *Router) SyncPrefixes() error {
	err := r.syncPool(r.decode)
	if r.prefill.inUse() {
		if err2 := r.syncPool(r.prefill); err == nil {
			err = err2
		}
	}
	return err
}

func (r *Router) syncPool(p *poolState) error {
	now := r.now()
	// Other VMs' records are applied at the target's write clock as this VM sees it:
	// a copy is as old here as there, for a configured cache or a learned one.
	var clockOf func(uint32) uint32
	clear(p.syncLoads)
	if p.ledger.LoadsInto(now, p.targets.Index, p.syncLoads) == nil {
		bt := int64(max(1, r.cfg.Prefix.BlockTokens))
		clockOf = func(t uint32) uint32 {
			if i := p.byID32.get(uint64(t)); i >= 0 {
				return uint32(p.syncLoads[i].Written / bt)
			}
			return 0
		}
	}
	return p.index.Sync(now, clockOf)
}

// FlushLoad writes this VM's batched load changes to both ledgers, drops expired
// slots, and reads what the other VMs wrote. It runs on the tick.
func (r *Router) FlushLoad() error {
	now := r.now()
	err := r.decode.ledger.Flush(now)
	if r.prefill.inUse() {
		if err2 := r.prefill.ledger.Flush(now); err == nil {
			err = err2
		}
	}
	return err
}

// Loads returns the live load of every target of the decode pool, in pool order. Each
// Load's Cache is the one decisions go by: the learned cache, at most the size stated
// or reported, else that size (0: unknown).
func (r *Router) Loads() ([]Load, error) { return r.poolLoads(r.decode) }

// PrefillLoads is Loads for the prefill pool (empty without one). A prefill target
// learns neither cache nor rate: its Cache is the size stated or reported.
func (r *Router) PrefillLoads() ([]Load, error) {
	if !r.prefill.inUse() {
		return nil, nil
	}
	return r.poolLoads(r.prefill)
}

func (r *Router) poolLoads(p *poolState) ([]Load, error) {
	nowMS := r.now()
	out := make([]Load, len(p.targets.Targets))
	if err := p.ledger.LoadsInto(nowMS, p.targets.Index, out); err != nil {
		return nil, err
	}
	if p.engine != nil {
		r.readEngine(p, nowMS) // the reported size, also while no request comes
	}
	for i, t := range p.targets.Targets {
		out[i].Cache = out[i].CacheOr(r.cacheLimit(p, t.ID))
	}
	return out, nil
}
