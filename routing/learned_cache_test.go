package routing

import (
	"fmt"
	"math/rand"
	"strconv"
	"testing"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/engine"
	"github.com/kvroute/kvroute/routing/prefix"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCacheNewsOfAFirstChunk(t *testing.T) {
	// A target computing 10 tokens a ms; the request had 100 tokens of its own and
	// was sent for 2000 cached ones.
	rate := Load{RateTokens: 1000, RateMS: 100}
	sent := LoadTicket{Prefill: 100, Cached: 2000}
	for _, c := range []struct {
		name   string
		ticket LoadTicket
		load   Load
		took   int64
		want   int8
	}{
		{"its own tokens' time: there", sent, rate, 12, 1},
		{"a quarter of the copy's time more: still there", sent, rate, 60, 1},
		{"the whole prompt's time: gone", sent, rate, 210, -1},
		{"three quarters of the copy's time more: gone", sent, rate, 160, -1},
		{"in between: unsure", sent, rate, 100, 0},
		{"far longer than the whole prompt: it waited for something else", sent, rate, 400, 0},
		{"no rate seen yet", sent, Load{}, 210, 0},
		{"a copy under twice the own tokens: too small to tell", LoadTicket{Prefill: 1100, Cached: 2000}, rate, 3100, 0},
		{"no copy", LoadTicket{Prefill: 100}, rate, 210, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, cacheNews(&c.ticket, c.took, c.load.RateTokens, c.load.RateMS))
		})
	}
}

func TestLearnCache(t *testing.T) {
	type news struct {
		limit int64
		d     *cacheReport
	}
	miss := func(age, limit int64) news { return news{limit, &cacheReport{hit: -1, age: age}} }
	hit := func(age, limit int64) news { return news{limit, &cacheReport{hit: 1, age: age}} }
	for _, c := range []struct {
		name  string
		cache int64
		news  news
		want  int64
	}{
		{"nothing known, a copy gone: the cache is its age", 0, miss(5000, 0), 5000},
		{"nothing learned, a copy gone under the stated cache: a twentieth down", 0, miss(5000, 8000), 7600},
		{"a copy gone just under the cache: down to its age at most", 8000, miss(7900, 0), 7900},
		{"a copy gone older than the cache: nothing new", 8000, miss(9000, 0), 8000},
		{"a copy there near the cache: a tenth up", 8000, hit(7000, 0), 8800},
		{"a copy there older than the cache: up to its age", 8000, hit(9500, 0), 9500},
		{"a copy there far under the cache: nothing new", 8000, hit(3000, 0), 8000},
		{"nothing known, a copy there: still nothing known", 0, hit(3000, 0), 0},
		{"a copy there near the stated cache: up to it, no further", 8000, hit(7000, 8500), 8500},
		{"a copy there older than the stated cache: the stated cache", 8000, hit(9500, 8500), 8500},
		{"a learned cache over a smaller report: the report", 9000, hit(3000, 8000), 8000},
		{"a learned cache over a smaller report, a copy gone: a twentieth down from it", 9000, miss(7000, 8000), 7600},
		{"a learned cache over a smaller report, a copy gone older than it: the report", 9000, miss(8500, 8000), 8000},
		{"a copy there near the cache, the stated one larger: a tenth up", 8000, hit(7000, 10000), 8800},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, learnCache(c.cache, c.news.limit, c.news.d))
		})
	}
}

func TestALearnedCacheIsSharedByTheLedger(t *testing.T) {
	const id = 42
	store := state.NewMemoryStore()
	l := NewLoadLedger(store, "kvroute", "decode", 600_000, 8)
	one := func(l *LoadLedger, now int64) Load { return targetLoad(t, l, id, now) }
	// A 1000-token prompt teaches the rate (10 tokens a ms); a request sent for a
	// 4000-token copy 6000 tokens old comes back after the whole prompt's time: the
	// cache is learned as 10000, the writes since the copy and the copy itself.
	a, err := l.AcquireQueued(id, 1000, 1000, 1000, 1000)
	require.NoError(t, err)
	require.NoError(t, l.FirstChunk(&a, 1100))
	b, err := l.AcquireQueued(id, 4100, 100, 0, 2000)
	require.NoError(t, err)
	b.Cached, b.CacheAge = 4000, 6000
	require.NoError(t, l.FirstChunk(&b, 2410))
	assert.Equal(t, int64(10000), one(l, 2410).Cache, "this VM sees its news at once")
	assert.Equal(t, int64(5100), one(l, 2410).RateTokens, "the copy was computed again: it counts in the rate")
	require.NoError(t, l.Flush(2410))
	other := NewLoadLedger(store, "kvroute", "decode", 600_000, 8)
	assert.Equal(t, int64(10000), one(other, 2410).Cache, "another VM reads it from the shared key")
	require.NoError(t, l.Release(a, func() int64 { return 3000 }))
	require.NoError(t, l.Release(b, func() int64 { return 3000 }))
	require.NoError(t, l.Flush(3000))
	assert.Equal(t, int64(10000), one(other, 3000).Cache, "a target without load keeps what was learned")
}

