package routing

import (
	"math"
	"math/rand"
	"testing"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/prefix"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// firstTurnBesideAFullHolder caches a system prompt of systemChars characters on one
// target (the holder), has a second target compute 2000 tokens lately, puts the holder
// at the fair-share cap with two replies decoding, and places a new conversation that
// shares the prompt.
func firstTurnBesideAFullHolder(t *testing.T, systemChars int) (holder, busy, got Target) {
	clock := &fakeClock{ms: 1e6}
	r := NewRouter(testConfig(t, ""), state.NewMemoryStore(), clock.now)
	rng := rand.New(rand.NewSource(9))
	system := words(rng, systemChars)
	warm := r.Decide(textRequest(system+words(rng, 300), 1), NoRank)
	require.NoError(t, r.FirstChunk(&warm.Ticket))
	require.NoError(t, r.Release(warm.Ticket))
	holder = warm.Target
	for _, tg := range r.DecodeTargets() {
		if tg.ID != holder.ID {
			busy = tg
			break
		}
	}
	tk, err := r.decode.ledger.AcquireQueued(busy.ID, 2000, 2000, 0, clock.ms)
	require.NoError(t, err)
	require.NoError(t, r.decode.ledger.FirstChunk(&tk, clock.ms))
	require.NoError(t, r.decode.ledger.Release(tk, clock.now))
	for i := 0; i < 2; i++ {
		_, err := r.decode.ledger.Acquire(holder.ID, 100, clock.ms)
		require.NoError(t, err)
	}
	d := newConversation(t, r, system+words(rng, 300), 2, 7)
	return holder, busy, d.Target
}

func TestFirstTurnKeepsALongCachedPromptOnAHolderAtTheCap(t *testing.T) {
	// 1000 cached tokens outweigh one request over the cap at the pool's recent mean
	// of uncached tokens per request (3075 / 4).
	holder, _, got := firstTurnBesideAFullHolder(t, 4000)
	assert.Equal(t, holder.Address, got.Address)
}

func TestFirstTurnSpreadsAShortCachedPromptPastAHolderAtTheCap(t *testing.T) {
	// 48 cached tokens do not: the turn goes to the target that has worked least
	// lately, not to the one that computed 2000 tokens.
	holder, busy, got := firstTurnBesideAFullHolder(t, 200)
	assert.NotEqual(t, holder.Address, got.Address)
	assert.NotEqual(t, busy.Address, got.Address)
}

// newConversation places the first turn of conversation conv, a request id of text.
func newConversation(t *testing.T, r *Router, text string, id, conv uint64) Decision {
	req := textRequest(text, id)
	req.Conversation, req.HasConversation = conv, true
	d := r.Decide(req, NoRank)
	require.Equal(t, KindNewConversation, d.Kind)
	return d
}

// promptOnAHolder starts a router of three targets with a system prompt of
// systemChars characters (4000: about 1000 tokens) computed and done on one of them,
// the holder (so its rate is known, about 6 tokens a ms with 4000).
func promptOnAHolder(t *testing.T, systemChars int) (r *Router, clock *fakeClock, rng *rand.Rand, system string, holder Target) {
	clock = &fakeClock{ms: 1e6}
	r = NewRouter(testConfig(t, ""), state.NewMemoryStore(), clock.now)
	rng = rand.New(rand.NewSource(9))
	system = words(rng, systemChars)
	warm := r.Decide(textRequest(system+words(rng, 300), 1), NoRank)
	clock.ms += 200
	require.NoError(t, r.FirstChunk(&warm.Ticket))
	require.NoError(t, r.Release(warm.Ticket))
	return r, clock, rng, system, warm.Target
}

// slotsCase sets up three targets: a 1000-token system prompt computed and done on
// the holder (so its rate is known, about 6 tokens a ms; the others have none of
// their own), running[j] requests past their first chunk on target j (the holder
// first), and waiting[j] requests of 50 uncached tokens each sent to it, still without
// a first chunk afterMS later; then it places a new conversation that shares the
// prompt.
func slotsCase(t *testing.T, running, waiting [3]int, afterMS int64) (targets []Target, got Target) {
	r, clock, rng, system, holder := promptOnAHolder(t, 4000)
	targets = []Target{holder}
	for _, tg := range r.DecodeTargets() {
		if tg.ID != holder.ID {
			targets = append(targets, tg)
		}
	}
	for j, n := range running {
		for k := 0; k < n; k++ {
			tk, err := r.decode.ledger.AcquireQueued(targets[j].ID, 100, 0, 0, clock.ms)
			require.NoError(t, err)
			require.NoError(t, r.decode.ledger.FirstChunk(&tk, clock.ms))
		}
	}
	for j, n := range waiting {
		for k := 0; k < n; k++ {
			_, err := r.decode.ledger.AcquireQueued(targets[j].ID, 100, 50, clock.ms, clock.ms)
			require.NoError(t, err)
		}
	}
	clock.ms += afterMS
	d := newConversation(t, r, system+words(rng, 300), 2, 7)
	return targets, d.Target
}

// A first turn and targets out of running slots (poolView.outOfSlots). got: the target
// it should take, by its index in slotsCase's order (the holder first), or -1 for
// any but the holder.
func TestFirstTurnAndRunningSlots(t *testing.T) {
	for _, tc := range []struct {
		name             string
		running, waiting [3]int
		afterMS          int64
		got              int
	}{
		// Sixteen running and two waiting where their prefill should long be done:
		// the engine starts none until another ends, and the turn would wait too.
		{"holder full", [3]int{16, 15, 15}, [3]int{2}, 1000, -1},
		// The pool's engines are taken to run as many as the full one: a target with
		// 16 in flight would be full with this turn too.
		{"as loaded as the full one", [3]int{16, 16, 15}, [3]int{2}, 1000, 2},
		{"every target full: the cache decides", [3]int{16, 18, 18}, [3]int{2}, 1000, 0},
		// The same two 2 ms after they were sent: their prefill is still running.
		{"prefill still due", [3]int{16, 15, 15}, [3]int{2}, 2, 0},
		// One late request may be a prompt that took longer than the rate says.
		{"one late", [3]int{16, 15, 15}, [3]int{1}, 1000, 0},
		// Under sixteen running, requests without a first chunk are more likely not
		// streamed (their body comes whole at the end) than waiting for a slot.
		{"few running", [3]int{15, 10, 10}, [3]int{3}, 1000, 0},
		// A target with no rate of its own is judged at its peers'.
		{"full without a rate of its own", [3]int{16, 16, 10}, [3]int{0, 2}, 1000, 2},
		// Engines of one pool are alike: late requests on a target running fewer
		// than another are prefill, not a wait for a slot.
		{"late while another runs more", [3]int{16, 17, 15}, [3]int{2}, 1000, 0},
		// Two late: the busier one is full, and its count is the pool's; the holder,
		// running fewer, is not (its 18 in flight are under the count).
		{"two late", [3]int{16, 20, 15}, [3]int{2, 2, 2}, 1000, 0},
		// A target as busy as the full one is full too.
		{"two full", [3]int{20, 20, 15}, [3]int{2, 2, 2}, 1000, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts, got := slotsCase(t, tc.running, tc.waiting, tc.afterMS)
			if tc.got < 0 {
				assert.NotEqual(t, ts[0].Address, got.Address)
			} else {
				assert.Equal(t, ts[tc.got].Address, got.Address)
			}
		})
	}
}

