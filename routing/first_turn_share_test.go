package routing

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/prefix"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// busyPrefill is the uncached tokens of each request shareCase sends a target that
// does not hold the prompt: four or more make it work lately at least half the
// prompt, so it is not idle (idleCandidate).
const busyPrefill = 300

// notIdle is the uncached tokens of a request that alone keeps a target from being
// idle: more than half the prompt.
const notIdle = 1200

// shareCase is a pool of endpoints × dp targets of which the first holders hold a
// system prompt of about 2000 tokens. Each holder first computes written tokens (one
// request, sent and done, its first chunk 100 ms later), then is sent gone requests
// whose first chunks show a copy of 2000 tokens gone (the whole prompt's time at that
// rate), then records the prompt and is sent running requests, still in flight; every
// other target is sent busy requests of busyPrefill uncached tokens, done. It returns
// the targets and where a new conversation on the prompt goes.
func shareCase(t *testing.T, endpoints, dp, holders, running, busy, gone int, written int64, extra string) (ts []Target, got Target) {
	t.Helper()
	return shareCaseIdle(t, endpoints, dp, holders, running, busy, gone, 0, busyPrefill, written, extra)
}

// shareCaseIdle is shareCase with the last idle targets sent nothing, and prefill
// uncached tokens in each busy request.
func shareCaseIdle(t *testing.T, endpoints, dp, holders, running, busy, gone, idle int, prefill, written int64, extra string) (ts []Target, got Target) {
	t.Helper()
	js := `{"pools":{"decode":{"endpoints":[`
	for e := 0; e < endpoints; e++ {
		if e > 0 {
			js += ","
		}
		js += fmt.Sprintf(`{"address":"10.0.0.%d:8000","dp_size":%d}`, e+1, dp)
	}
	cfg, err := config.ParseConfig([]byte(js + `]}}` + extra + `}`))
	require.NoError(t, err)
	clock := &fakeClock{ms: 1e6}
	r := NewRouter(&cfg, state.NewMemoryStore(), clock.now)
	rng := rand.New(rand.NewSource(41))
	system := words(rng, 8000)
	q := textRequest(system+words(rng, 400), 1)
	cps, _ := prefix.HashCheckpoints(q.Model, q.Prompt, q.BlockBytes, nil)
	ts = r.DecodeTargets()
	l := r.decode.ledger
	for j, tg := range ts {
		if j < holders {
			if written > 0 {
				tk, err := l.AcquireQueued(tg.ID, written, written, clock.ms, clock.ms)
				require.NoError(t, err)
				require.NoError(t, l.FirstChunk(&tk, clock.ms+100))
				require.NoError(t, l.Release(tk, clock.now))
			}
			for k := int64(0); k < int64(gone); k++ {
				sent := clock.ms + 200 + 100*k
				tk, err := l.AcquireQueued(tg.ID, 2100, 100, sent, sent)
				require.NoError(t, err)
				tk.Cached, tk.CacheAge = 2000, 100
				require.NoError(t, l.FirstChunk(&tk, sent+2100*100/written))
				require.NoError(t, l.Release(tk, clock.now))
			}
			r.decode.index.Record(cps, tg.ID, uint32(written/int64(cfg.Prefix.BlockTokens)), 0)
			for k := 0; k < running; k++ {
				_, err := l.Acquire(tg.ID, 100, clock.ms)
				require.NoError(t, err)
			}
			continue
		}
		for k := 0; k < busy && j < len(ts)-idle; k++ {
			tk, err := l.AcquireQueued(tg.ID, prefill+100, prefill, clock.ms, clock.ms)
			require.NoError(t, err)
			require.NoError(t, l.Release(tk, clock.now))
		}
	}
	clock.ms += 1000
	return ts, newConversation(t, r, system+words(rng, 400), 2, 7).Target
}

// heldBy reports whether got is one of the first holders targets.
func heldBy(ts []Target, holders int, got Target) bool {
	for _, tg := range ts[:holders] {
		if tg.ID == got.ID {
			return true
		}
	}
	return false
}

// A holder that carries most of the pool's requests keeps a long prompt's first turns
// until it runs as many as an engine has running slots (16, with none seen); then the
// prompt is computed again elsewhere, on a target that has worked less lately.
func TestFirstTurnsLeaveHoldersOverTheirShareAtTheSlots(t *testing.T) {
	for _, tc := range []struct {
		running int
		held    bool
	}{{15, true}, {16, false}} {
		ts, got := shareCaseIdle(t, 3, 1, 1, tc.running, 1, 0, 0, notIdle, 1000, "")
		assert.Equal(t, tc.held, heldBy(ts, 1, got), "running %d", tc.running)
	}
}