func TestACopyThereNeverTakesTheCacheOverItsLimit(t *testing.T) {
	// A 1000-token prompt teaches the rate (10 tokens a ms); a request sent for a
	// 4000-token copy 5000 tokens old comes back in its own tokens' time: the copy,
	// 9000 tokens with the writes since, was there, past 4/5 of a 10000-token cache.
	// Learning takes the cache a tenth up, unless 10000 is the size stated (the
	// ledger's) or reported (the ticket's): then it stays there.
	const id = 42
	for _, c := range []struct {
		name              string
		configured, limit int64
		want              int64
	}{{"stated", 10000, 0, 10000}, {"reported", 0, 10000, 10000}, {"learned from a first copy gone, no size known", 0, 0, 11000}} {
		t.Run(c.name, func(t *testing.T) {
			store := state.NewMemoryStore()
			l := NewLoadLedger(store, "kvroute", "decode", 600_000, 8)
			l.configuredCache = c.configured
			a, err := l.AcquireQueued(id, 1000, 1000, 1000, 1000)
			require.NoError(t, err)
			require.NoError(t, l.FirstChunk(&a, 1100))
			if c.configured == 0 && c.limit == 0 {
				// No size known: a copy found gone 10000 tokens old teaches one.
				g, err := l.AcquireQueued(id, 4100, 100, 0, 1200)
				require.NoError(t, err)
				g.Cached, g.CacheAge = 4000, 6000
				require.NoError(t, l.FirstChunk(&g, 1610))
				require.Equal(t, int64(10000), targetLoad(t, l, id, 1610).Cache)
			}
			b, err := l.AcquireQueued(id, 4100, 100, 0, 2000)
			require.NoError(t, err)
			b.Cached, b.CacheAge, b.CacheLimit = 4000, 5000, c.limit
			require.NoError(t, l.FirstChunk(&b, 2012))
			assert.Equal(t, c.want, targetLoad(t, l, id, 2012).Cache)
			require.NoError(t, l.Flush(2012))
			other := NewLoadLedger(store, "kvroute", "decode", 600_000, 8)
			assert.Equal(t, c.want, targetLoad(t, other, id, 2012).Cache, "in the shared key")
		})
	}
}

func TestAFirstChunkThatShowsACopyGoneTeachesTheCache(t *testing.T) {
	// No cache configured: every copy recorded counts as held. Document E is
	// recorded on target X, then document D (2000 tokens) is computed there in 200
	// ms (10 tokens a ms). X then takes in 5000 tokens of other work, and a
	// continuation of D goes to X for its copy. If its first chunk comes back in
	// the time of its own 100 tokens, the copy was there and nothing is learned: E
	// still counts as held on X. If it comes back in the whole prompt's time, the
	// copy was gone: X's cache is learned as that copy's age and size, and E, older
	// by D's 2000 tokens, no longer counts as held there, not even its head. With a cache of 100000 tokens configured, the
	// same news takes it only a twentieth down, and E still counts as held.
	rng := rand.New(rand.NewSource(11))
	d, e := words(rng, 8000), words(rng, 8000)
	for _, c := range []struct {
		name, cache string
		took        int64
		kind        Kind
	}{{"there", "0", 10, KindContinuation}, {"gone", "0", 210, KindLoad}, {"gone, configured", "100000", 210, KindContinuation}} {
		t.Run(c.name, func(t *testing.T) {
			clock := &fakeClock{ms: 1e6}
			r := NewRouter(testConfig(t, `,"balance":{"fair_share_multiplier":100},"prefix":{"target_cache_tokens":`+c.cache+`}`), state.NewMemoryStore(), clock.now)
			first := r.Decide(textRequest(d, 1), NoRank)
			x := first.Target.ID
			clock.ms += 200
			require.NoError(t, r.FirstChunk(&first.Ticket))
			require.NoError(t, r.Release(first.Ticket))
			docE := textRequest(e, 2)
			cps, _ := prefix.HashCheckpoints(docE.Model, docE.Prompt, docE.BlockBytes, nil)
			r.decode.index.Record(cps, x, 0, 0)
			other, err := r.decode.ledger.AcquireQueued(x, 5000, 5000, 0, clock.ms)
			require.NoError(t, err)
			require.NoError(t, r.decode.ledger.Release(other, clock.now))

			clock.ms += 1000
			next := r.Decide(textRequest(d+words(rng, 400), 3), NoRank)
			require.Equal(t, KindContinuation, next.Kind)
			require.Equal(t, x, next.Target.ID)
			// Both to the index's grid: D's copy as its deepest checkpoint (120 of its
			// 125 blocks), its age in whole blocks.
			assert.Equal(t, int64(1920), next.Ticket.Cached)
			assert.InDelta(t, 5000, next.Ticket.CacheAge, 16)
			assert.Equal(t, c.cache, strconv.FormatInt(next.Ticket.CacheLimit, 10), "the stated cache bounds the learning")
			clock.ms += c.took
			require.NoError(t, r.FirstChunk(&next.Ticket))
			require.NoError(t, r.Release(next.Ticket))

			last := r.Decide(textRequest(e+words(rng, 400), 4), NoRank)
			assert.Equal(t, c.kind, last.Kind)
		})
	}
}