// A target seen out of running slots sets the pool's slot count for slotsMemoryMS
// after it was last seen so: after the target has drained, a first turn is charged
// the wait for a slot on a target at that count, on every VM that shares the ledger.
// Each turn brings a prompt cached nowhere, so without the charge it would go to the
// target with the least work lately: the full one, whose requests brought little.
func TestFirstTurnKeepsToRunningSlotsSeen(t *testing.T) {
	clock := &fakeClock{ms: 1e6}
	store := state.NewMemoryStore()
	r := NewRouter(testConfig(t, ""), store, clock.now)
	rng := rand.New(rand.NewSource(9))
	full := r.DecodeTargets()[0]
	// Fifteen running on each other target, each of which computed 100 tokens, so that
	// the full target stays under the fair-share cap and has worked least lately.
	others := func() {
		for _, tg := range r.DecodeTargets()[1:] {
			for k := 0; k < 15; k++ {
				tk, err := r.decode.ledger.AcquireQueued(tg.ID, 100, 100, clock.ms, clock.ms)
				require.NoError(t, err)
				require.NoError(t, r.decode.ledger.FirstChunk(&tk, clock.ms+1))
			}
		}
	}
	var tickets []LoadTicket
	// running requests past their first chunk on the full target, then waiting ones
	// of 50 uncached tokens still without it.
	load := func(running, waiting int) {
		for k := 0; k < running+waiting; k++ {
			prefill := int64(0)
			if k >= running {
				prefill = 50
			}
			tk, err := r.decode.ledger.AcquireQueued(full.ID, 100, prefill, clock.ms, clock.ms)
			require.NoError(t, err)
			if k < running {
				require.NoError(t, r.decode.ledger.FirstChunk(&tk, clock.ms))
			}
			tickets = append(tickets, tk)
		}
	}
	firstTurn := func(r *Router, conv uint64) Target {
		d := newConversation(t, r, words(rng, 400), conv+10, conv)
		require.NoError(t, r.Release(d.Ticket))
		return d.Target
	}
	others()
	load(16, 2)
	clock.ms += 1000
	require.NotEqual(t, full.Address, firstTurn(r, 1).Address, "out of slots now")
	for k := 16; k < 18; k++ {
		require.NoError(t, r.decode.ledger.FirstChunk(&tickets[k], clock.ms))
	}
	// Eighteen running, none waiting: the target is not seen full now, but it has
	// as many in flight as the sixteen it ran when it was.
	assert.NotEqual(t, full.Address, firstTurn(r, 2).Address, "the count seen")
	require.NoError(t, r.FlushLoad())
	other := NewRouter(testConfig(t, ""), store, clock.now)
	assert.NotEqual(t, full.Address, firstTurn(other, 3).Address, "another VM")

	// Fifteen in flight: under the count.
	for _, tk := range tickets[15:] {
		require.NoError(t, r.Release(tk))
	}
	tickets = tickets[:15]
	assert.Equal(t, full.Address, firstTurn(r, 4).Address, "under the count")

	// Long after it was last seen full, the count is forgotten. (The load above has
	// expired by then, and the recent work decayed: they are set again.)
	clock.ms += slotsMemoryMS - 2000
	tickets = tickets[:0]
	others()
	load(18, 0)
	assert.NotEqual(t, full.Address, firstTurn(r, 5).Address, "within the memory")
	clock.ms += 2000
	assert.Equal(t, full.Address, firstTurn(r, 6).Address, "forgotten")
}

