package routing

import (
	"cmp"
	"math/rand"
	"testing"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/extract"
	"github.com/kvroute/kvroute/routing/state"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPrefillAheadAtTheObservedRate(t *testing.T) {
	// 6000 tokens queued, all ahead at 1000 ms, on a target seen computing 12 000
	// tokens in 1000 ms (12 a ms).
	l := Load{Prefill: 6000, Since: 1000, RateTokens: 12000, RateMS: 1000}
	assert.Equal(t, int64(6000), l.PrefillAhead(1000))
	assert.Equal(t, int64(3000), l.PrefillAhead(1250), "250 ms × 12 = 3000 computed")
	assert.Equal(t, int64(0), l.PrefillAhead(1500), "drained at 1500")
	assert.Equal(t, int64(0), l.PrefillAhead(9000), "never below 0")
	assert.Equal(t, int64(6000), l.PrefillAhead(900), "a clock behind Since counts nothing computed")

	noRate := l
	noRate.RateTokens, noRate.RateMS = 0, 0
	assert.Equal(t, int64(6000), noRate.PrefillAhead(9000), "no rate seen: all of it is ahead")
	noSince := l
	noSince.Since = 0
	assert.Equal(t, int64(6000), noSince.PrefillAhead(9000), "never known ahead: all of it")

	// A request sent while some is ahead leaves Since alone; one sent after the
	// estimated drain starts its own prefill now: Since moves to the drain time,
	// 1500 (2000 − 6000 / 12).
	assert.Equal(t, int64(0), l.SinceAfterSend(1250))
	assert.Equal(t, int64(1500), l.SinceAfterSend(2000))
	after := l
	after.Prefill, after.Since = 6000+2400, 1500
	assert.Equal(t, int64(2400), after.PrefillAhead(2000), "only the new request's 2400 tokens are ahead")
	assert.Equal(t, int64(2000), (&Load{}).SinceAfterSend(2000), "an empty queue starts now")
	assert.Equal(t, int64(0), noRate.SinceAfterSend(2000), "without a rate the queue is never estimated drained")
}

// targetLoad is target id's load as ledger l sees it at now.
func targetLoad(t *testing.T, l *LoadLedger, id uint64, now int64) Load {
	t.Helper()
	var out [1]Load
	require.NoError(t, l.LoadsInto(now, func(t uint64) int {
		if t == id {
			return 0
		}
		return -1
	}, out[:]))
	return out[0]
}

func TestAQueueOverdueTwiceItsTimeIsStalled(t *testing.T) {
	// 6000 tokens queued since 1000 ms at 12 a ms: due at 1500, stalled past 2000.
	l := Load{Prefill: 6000, Since: 1000, RateTokens: 12000, RateMS: 1000}
	assert.False(t, l.Stalled(1500), "due")
	assert.False(t, l.Stalled(2000), "twice its time")
	assert.True(t, l.Stalled(2001), "more than twice its time")
	for name, no := range map[string]Load{
		"nothing queued": {Since: 1000, RateTokens: 12000, RateMS: 1000},
		"no rate seen":   {Prefill: 6000, Since: 1000},
		"never ahead":    {Prefill: 6000, RateTokens: 12000, RateMS: 1000},
	} {
		assert.False(t, no.Stalled(1e6), name)
	}
}

func TestFirstChunksTeachATargetsPrefillRate(t *testing.T) {
	const id = 77
	l := NewLoadLedger(state.NewMemoryStore(), "kvroute", "decode", 600_000, 8)
	one := func(now int64) Load { return targetLoad(t, l, id, now) }
	// A: 4000 uncached tokens sent at 1000 to an idle target (its prefill starts
	// then); B: 2000 more at 1100, behind A.
	a, err := l.AcquireQueued(id, 4000, 4000, 1000, 1000)
	require.NoError(t, err)
	b, err := l.AcquireQueued(id, 2000, 2000, 0, 1100)
	require.NoError(t, err)
	got := one(1100)
	assert.Equal(t, int64(2), got.Prefills)
	assert.Equal(t, int64(6000), got.PrefillAhead(1100), "no rate yet: all queued is ahead")

	// A's first chunk at 1400: 4000 tokens in 400 ms; B starts.
	require.NoError(t, l.FirstChunk(&a, 1400))
	got = one(1400)
	assert.Equal(t, Load{Requests: 2, Prefills: 1, Tokens: 6000, Prefill: 2000, Written: 6000,
		Recent: 6000, RecentSent: 2 * countUnit, Since: 1400, Chunk: 1400, RateTokens: 4000, RateMS: 400}, got)
	assert.Equal(t, int64(1000), got.PrefillAhead(1500), "10 a ms for 100 ms")

	// B's first chunk at 1600: its prefill ran from A's chunk (after its send), 200 ms.
	require.NoError(t, l.FirstChunk(&b, 1600))
	require.NoError(t, l.Flush(1600))
	got = one(1600)
	assert.Equal(t, int64(0), got.Prefills)
	assert.Equal(t, int64(6000), got.RateTokens)
	assert.Equal(t, int64(600), got.RateMS)
	assert.Equal(t, int64(1600), got.Since)

	// Another VM's ledger reads the same progress from the shared key.
	other := NewLoadLedger(l.store, "kvroute", "decode", 600_000, 8)
	assert.Equal(t, got, targetLoad(t, other, id, 1600))
}

func TestRateSumsAreHalvedPastTheirWindow(t *testing.T) {
	const id = 5
	store := state.NewMemoryStore()
	l := NewLoadLedger(store, "kvroute", "decode", 600_000, 8)
	now := int64(1_000_000)
	for i := 0; i < 40; i++ { // 40 prefills of 2000 tokens taking 2000 ms each: 80 s
		tk, err := l.AcquireQueued(id, 2000, 2000, 0, now)
		require.NoError(t, err)
		now += 2000
		require.NoError(t, l.FirstChunk(&tk, now))
		require.NoError(t, l.Release(tk, func() int64 { return now }))
	}
	require.NoError(t, l.Flush(now))
	e := decodeLedger(l.seen, l.oldestLiveEpoch(now), now)
	require.Len(t, e, 1)
	assert.LessOrEqual(t, e[0].rateMS, int64(rateWindowMS))
	assert.Greater(t, e[0].rateMS, int64(rateWindowMS/2))
	assert.Equal(t, e[0].rateMS, e[0].rateTok, "the rate itself, 1 a ms, is kept")
}

func TestCostWeighsTheQueuedPrefillsAPromptWouldDelay(t *testing.T) {
	// Ahead: 8500 tokens in one prefill on the first target, 8000 in eight short ones
	// on the second, 9000 in one on the third. A request computes its prompt alongside
	// the prefills queued where it goes, delaying each of them: a 4000-token prompt
	// costs (no cache, no decode load) 8500 + (4 + 1) × 4000 = 28500, 8000 + (4 + 8) ×
	// 4000 = 56000 and 9000 + (4 + 1) × 4000 = 29000. By tokens ahead alone the
	// second would win.
	cfg := testConfig(t, `,"balance":{"fair_share_multiplier":100,"load_weight":0},"prefix":{"enabled":false}`)
	r := NewRouter(cfg, state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	ts := r.DecodeTargets()
	_, err := r.decode.ledger.AcquireQueued(ts[0].ID, 8500, 8500, 0, 1e6)
	require.NoError(t, err)
	for k := 0; k < 8; k++ {
		_, err := r.decode.ledger.AcquireQueued(ts[1].ID, 1000, 1000, 0, 1e6)
		require.NoError(t, err)
	}
	_, err = r.decode.ledger.AcquireQueued(ts[2].ID, 9000, 9000, 0, 1e6)
	require.NoError(t, err)
	d := r.Decide(&extract.Request{Tokens: 4000, Identity: 1}, NoRank)
	assert.Equal(t, ts[0].Address, d.Target.Address)
	// A short prompt delays the short prefills little: now 12500 + 6 × 100 = 13100,
	// 8000 + 12 × 100 = 9200 and 9000 + 5 × 100 = 9500.
	d2 := r.Decide(&extract.Request{Tokens: 100, Identity: 2}, NoRank)
	assert.Equal(t, ts[1].Address, d2.Target.Address)
}

func TestAPrefillEstimatedOverNoLongerRepels(t *testing.T) {
	// The document's target learns its rate from the document's own prefill (2000
	// tokens in 200 ms: 10 a ms). Then a 9000-token prompt is sent there. A request
	// sharing the document avoids the target while most of those 9000 tokens are
	// estimated ahead, and goes there for its cache once they are estimated done,
	// though their first chunk has not come back.
	cfg := testConfig(t, `,"balance":{"fair_share_multiplier":100}`)
	rng := rand.New(rand.NewSource(4))
	doc := words(rng, 8000) // 2000 tokens
	for _, elapsed := range []int64{100, 1000} {
		clock := &fakeClock{ms: 1e6}
		r := NewRouter(cfg, state.NewMemoryStore(), clock.now)
		first := r.Decide(textRequest(doc, 1), NoRank)
		clock.ms += 200
		require.NoError(t, r.FirstChunk(&first.Ticket))
		_, err := r.decode.ledger.AcquireQueued(first.Target.ID, 9000, 9000, 0, clock.ms)
		require.NoError(t, err)
		clock.ms += elapsed
		d := r.Decide(textRequest(doc+words(rng, 8000), 2), NoRank)
		if elapsed < 900 {
			assert.NotEqual(t, first.Target.Address, d.Target.Address, "8000 tokens still ahead")
		} else {
			assert.Equal(t, first.Target.Address, d.Target.Address, "the 9000 tokens are computed by now")
			assert.Equal(t, KindPrefix, d.Kind)
		}
	}
}

func TestATargetWithoutARateIsEstimatedAtItsPeers(t *testing.T) {
	// Two targets. A has shown its rate (1000 tokens in 100 ms: 10 a ms) and has 2500
	// tokens queued since 2000; B has 4000 tokens queued since 1750 and no first
	// chunk yet. At 2050 A has 2000 left; B, at its peers' rate, 1000: a new
	// 1000-token prompt goes to B. Counting all of B's queue as ahead, it went to A.
	js := `{"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"}]}},"balance":{"fair_share_multiplier":100}}`
	cfg, err := config.ParseConfig([]byte(js))
	require.NoError(t, err)
	clock := &fakeClock{ms: 1000}
	r := NewRouter(&cfg, state.NewMemoryStore(), clock.now)
	ts := r.DecodeTargets()
	a, b := ts[0].ID, ts[1].ID
	l := r.decode.ledger
	t1, err := l.AcquireQueued(a, 1000, 1000, 1000, 1000)
	require.NoError(t, err)
	require.NoError(t, l.FirstChunk(&t1, 1100))
	require.NoError(t, l.Release(t1, clock.now))
	_, err = l.AcquireQueued(b, 4000, 4000, 1750, 1750)
	require.NoError(t, err)
	_, err = l.AcquireQueued(a, 2500, 2500, 2000, 2000)
	require.NoError(t, err)
	clock.ms = 2050
	d := r.Decide(textRequest(words(rand.New(rand.NewSource(13)), 4000), 1), NoRank)
	assert.Equal(t, b, d.Target.ID, "B's 4000 tokens are 3000 computed at its peers' rate")
}

// A first chunk reads its target's progress and cache without walking every
// target's load, and learns its news into the cache once: what it reads, and what the
// view then shows, are what the whole view and the batch's news in order give,
// whatever the other VM wrote and this one has not, over a random run of sends (some
// for copies), first chunks, releases and flushes.
func TestAFirstChunkReadsTheProgressTheViewShows(t *testing.T) {
	store := state.NewMemoryStore()
	vms := []*LoadLedger{NewLoadLedger(store, "ns", "decode", 600000, 8), NewLoadLedger(store, "ns", "decode", 600000, 8)}
	for _, l := range vms {
		l.configuredCache = 60000
	}
	targets := []uint64{11, 22, 33, 44, 55}
	index := func(id uint64) int {
		for i, t := range targets {
			if t == id {
				return i
			}
		}
		return -1
	}
	rng := rand.New(rand.NewSource(7))
	var open [2][]LoadTicket
	now := int64(1_000_000)
	progressSeen, news, gone := 0, 0, 0
	for step := 0; step < 4000; step++ {
		now += int64(rng.Intn(40))
		v := rng.Intn(2)
		l := vms[v]
		switch op := rng.Intn(10); {
		case op < 4:
			tk, err := l.AcquireQueued(targets[rng.Intn(len(targets)-1)], 500, int64(1+rng.Intn(400)), 0, now)
			require.NoError(t, err)
			if rng.Intn(2) == 0 {
				tk.Cached, tk.CacheAge = 2*tk.Prefill+int64(rng.Intn(400)), int64(rng.Intn(70000))
			}
			open[v] = append(open[v], tk)
		case op < 7 && len(open[v]) > 0:
			i := rng.Intn(len(open[v]))
			before := len(l.reports)
			require.NoError(t, l.FirstChunk(&open[v][i], now))
			news += len(l.reports) - before
			if len(l.reports) > before && l.reports[before].hit < 0 {
				gone++
			}
		case op < 9 && len(open[v]) > 0:
			i := rng.Intn(len(open[v]))
			require.NoError(t, l.Release(open[v][i], func() int64 { return now }))
			open[v] = append(open[v][:i], open[v][i+1:]...)
		default:
			require.NoError(t, l.Flush(now))
		}
		for _, l := range vms {
			view := make([]Load, len(targets))
			require.NoError(t, l.LoadsInto(now, index, view))
			for i, target := range targets {
				chunk, rateTok, rateMS, cache := l.progressOf(target)
				require.Equal(t, [3]int64{view[i].Chunk, view[i].RateTokens, view[i].RateMS}, [3]int64{chunk, rateTok, rateMS},
					"step %d, target %d", step, target)
				for k := range l.reports {
					if c := &l.reports[k]; c.target == target {
						cache = learnCache(cache, cmp.Or(c.limit, l.configuredCache), c)
					}
				}
				require.Equal(t, cache, view[i].Cache, "step %d, target %d: the cache after the batch's news in order", step, target)
				if rateMS > 0 {
					progressSeen++
				}
			}
		}
	}
	// Both halves of the view were read, the key's and the VM's batch, and news came
	// of copies there and gone.
	require.Greater(t, progressSeen, 1000)
	require.Greater(t, news, 100)
	require.Greater(t, gone, 10)
}