func TestADisaggregatedRequestTeachesNoCache(t *testing.T) {
	// A continuation sent to its decode target for the copy there, with its prefill
	// on the prefill pool: the decode target's first chunk comes after another
	// engine's work, so it says nothing of the decode target's cache.
	for _, c := range []struct {
		disagg string
		news   bool
	}{{`{"mode":"off"}`, true}, {`{"mode":"sidecar","threshold_tokens":0}`, false}} {
		rng := rand.New(rand.NewSource(12))
		doc := words(rng, 8000)
		r := NewRouter(pdConfig(t, c.disagg), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
		first := r.Decide(textRequest(doc, 1), NoRank)
		require.NoError(t, r.Release(first.Ticket))
		next := r.Decide(textRequest(doc+words(rng, 400), 2), NoRank)
		assert.Equal(t, first.Target.ID, next.Target.ID)
		assert.Equal(t, c.news, next.Ticket.Cached > 0, c.disagg)
	}
}

func TestAnEngineReportedCacheIsWhereTheLearningStarts(t *testing.T) {
	// As TestAFirstChunkThatShowsACopyGoneTeachesTheCache's "gone": a continuation's
	// first chunk shows its 5000-token-old copy of 1920 tokens gone. With nothing
	// configured or reported the cache is learned as that age and size; with the
	// engine reporting 100000 tokens it goes a twentieth down from there, and the
	// report stays the most it may learn. A report that comes after the decision,
	// before its first chunk, bounds the news all the same.
	for _, c := range []struct {
		reported float64
		late     bool
		want     int64
	}{{0, false, 6920}, {100000, false, 95000}, {100000, true, 95000}} {
		rng := rand.New(rand.NewSource(11))
		d := words(rng, 8000)
		clock := &fakeClock{ms: 1e6}
		store := state.NewMemoryStore()
		cfg := testConfig(t, `,"balance":{"fair_share_multiplier":100},"engine_metrics":{"enabled":true,"stale_ms":60000}`)
		r := NewRouter(cfg, store, clock.now)
		first := r.Decide(textRequest(d, 1), NoRank)
		x := first.Target.ID
		clock.ms += 200
		require.NoError(t, r.FirstChunk(&first.Ticket))
		require.NoError(t, r.Release(first.Ticket))
		report := func() {
			require.NoError(t, r.PublishEngineFigures(false, first.Target.Address, map[int]engine.EngineFigures{first.Target.Rank: {CacheTokens: c.reported}}))
		}
		if c.reported > 0 && !c.late {
			report()
		}
		other, err := r.decode.ledger.AcquireQueued(x, 5000, 5000, 0, clock.ms)
		require.NoError(t, err)
		require.NoError(t, r.decode.ledger.Release(other, clock.now))
		clock.ms += 1000
		next := r.Decide(textRequest(d+words(rng, 400), 3), NoRank)
		require.Equal(t, x, next.Target.ID)
		if c.late {
			assert.Zero(t, next.Ticket.CacheLimit)
			report()
			// Another request's decision reads the board.
			clock.ms += engineReadMS
			unrelated := r.Decide(textRequest(words(rng, 300), 5), NoRank)
			require.NoError(t, r.Release(unrelated.Ticket))
		} else {
			assert.Equal(t, int64(c.reported), next.Ticket.CacheLimit)
		}
		clock.ms += 210
		require.NoError(t, r.FirstChunk(&next.Ticket))
		learned := targetLoad(t, r.decode.ledger, x, clock.ms).Cache
		assert.InDelta(t, c.want, learned, 16, "reported %v", c.reported)
		// The same in the shared ledger, where every VM reads it.
		require.NoError(t, r.decode.ledger.Flush(clock.ms))
		peer := NewRouter(cfg, store, clock.now)
		assert.InDelta(t, c.want, targetLoad(t, peer.decode.ledger, x, clock.ms).Cache, 16, "reported %v, another VM", c.reported)
		// The next decision still takes the reported size as the most it may learn.
		again := r.Decide(textRequest(d+words(rng, 800), 4), NoRank)
		require.Equal(t, x, again.Target.ID)
		assert.Equal(t, int64(c.reported), again.Ticket.CacheLimit, "reported %v, learned %v", c.reported, learned)
		// Once learned, the cache is the learned one while the engine reports more,
		// and the engine's size when it reports less: it never holds more.
		for _, later := range []struct{ reported, want float64 }{{300000, float64(c.want)}, {4000, 4000}} {
			require.NoError(t, r.PublishEngineFigures(false, first.Target.Address, map[int]engine.EngineFigures{first.Target.Rank: {CacheTokens: later.reported}}))
			clock.ms += engineReadMS
			v, err := r.view(r.decode, NoRank, clock.ms)
			require.NoError(t, err)
			assert.InDelta(t, later.want, v.loads[r.decode.targets.Index(x)].Cache, 16, "reported %v, then %v", c.reported, later.reported)
		}
	}
}

// historyBehindAHead states a cache of cache tokens. Target X computes a 2000-token
// system prompt and a 2000-token history after it (10 tokens a ms), then the same
// system prompt with another 2000-token question, which makes its head younger there
// than the history's copy. The history's continuation is sent to X for both; its
// first chunk comes back after the time of the history's tail past the system
// prompt: the tail was gone. It returns the continuation's ticket as sent and X's
// cache after the chunk.
func historyBehindAHead(t *testing.T, cache string) (sent LoadTicket, learned int64) {
	clock := &fakeClock{ms: 1e6}
	r := NewRouter(testConfig(t, `,"balance":{"fair_share_multiplier":100},"prefix":{"target_cache_tokens":`+cache+`}`), state.NewMemoryStore(), clock.now)
	rng := rand.New(rand.NewSource(13))
	system, history := words(rng, 8000), words(rng, 8000)
	done := func(d Decision, ms int64) {
		clock.ms += ms
		require.NoError(t, r.FirstChunk(&d.Ticket))
		require.NoError(t, r.Release(d.Ticket))
	}
	first := r.Decide(textRequest(system+history, 1), NoRank)
	x := first.Target.ID
	done(first, 400)
	other := r.Decide(textRequest(system+words(rng, 8000), 2), NoRank)
	require.Equal(t, x, other.Target.ID)
	done(other, 208)
	next := r.Decide(textRequest(system+history+words(rng, 400), 3), NoRank)
	require.Equal(t, KindContinuation, next.Kind)
	require.Equal(t, x, next.Target.ID)
	sent = next.Ticket
	done(next, 202)
	loads, err := r.Loads()
	require.NoError(t, err)
	return sent, loads[r.decode.targets.Index(x)].Cache
}

func TestAHistoryGoneBehindARefreshedSystemPromptTeachesTheCache(t *testing.T) {
	// With a cache of 16000 the head is younger than the history's copy by more than
	// an eighth of the cache. The ticket vouches for the history's tail alone (its
	// deepest checkpoint, 3840 tokens, less the system prompt's, 1920), at the tail's
	// age; the chunk shows it gone, and X's cache is learned a twentieth down.
	// Counted against the whole copy, the same chunk said nothing sure.
	sent, learned := historyBehindAHead(t, "16000")
	assert.Equal(t, int64(3840-1920), sent.Cached)
	// The writes since the history's copy: the other question's 2000 tokens and the
	// system prompt's 80 past its deepest checkpoint; then the head before the tail.
	assert.InDelta(t, 2080+1920, sent.CacheAge, 16)
	assert.Equal(t, int64(15200), learned)
}

func TestAYoungCopyIsJudgedWhole(t *testing.T) {
	// With a cache of 20000 the history's copy is 2080 tokens old, under an eighth of
	// the cache, which VMs may not hear of each other's records within. The ticket
	// vouches for the whole copy, and the same first chunk says nothing sure.
	sent, learned := historyBehindAHead(t, "20000")
	assert.Equal(t, int64(3840), sent.Cached)
	assert.Equal(t, int64(20000), learned, "the cache stated: nothing learned")
}

func TestAHistoryGoneBehindASystemPromptHeldEverywhereTeachesTheCache(t *testing.T) {
	// Two more targets than an index entry names, a cache of 16000 stated. X computes
	// a 2000-token system prompt and a 2000-token history, then 2080 tokens of other
	// work; as many other targets as an entry names record the system prompt since,
	// so its entry names them and no longer X: it is taken to be held everywhere. The
	// history's continuation on X vouches for the tail past it, and a first chunk in
	// the tail's time teaches the cache.
	cfg, err := config.ParseConfig([]byte(fmt.Sprintf(`{"balance":{"fair_share_multiplier":100},"prefix":{"target_cache_tokens":16000},
		"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":%d}]}}}`, prefix.TargetsPerEntry+2)))
	require.NoError(t, err)
	clock := &fakeClock{ms: 1e6}
	r := NewRouter(&cfg, state.NewMemoryStore(), clock.now)
	rng := rand.New(rand.NewSource(14))
	system, history := words(rng, 8000), words(rng, 8000)
	first := r.Decide(textRequest(system+history, 1), NoRank)
	x := first.Target.ID
	clock.ms += 400
	require.NoError(t, r.FirstChunk(&first.Ticket))
	require.NoError(t, r.Release(first.Ticket))
	other, err := r.decode.ledger.AcquireQueued(x, 2080, 2080, 0, clock.ms)
	require.NoError(t, err)
	clock.ms += 208
	require.NoError(t, r.decode.ledger.FirstChunk(&other, clock.ms))
	require.NoError(t, r.decode.ledger.Release(other, clock.now))
	req := textRequest(system+words(rng, 400), 2)
	cps, _ := prefix.HashCheckpoints(req.Model, req.Prompt, req.BlockBytes, nil)
	recorded := 0
	for _, tg := range r.DecodeTargets() {
		if tg.ID != x && recorded < prefix.TargetsPerEntry {
			r.decode.index.Record(cps, tg.ID, 0, 0)
			recorded++
		}
	}
	next := r.Decide(textRequest(system+history+words(rng, 400), 3), NoRank)
	require.Equal(t, x, next.Target.ID)
	assert.Equal(t, int64(3840-1920), next.Ticket.Cached)
	clock.ms += 202
	require.NoError(t, r.FirstChunk(&next.Ticket))
	loads, err := r.Loads()
	require.NoError(t, err)
	assert.Equal(t, int64(15200), loads[r.decode.targets.Index(x)].Cache)
}

// TestCacheNewsIsKeptApartFromTheBatchAndLearnedInOrder: six first chunks on one
// target show copies gone (each computed the whole prompt) at ages 5000, 4000, 4900,
// 6000, 3000 and 4500 tokens. Their deltas merge into the target's slot, as any
// other change to it does, so a VM's batch (and the walk every decision makes over
// it) does not grow with them; their news is learned in the order it came: 5000,
// then a twentieth down to 4750, two copies gone older than the cache teach
// nothing, 3000 takes it to 4513, 4500 to 4500. Another VM learns the same once
// the batch is written.
func TestCacheNewsIsKeptApartFromTheBatchAndLearnedInOrder(t *testing.T) {
	store, clock := state.NewMemoryStore(), &fakeClock{ms: 1e6}
	r, other := NewRouter(testConfig(t, ""), store, clock.now), NewRouter(testConfig(t, ""), store, clock.now)
	l := r.decode.ledger
	x := r.DecodeTargets()[0].ID
	first, err := l.AcquireQueued(x, 1000, 1000, 0, clock.ms)
	require.NoError(t, err)
	clock.ms += 100
	require.NoError(t, l.FirstChunk(&first, clock.ms))
	require.NoError(t, l.Release(first, clock.now))
	require.NoError(t, r.FlushLoad())

	for _, age := range []int64{5000, 4000, 4900, 6000, 3000, 4500} {
		tk, err := l.AcquireQueued(x, 2000, 100, 0, clock.ms)
		require.NoError(t, err)
		tk.Cached, tk.CacheAge = 1900, age-1900
		clock.ms += 200
		require.NoError(t, l.FirstChunk(&tk, clock.ms))
		require.NoError(t, l.Release(tk, clock.now))
	}
	assert.Len(t, l.reports, 6)
	assert.LessOrEqual(t, len(l.pending), 2, "the first chunks' deltas merge into their slots")
	loads, err := r.Loads()
	require.NoError(t, err)
	assert.Equal(t, int64(4500), loads[0].Cache)

	require.NoError(t, r.FlushLoad())
	require.NoError(t, other.FlushLoad())
	loads, err = other.Loads()
	require.NoError(t, err)
	assert.Equal(t, int64(4500), loads[0].Cache)
}