// A target at the slot count seen is charged the wait for a slot for each request
// from that count up, not left out: a prompt cached there stays while that wait is
// less than computing it again elsewhere. A continuation's holder keeps a request
// without an id outright while the wait is at most 6 times what it caches (about
// 5760 tokens here: eight slots' wait is under it, nine over), and is weighed by the
// cost past that.
func TestTheSlotWaitWeighedAgainstTheCache(t *testing.T) {
	for _, tc := range []struct {
		name         string
		systemChars  int
		conversation bool // a new conversation; with turn, its second turn
		turn         bool
		shared       bool // the system prompt is cached on every target
		inFlight     int
		holder       bool
		kind         Kind // checked when not 0
	}{
		{"first turn, under the count", 4000, true, false, false, 15, true, 0},
		{"first turn, one slot to wait for", 4000, true, false, false, 16, true, 0},
		{"first turn, two slots", 4000, true, false, false, 17, false, 0},
		// A continuation: its holder caches about 960 of 1075 tokens. At the slot
		// count the cost decides: seven slots' wait costs less than computing it
		// all again, eight more.
		{"no id, a long prompt, two slots", 4000, false, false, false, 17, true, KindContinuation},
		{"no id, a long prompt, seven slots", 4000, false, false, false, 22, true, KindContinuation},
		{"no id, a long prompt, eight slots", 4000, false, false, false, 23, false, 0},
		// A conversation's next turn, its history cached on the holder: it stays
		// while the wait is worth less than computing the history again elsewhere.
		{"turn, a long history, two slots", 4000, true, true, false, 17, true, KindSticky},
		{"turn, a short history, twenty slots", 400, true, true, false, 35, false, KindOverflow},
		// Its history is a system prompt every target holds: elsewhere, the turn
		// computes only its own words, which costs less than two slots' wait.
		{"turn, a history every target holds, under the count", 4000, true, true, true, 15, true, KindSticky},
		{"turn, a history every target holds, two slots", 4000, true, true, true, 17, false, KindOverflow},
		// Under the continuation threshold: the cost alone decides.
		{"no id, a short prompt, under the count", 400, false, false, false, 15, true, 0},
		{"no id, a short prompt, nine slots", 400, false, false, false, 24, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, clock, rng, system, holder := promptOnAHolder(t, tc.systemChars)
			if tc.shared {
				// A conversation of its own on each other target computes the
				// prompt there.
				for j, tg := range r.DecodeTargets() {
					if tg.ID == holder.ID {
						continue
					}
					conv := uint64(100 + j)
					require.NoError(t, r.decode.conv.Record(conv, tg.ID))
					req := textRequest(system+words(rng, 300), uint64(50+j))
					req.Conversation, req.HasConversation = conv, true
					d := r.Decide(req, NoRank)
					require.Equal(t, tg.ID, d.Target.ID)
					clock.ms += 200
					require.NoError(t, r.FirstChunk(&d.Ticket))
					require.NoError(t, r.Release(d.Ticket))
				}
			}
			// 2000 requests sent and ended lately, since long before this VM's first
			// view, fifteen running on each other target, and the holder seen full at
			// sixteen: a request stays about 1.9 s (46 in flight, 2000 sent in about
			// 82 s), so one of sixteen slots frees about every 116 ms.
			for _, tg := range r.DecodeTargets() {
				if tg.ID == holder.ID {
					continue
				}
				for k := 0; k < 1000; k++ {
					tk, err := r.decode.ledger.Acquire(tg.ID, 100, clock.ms)
					require.NoError(t, err)
					require.NoError(t, r.decode.ledger.Release(tk, clock.now))
				}
				for k := 0; k < 15; k++ {
					_, err := r.decode.ledger.Acquire(tg.ID, 100, clock.ms)
					require.NoError(t, err)
				}
			}
			r.decode.sendsFromMS = math.MinInt64 / 2
			require.NoError(t, r.decode.ledger.SeenFull(holder.ID, 16, clock.ms))
			for k := 0; k < tc.inFlight; k++ {
				_, err := r.decode.ledger.Acquire(holder.ID, 100, clock.ms)
				require.NoError(t, err)
			}
			var d Decision
			switch {
			case tc.turn:
				// The first turn was placed on the holder before it filled.
				require.NoError(t, r.decode.conv.Record(7, holder.ID))
				req := textRequest(system+words(rng, 300), 2)
				req.Conversation, req.HasConversation = 7, true
				d = r.Decide(req, NoRank)
			case tc.conversation:
				d = newConversation(t, r, system+words(rng, 300), 2, 7)
			default:
				d = r.Decide(textRequest(system+words(rng, 300), 2), NoRank)
			}
			assert.Equal(t, tc.holder, d.Target.ID == holder.ID, "%s", d.Kind)
			if tc.kind != 0 {
				assert.Equal(t, tc.kind, d.Kind)
			}
		})
	}
}