// Running sixteen or more is not enough while the holder carries no more than its
// share with one more holder: two of the three targets' share of the requests sent
// lately. The holder was sent 20; the others 16 each, or 5 (exactly two thirds of 30),
// or 4.
func TestFirstTurnsStayWithHoldersAtTheirShare(t *testing.T) {
	for _, tc := range []struct {
		running, busy int
		held          bool
	}{{16, 16, true}, {19, 5, true}, {19, 4, false}} {
		ts, got := shareCase(t, 3, 1, 1, tc.running, tc.busy, 0, 1000, "")
		assert.Equal(t, tc.held, heldBy(ts, 1, got), "others sent %d each", tc.busy)
	}
}

// A holder over its share that has lately written a quarter of its prefix cache loses
// the first turns, however few requests it runs: its conversations' histories would be
// evicted before their next turns.
func TestFirstTurnsLeaveHoldersThatTurnTheirCacheOver(t *testing.T) {
	for _, tc := range []struct {
		cache int
		held  bool
	}{{12016, true}, {12000, false}} {
		ts, got := shareCaseIdle(t, 3, 1, 1, 4, 1, 0, 0, notIdle, 3000, fmt.Sprintf(`,"prefix":{"target_cache_tokens":%d}`, tc.cache))
		assert.Equal(t, tc.held, heldBy(ts, 1, got), "cache %d", tc.cache)
	}
}

// In a pool of more than twice as many targets as an index entry names the holders are
// not made one fewer than it names this way: one more would fill the index entry,
// which counts the prompt as held everywhere.
func TestFirstTurnsMakeNoMoreHoldersThanCopiesByDemand(t *testing.T) {
	const w = prefix.TargetsPerEntry
	for _, tc := range []struct {
		holders int
		held    bool
	}{{w - 2, false}, {w - 1, true}} {
		ts, got := shareCase(t, w+2, 2, tc.holders, 16, 1, 0, 1000, "")
		assert.Equal(t, tc.held, heldBy(ts, tc.holders, got), "%d holders", tc.holders)
	}
}

// A holder whose first chunks have shown copies gone that its stated cache should have
// kept evicts its conversations' histories already: it loses the first turns as soon
// as it carries more than its own share, though not its share with one more holder,
// and though it runs few and has written little. It was sent 8 requests, the two
// others 4 each. Three copies found gone take its learned cache to 0.86 of the
// stated 100 000 tokens; two, to 0.90, are not yet enough.
func TestFirstTurnsLeaveHoldersThatLoseHistories(t *testing.T) {
	for _, tc := range []struct {
		gone int
		held bool
	}{{0, true}, {2, true}, {3, false}} {
		ts, got := shareCase(t, 3, 1, 1, 4, 4, tc.gone, 3000, `,"prefix":{"target_cache_tokens":100000}`)
		assert.Equal(t, tc.held, heldBy(ts, 1, got), "%d copies found gone", tc.gone)
	}
}

// While a target that holds nothing of the prompt is idle (it runs few and has computed
// little lately), holders that carry more than their own share lose the first turns
// at half the load that costs there otherwise, though not their share with one more
// holder: the copy puts an idle cache to work. Each holder has written a quarter of
// its 12 000-token cache, or an eighth, or just under, and was sent 5 requests; each
// busy target was sent 4 or 5 of 300 uncached tokens, the idle one none. In a pool of
// 12, a copy that would make as many holders as an index entry names would fill it,
// so one holder fewer keeps the turn; in a pool of 8 the entry names every target,
// and the last one takes it.
func TestFirstTurnsCopyOntoAnIdleTarget(t *testing.T) {
	const w = prefix.TargetsPerEntry
	for _, tc := range []struct {
		endpoints, dp, holders, busy, idle int
		written                            int64
		held                               bool
	}{
		{4, 1, 1, 4, 0, 3000, true},
		{4, 1, 1, 4, 1, 3000, false},
		{4, 1, 1, 4, 1, 1500, false},
		{4, 1, 1, 4, 1, 1400, true},
		{4, 2, 2, 5, 1, 3000, false},
		{4, 2, w - 1, 5, 1, 3000, false},
		{6, 2, w - 2, 5, 1, 3000, false},
		{6, 2, w - 1, 5, 1, 3000, true},
	} {
		ts, got := shareCaseIdle(t, tc.endpoints, tc.dp, tc.holders, 4, tc.busy, 0, tc.idle, busyPrefill, tc.written, `,"prefix":{"target_cache_tokens":12000}`)
		assert.Equal(t, tc.held, heldBy(ts, tc.holders, got), "%+v", tc)
		if !tc.held {
			assert.Equal(t, ts[len(ts)-1], got, "the idle target takes it")
		}
	}
}