func TestSlotWait(t *testing.T) {
	// 80 in flight, 1000 sent lately, half a half-life since the last halving (the
	// sends are over 1.5 half-lives): a request stays 80 / (1000 / 98 304 ms) =
	// 7864 ms; one of 16 slots frees every 491.52 ms, 4915 tokens at 10 a ms.
	pool := &poolState{sendsFromMS: math.MinInt64 / 2}
	v := &poolView{pool: pool, total: Load{Requests: 80, RecentSent: 1000 * countUnit}, sentInFlight: 80, rate: 10, nowMS: 5*recentHalfLifeMS + recentHalfLifeMS/2}
	assert.InDelta(t, 4915.2, v.slotWait(16), 0.01)
	// The sends began 10 s ago, in this half-life: they are over 10 s, and a request
	// stays 800 ms; one of 16 slots frees every 50 ms, 500 tokens.
	pool.sendsFromMS = v.nowMS - 10000
	assert.InDelta(t, 500, v.slotWait(16), 0.01)
	pool.sendsFromMS = math.MinInt64 / 2
	v.rate = 0
	assert.Zero(t, v.slotWait(16), "no rate seen")
	v.rate, v.total.RecentSent = 10, 0
	assert.Zero(t, v.slotWait(16), "nothing sent lately")
}

func TestSendsWindow(t *testing.T) {
	// Work sent at a steady rate since from counts, at now, as that rate over this.
	const hl = recentHalfLifeMS
	for _, tc := range []struct {
		name     string
		from     int64
		now      int64
		want     float64
		maxDelta float64
	}{
		{"within the first half-life", 3*hl + 100, 3*hl + 10100, 10000, 0},
		{"across one halving", 3*hl - 1000, 3*hl + 2000, 500 + 2000, 0},
		{"a whole half-life between", 3*hl - 1000, 4*hl + 2000, 250 + hl/2 + 2000, 0},
		{"long before: a half-life and the time since the halving", math.MinInt64 / 2, 9*hl + 5000, hl + 5000, 1e-6},
		{"no time yet", 3 * hl, 3 * hl, 1, 0},
	} {
		assert.InDelta(t, tc.want, sendsWindow(tc.from, tc.now), tc.maxDelta, tc.name)
	}
	// A steady rate, halved at each boundary, agrees with it at every step.
	const rate = 3.0
	from := int64(hl/3 + 7)
	sum, epoch := 0.0, from>>recentHalfLifeShift
	for now := from + 1; now < 6*hl; now++ {
		for ; epoch < now>>recentHalfLifeShift; epoch++ {
			sum /= 2
		}
		sum += rate // sent over the ms just past
		if now%997 == 0 {
			assert.InDelta(t, sum, rate*sendsWindow(from, now), 2*rate, "at %d", now)
		}
	}
}