// A holder's requests count at its rate against its share: a slower engine takes
// longer over each, and so over its conversations' later turns. Three targets each
// computed 2000 tokens, the others in a second and the holder in slow ms; the holder
// was then sent 19 requests more, the others 4 each: the holder's 20 are two thirds of
// the 30, its share with one more holder (as in TestFirstTurnsStayWithHoldersAtTheirShare),
// and its recent work a quarter of its stated cache. At a tenth slower the rates count
// as the same (sameRate) and the turn stays; at twice as slow its requests count for
// more than that share, and the prompt is computed again elsewhere.
func TestFirstTurnsLeaveASlowHolderAtItsShareByCount(t *testing.T) {
	for _, tc := range []struct {
		slow int64
		held bool
	}{{1100, true}, {2000, false}} {
		r, clock, rng, system, cps := promptRouter(t, 77, `,"prefix":{"target_cache_tokens":8000}`)
		ts := r.DecodeTargets()
		computeIn(t, r, clock, ts[0], 2000, tc.slow)
		for _, tg := range ts[1:] {
			computeIn(t, r, clock, tg, 2000, 1000)
		}
		clock.ms += tc.slow
		sendDone(t, r, clock, ts[0], 19, 10)
		sendDone(t, r, clock, ts[1], 4, 10)
		sendDone(t, r, clock, ts[2], 4, 10)
		got := firstTurnOnHeld(t, r, clock, rng, system, cps, ts[0])
		assert.Equal(t, tc.held, got.ID == ts[0].ID, "%+v", tc)
	}
}

func TestARankWithoutARateIsTakenAtItsEndpointsRate(t *testing.T) {
	// Two servers of two ranks: 10.0.0.1's rank 0 computes 4000 tokens in two
	// seconds, 10.0.0.2's in one; their ranks 1 have shown no rate. 10.0.0.2's rank 0
	// has 100 000 tokens queued, and its rank 1 runs one reply. A prompt of 10 000
	// tokens no rank caches is computed soonest on 10.0.0.2's rank 1, which shares a
	// server with the fast rank; taken at the pool's rate, the two ranks 1 would cost
	// the same but for the reply, and it would go to 10.0.0.1's.
	cfg, err := config.ParseConfig([]byte(`{"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":2},{"address":"10.0.0.2:8000","dp_size":2}]}}}`))
	require.NoError(t, err)
	clock := &fakeClock{ms: 1e6}
	r := NewRouter(&cfg, state.NewMemoryStore(), clock.now)
	ts := r.DecodeTargets()
	require.Equal(t, [4]string{"10.0.0.1:8000#0", "10.0.0.2:8000#0", "10.0.0.1:8000#1", "10.0.0.2:8000#1"},
		[4]string{fmt.Sprint(ts[0].Address, "#", ts[0].Rank), fmt.Sprint(ts[1].Address, "#", ts[1].Rank), fmt.Sprint(ts[2].Address, "#", ts[2].Rank), fmt.Sprint(ts[3].Address, "#", ts[3].Rank)})
	computeIn(t, r, clock, ts[0], 4000, 2000)
	computeIn(t, r, clock, ts[1], 4000, 1000)
	clock.ms += 2000
	l := r.decode.ledger
	_, err = l.AcquireQueued(ts[1].ID, 100000, 100000, clock.ms, clock.ms)
	require.NoError(t, err)
	reply, err := l.AcquireQueued(ts[3].ID, 1000, 0, clock.ms, clock.ms)
	require.NoError(t, err)
	require.NoError(t, l.FirstChunk(&reply, clock.ms))
	d := r.Decide(textRequest(words(rand.New(rand.NewSource(5)), 40000), 3), NoRank)
	assert.Equal(t, ts[3].ID, d.Target.ID, "%s rank %d, %s", d.Target.Address, d.Target.Rank, d.Kind)
}