func TestSightingsOutOfSlots(t *testing.T) {
	// The later sighting wins, whichever order they are merged in; of the same time,
	// the one with more running.
	r, at := mergeFull(20, 1000, 16, 2000)
	assert.Equal(t, [2]int64{16, 2000}, [2]int64{r, at})
	r, at = mergeFull(16, 2000, 20, 1000)
	assert.Equal(t, [2]int64{16, 2000}, [2]int64{r, at})
	r, at = mergeFull(16, 2000, 20, 2000)
	assert.Equal(t, [2]int64{20, 2000}, [2]int64{r, at})

	// A flush drops a sighting slotsMemoryMS old, and a target kept only by it.
	clock := &fakeClock{ms: 1e6}
	store := state.NewMemoryStore()
	l := NewLoadLedger(store, "ns", "decode", 600000, 8)
	require.NoError(t, l.SeenFull(7, 16, clock.ms))
	require.NoError(t, l.Flush(clock.ms))
	v, _, err := store.Get("ns/load/decode")
	require.NoError(t, err)
	assert.Len(t, v, 1+ledgerTargetHeader)
	got := make([]Load, 1)
	index := func(id uint64) int {
		if id == 7 {
			return 0
		}
		return -1
	}
	require.NoError(t, NewLoadLedger(store, "ns", "decode", 600000, 8).LoadsInto(clock.ms, index, got))
	assert.Equal(t, [2]int64{16, 1e6}, [2]int64{got[0].FullRunning, got[0].FullAt}, "another VM reads it")
	require.NoError(t, l.Flush(clock.ms+slotsMemoryMS-1))
	v, _, _ = store.Get("ns/load/decode")
	assert.Len(t, v, 1+ledgerTargetHeader, "kept within the memory")
	require.NoError(t, l.SeenFull(8, 1, clock.ms+slotsMemoryMS-1)) // a change, so the flush writes
	require.NoError(t, l.Flush(clock.ms+slotsMemoryMS))
	v, _, _ = store.Get("ns/load/decode")
	got[0] = Load{}
	require.NoError(t, NewLoadLedger(store, "ns", "decode", 600000, 8).LoadsInto(clock.ms+slotsMemoryMS, index, got))
	assert.Zero(t, got[0].FullAt, "forgotten")
	assert.Len(t, v, 1+ledgerTargetHeader, "only target 8's entry")
}

func TestASightingFromAheadOfTheClockIsIgnored(t *testing.T) {
	// A sighting in the ledger's key dated further ahead than the memory is no
	// reading of this host's clock (a torn or foreign value): a first turn does not
	// go by it, and the next write drops it.
	r, clock, rng, system, holder := promptOnAHolder(t, 4000)
	_, err := r.decode.ledger.Acquire(holder.ID, 100, clock.ms)
	require.NoError(t, err)
	require.NoError(t, r.FlushLoad())
	l := r.decode.ledger
	v, _, err := l.store.Get(l.key)
	require.NoError(t, err)
	entries := decodeLedger(v, l.oldestLiveEpoch(clock.ms), clock.ms)
	for i := range entries {
		if entries[i].target == holder.ID {
			entries[i].fullRunning, entries[i].fullAt = 1, clock.ms+slotsMemoryMS
		}
	}
	require.NoError(t, l.store.Set(l.key, encodeLedger(entries, nil), 0))
	require.NoError(t, r.FlushLoad())
	loads, err := r.Loads()
	require.NoError(t, err)
	require.Equal(t, clock.ms+slotsMemoryMS, loads[r.decode.targets.Index(holder.ID)].FullAt, "read as written")

	d := newConversation(t, r, system+words(rng, 300), 2, 7)
	assert.Equal(t, holder.Address, d.Target.Address)
	require.NoError(t, r.FlushLoad()) // the turn's load is a change: the key is written
	loads, err = r.Loads()
	require.NoError(t, err)
	for i, l := range loads {
		assert.Zero(t, l.FullAt, "target %d", i)
	}
}

// Once a slot count has been seen, a first turn spreads requests in flight, not recent
// prefill work: of targets where its first token comes as soon, it takes the one with
// the fewest in flight, the furthest from its slot count; without one, the one that
// has worked least lately.
func TestFirstTurnSpreadsRequestsInFlightOnceSlotsBind(t *testing.T) {
	for _, seen := range []bool{false, true} {
		clock := &fakeClock{ms: 1e6}
		r := NewRouter(testConfig(t, ""), state.NewMemoryStore(), clock.now)
		rng := rand.New(rand.NewSource(3))
		ts := r.DecodeTargets()
		// Recent prefill work (uncached tokens sent, done) and requests in flight:
		// ts[0] has worked least, ts[2] has fewest in flight, and the three are
		// within one block of each other in flight, so only an exact count tells
		// ts[2] from the cursor's first pick.
		for j, load := range []struct{ work, inFlight int }{{0, 4}, {5000, 5}, {10000, 3}} {
			for k := 0; k < load.work/1000; k++ {
				tk, err := r.decode.ledger.AcquireQueued(ts[j].ID, 1000, 1000, clock.ms, clock.ms)
				require.NoError(t, err)
				require.NoError(t, r.decode.ledger.FirstChunk(&tk, clock.ms+100))
				require.NoError(t, r.decode.ledger.Release(tk, clock.now))
			}
			for k := 0; k < load.inFlight; k++ {
				_, err := r.decode.ledger.Acquire(ts[j].ID, 100, clock.ms)
				require.NoError(t, err)
			}
		}
		if seen {
			// Seen full at 16 a while ago: no target is at that count now.
			require.NoError(t, r.decode.ledger.SeenFull(ts[1].ID, 16, clock.ms-60000))
		}
		clock.ms += 1000
		got := newConversation(t, r, words(rng, 400), 1, 1).Target
		if seen {
			assert.Equal(t, ts[2].Address, got.Address, "fewest in flight")
		} else {
			assert.Equal(t, ts[0].Address, got.Address, "least work lately")
		}
	}
}

// A request confined to one rank judges that rank out of slots against the whole pool,
// as any other request would: rank 1 runs sixteen with two late, and is seen full only
// while rank 0 runs no more.
func TestARankIsSeenFullAgainstTheWholePool(t *testing.T) {
	for _, tc := range []struct {
		rank0 int
		full  bool
	}{{20, false}, {15, true}} {
		clock := &fakeClock{ms: 1e6}
		cfg, err := config.ParseConfig([]byte(`{"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":2}]}}}`))
		require.NoError(t, err)
		r := NewRouter(&cfg, state.NewMemoryStore(), clock.now)
		ts := r.DecodeTargets()
		byRank := map[int]Target{}
		for _, tg := range ts {
			byRank[tg.Rank] = tg
		}
		// A prefill seen done on rank 1, so that its rate is known.
		tk, err := r.decode.ledger.AcquireQueued(byRank[1].ID, 1000, 1000, clock.ms, clock.ms)
		require.NoError(t, err)
		require.NoError(t, r.decode.ledger.FirstChunk(&tk, clock.ms+100))
		require.NoError(t, r.decode.ledger.Release(tk, clock.now))
		for k := 0; k < tc.rank0; k++ {
			_, err := r.decode.ledger.Acquire(byRank[0].ID, 100, clock.ms)
			require.NoError(t, err)
		}
		for k := 0; k < 18; k++ {
			prefill := int64(0)
			if k >= 16 {
				prefill = 50
			}
			_, err := r.decode.ledger.AcquireQueued(byRank[1].ID, 100, prefill, clock.ms, clock.ms)
			require.NoError(t, err)
		}
		clock.ms += 1000
		r.Decide(textRequest("a prompt for rank one", 1), 1)
		require.NoError(t, r.FlushLoad())
		loads, err := r.Loads()
		require.NoError(t, err)
		for i, tg := range ts {
			if tg.Rank == 1 {
				assert.Equal(t, tc.full, loads[i].FullAt != 0, "rank 0 runs %d", tc.rank0)
			}
		}
	}
}

func TestAtTheSlotCount(t *testing.T) {
	v := &poolView{slotsSeen: 16, loads: []Load{{Requests: 16}, {Requests: 15}}}
	assert.True(t, v.atSlots(0), "as many in flight as seen full")
	assert.False(t, v.atSlots(1), "one fewer")
	v.slotsSeen = 0
	assert.False(t, v.atSlots(0), "no count seen")
}

// A round-robin first turn on a prompt two targets cache goes to the one with less
// recent work, counting a target's recent requests at the pool's mean work per
// request where that is more: such a turn costs its target little at once and brings
// its conversation's later turns after. Target 0 was sent cheap requests (10 uncached
// tokens each), target 1 two of 1000 uncached tokens, the third target two of 1000.
// With two cheap requests target 0 has worked least and takes the turn; with forty,
// their count at the pool's mean is more than target 1's work, and target 1 takes
// it. A prompt no target caches still goes by work alone: to target 0.
func TestFirstTurnsOnACachedPromptCountRecentRequests(t *testing.T) {
	for _, tc := range []struct {
		cheap  int
		cached bool
		got    int
	}{{2, true, 0}, {40, true, 1}, {40, false, 0}} {
		r, clock, rng, system, cps := promptRouter(t, 71, "")
		ts := r.DecodeTargets()
		sendDone(t, r, clock, ts[0], tc.cheap, 10)
		sendDone(t, r, clock, ts[1], 2, 1000)
		sendDone(t, r, clock, ts[2], 2, 1000)
		held := ts[:0]
		if tc.cached {
			held = ts[:2]
		}
		got := firstTurnOnHeld(t, r, clock, rng, system, cps, held...)
		assert.Equal(t, ts[tc.got].Address, got.Address, "%+v", tc)
	}
}

// A slower target counts its recent requests at its rate: each of its conversations'
// later turns takes it longer. Targets 0 and 1 hold the prompt and computed 1000
// tokens each, target 1 in a second and target 0 in slow ms; target 0 was then sent
// 19 cheap requests and target 1 20, the third target two of 1000 uncached tokens.
// At twice target 1's time target 0's requests count for more, and target 1 takes
// the turn; at a tenth more, the rates are taken as the same (sameRate), and target 0,
// with the fewer requests, takes it.
func TestFirstTurnsOnACachedPromptCountRequestsAtTheTargetsRate(t *testing.T) {
	for _, tc := range []struct {
		slow int64
		got  int
	}{{2000, 1}, {1100, 0}} {
		r, clock, rng, system, cps := promptRouter(t, 75, "")
		ts := r.DecodeTargets()
		computeIn(t, r, clock, ts[0], 1000, tc.slow)
		computeIn(t, r, clock, ts[1], 1000, 1000)
		clock.ms += tc.slow
		sendDone(t, r, clock, ts[0], 19, 10)
		sendDone(t, r, clock, ts[1], 20, 10)
		sendDone(t, r, clock, ts[2], 2, 1000)
		got := firstTurnOnHeld(t, r, clock, rng, system, cps, ts[:2]...)
		assert.Equal(t, ts[tc.got].Address, got.Address, "%+v", tc)
	}
}

// While a prompt's holders pay for a copy (holdersOverShare), a first turn's
// candidates are all weighed as holding the prompt, but the copy is computed where it
// goes: the spread is by work alone. Target 0 holds the prompt, runs sixteen and was
// sent 84 more of 100 uncached tokens, over its share; target 1 was sent forty
// requests of 1 uncached token, target 2 two of 1000. The copy goes to target 1,
// which has worked least, though its requests at the pool's mean work would count
// more than target 2's work.
func TestAFirstTurnPayingForACopySpreadsByWork(t *testing.T) {
	r, clock, rng, system, cps := promptRouter(t, 73, "")
	ts := r.DecodeTargets()
	sendDone(t, r, clock, ts[0], 84, 100)
	for k := 0; k < 16; k++ {
		_, err := r.decode.ledger.Acquire(ts[0].ID, 100, clock.ms)
		require.NoError(t, err)
	}
	sendDone(t, r, clock, ts[1], 40, 1)
	sendDone(t, r, clock, ts[2], 2, 1000)
	r.decode.index.Record(cps, ts[0].ID, 0, 0)
	clock.ms += 1000
	got := newConversation(t, r, system+words(rng, 400), 2, 9).Target
	assert.Equal(t, ts[1].Address, got.Address)
}

// promptRouter starts a router of three targets (testConfig, with extra) on a fake
// clock, with a system prompt of about 1000 tokens drawn from seed and the prompt's
// checkpoints, recorded nowhere yet.
func promptRouter(t *testing.T, seed int64, extra string) (r *Router, clock *fakeClock, rng *rand.Rand, system string, cps []prefix.Checkpoint) {
	clock = &fakeClock{ms: 1e6}
	r = NewRouter(testConfig(t, extra), state.NewMemoryStore(), clock.now)
	rng = rand.New(rand.NewSource(seed))
	system = words(rng, 4000)
	q := textRequest(system, 1)
	cps, _ = prefix.HashCheckpoints(q.Model, q.Prompt, q.BlockBytes, nil)
	return r, clock, rng, system, cps
}

// firstTurnOnHeld records the prompt's checkpoints on held and, a second later, returns
// where the first turn of a new conversation on the prompt goes.
func firstTurnOnHeld(t *testing.T, r *Router, clock *fakeClock, rng *rand.Rand, system string, cps []prefix.Checkpoint, held ...Target) Target {
	t.Helper()
	for _, tg := range held {
		r.decode.index.Record(cps, tg.ID, 0, 0)
	}
	clock.ms += 1000
	return newConversation(t, r, system+words(rng, 400), 2, 9).Target
}

// computeIn sends tg a request of tokens uncached tokens whose first chunk comes back
// ms later (a sample of its rate), and ends it; the clock stays.
func computeIn(t *testing.T, r *Router, clock *fakeClock, tg Target, tokens, ms int64) {
	t.Helper()
	l := r.decode.ledger
	tk, err := l.AcquireQueued(tg.ID, tokens, tokens, clock.ms, clock.ms)
	require.NoError(t, err)
	require.NoError(t, l.FirstChunk(&tk, clock.ms+ms))
	require.NoError(t, l.Release(tk, func() int64 { return clock.ms + ms }))
}

// sendDone sends tg n requests of 1000 tokens, uncached of them to compute, and ends
// them at once: recent work and requests, nothing in flight.
func sendDone(t *testing.T, r *Router, clock *fakeClock, tg Target, n int, uncached int64) {
	t.Helper()
	l := r.decode.ledger
	for k := 0; k < n; k++ {
		tk, err := l.AcquireQueued(tg.ID, 1000, uncached, clock.ms, clock.ms)
		require.NoError(t, err)
		require.NoError(t, l.Release(tk, clock.now))
	}
}

func TestALateFirstChunkIsASightingOutOfSlots(t *testing.T) {
	// Sixteen requests past their first chunk on target 7 (a hundred tokens each in a
	// ms, so the rate is a hundred tokens a ms), then a seventeenth sent, due 10 ms
	// later. Its first chunk a second late, or just over twice its 10 ms and 100 ms
	// past that, records the target out of running slots at seventeen; at that bound,
	// or with fewer than sixteen running before it, or with the copy it counted on
	// found gone (a prefill the rate explains), it records none.
	for _, tc := range []struct {
		name           string
		running        int
		lateMS, cached int64
		seen           int64
	}{{"late", 16, 1000, 0, 17}, {"just late", 16, 121, 0, 17}, {"at the bound", 16, 120, 0, 0}, {"few running", 14, 1000, 0, 0}, {"copy gone", 16, 1000, 100000, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			now := int64(1e6)
			l := NewLoadLedger(state.NewMemoryStore(), "ns", "decode", 600000, 8)
			for i := 0; i < tc.running; i++ {
				var tk LoadTicket
				require.NoError(t, l.acquireInto(&tk, 7, 100, 100, 0, now-1))
				require.NoError(t, l.FirstChunk(&tk, now))
			}
			var tk LoadTicket
			require.NoError(t, l.acquireInto(&tk, 7, 100, 100, 0, now))
			tk.DueMS, tk.Cached = now+10, tc.cached
			require.NoError(t, l.FirstChunk(&tk, now+tc.lateMS))
			got := make([]Load, 1)
			require.NoError(t, l.LoadsInto(now+tc.lateMS, func(id uint64) int {
				if id == 7 {
					return 0
				}
				return -1
			}, got))
			assert.Equal(t, tc.seen, got[0].FullRunning)
			assert.Equal(t, tc.seen != 0, got[0].FullAt == now+tc.lateMS)
		})
	}
}

func TestDecodeStaysAreSharedAndHalved(t *testing.T) {
	// Two replies on target 7 decode 3 s and 1 s from their first chunk to their
	// release; a third, whose first chunk never came, adds nothing. Another VM reads
	// both stays from the shared key (each end counts countUnit); a half-life later
	// each counts half.
	store := state.NewMemoryStore()
	now := int64(stayHalfLifeMS) * 100
	l := NewLoadLedger(store, "ns", "decode", 600000, 8)
	for _, ms := range []int64{3000, 1000, 0} {
		tk, err := l.Acquire(7, 100, now)
		require.NoError(t, err)
		if ms > 0 {
			tk.ChunkMS = now - ms
		}
		require.NoError(t, l.Release(tk, func() int64 { return now }))
	}
	require.NoError(t, l.Flush(now))
	index := func(id uint64) int {
		if id == 7 {
			return 0
		}
		return -1
	}
	got := make([]Load, 1)
	require.NoError(t, NewLoadLedger(store, "ns", "decode", 600000, 8).LoadsInto(now, index, got))
	assert.Equal(t, [2]int64{4000, 2 * countUnit}, [2]int64{got[0].StayMS, got[0].Stays})
	got[0] = Load{}
	require.NoError(t, NewLoadLedger(store, "ns", "decode", 600000, 8).LoadsInto(now+stayHalfLifeMS, index, got))
	assert.Equal(t, [2]int64{2000, countUnit}, [2]int64{got[0].StayMS, got[0].Stays})
	// Eight half-lives later, a fraction of an end still counts with its ms.
	got[0] = Load{}
	require.NoError(t, NewLoadLedger(store, "ns", "decode", 600000, 8).LoadsInto(now+8*stayHalfLifeMS, index, got))
	assert.Equal(t, [2]int64{4000 >> 8, 2 * countUnit >> 8}, [2]int64{got[0].StayMS, got[0].Stays})
}

func TestMeanStayCountsTheRepliesStillDecoding(t *testing.T) {
	// Ten replies decode on target 0 for a second (its requests past their first
	// chunk: twelve in flight, two of them still prefilling); two that ended lasted
	// 100 ms each. The decode time over the ends reads 5 s, the ends' own mean 100 ms:
	// the stay is their geometric mean. With no end there is no stay; with the ends'
	// own mean the longer, it is theirs. The decode time halves with the stays, each
	// ms from when it passed, and a view's count holds until the next view.
	p := &poolState{}
	now := int64(stayHalfLifeMS) * 100
	loads := []Load{{Requests: 12, Prefills: 2}, {}}
	p.addDecodeTime(loads, now)
	p.viewed = true
	p.addDecodeTime(loads, now+1000)
	v := &poolView{pool: p, loads: []Load{{StayMS: 200, Stays: 2 * countUnit}, {}}}
	assert.InDelta(t, math.Sqrt(100*5000), v.meanStay(), 1e-9)
	v.loads[0] = Load{}
	assert.Zero(t, v.meanStay())
	v.loads[1] = Load{StayMS: 2 * 8000, Stays: 2 * countUnit}
	assert.InDelta(t, 8000, v.meanStay(), 1e-9)
	loads[0] = Load{}
	p.addDecodeTime(loads, now+stayHalfLifeMS)
	assert.InDelta(t, 10*1000/2+10*(stayHalfLifeMS-1000)/2, p.decodeTime, 1e-9)
	p.addDecodeTime(loads, now+stayHalfLifeMS+500)
	assert.InDelta(t, 10*1000/2+10*(stayHalfLifeMS-1000)/2, p.decodeTime, 1e-9)
	// Ten decoding through a hundred half-lives count a half-life and the 500 ms since
	// the last halving: what passed before has halved away.
	loads[0] = Load{Requests: 10}
	p.addDecodeTime(loads, now+stayHalfLifeMS+500)
	p.addDecodeTime(loads, now+101*stayHalfLifeMS+500)
	assert.InDelta(t, 10*(stayHalfLifeMS+500), p.decodeTime, 1e-6)
}
