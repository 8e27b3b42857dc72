package routing

import (
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/extract"
	"github.com/kvroute/kvroute/routing/hashx"
	"github.com/kvroute/kvroute/routing/prefix"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAPrefixIsCopiedWhenItsDemandOutrunsItsHolder(t *testing.T) {
	// Target X computes a 2000-token document in 200 ms (10 tokens a ms). Then eight
	// requests on the document, each with 400 tokens of its own, arrive: 5 ms apart
	// they bring eight times what X computes, and the burst is copied to the other
	// targets from its first few requests on, while X's queue is still well under
	// what its copy is worth at ownWeight. A second apart, each answered before the
	// next, they all stay on X; so does a burst when X took 3 s for the document.
	rng := rand.New(rand.NewSource(31))
	doc := words(rng, 8000)
	for _, c := range []struct {
		name     string
		docMS    int64 // the time the document took to compute
		gapMS    int64
		answered bool
		targets  int
	}{
		{"a burst", 200, 5, false, 3},
		{"a second apart", 200, 1000, true, 1},
		// At 3000 ms a copy takes longer than the demand was measured over.
		{"a burst on a prefix slow to copy", 3000, 5, false, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := &fakeClock{ms: 1e6}
			r := NewRouter(testConfig(t, `,"balance":{"fair_share_multiplier":100}`), state.NewMemoryStore(), clock.now)
			first := r.Decide(textRequest(doc, 1), NoRank)
			clock.ms += c.docMS
			require.NoError(t, r.FirstChunk(&first.Ticket))
			require.NoError(t, r.Release(first.Ticket))
			used := map[uint64]int{}
			firstCopy := 0
			for i := 0; i < 8; i++ {
				clock.ms += c.gapMS
				d := r.Decide(textRequest(doc+words(rng, 1600), uint64(10+i)), NoRank)
				used[d.Target.ID]++
				if d.Target.ID != first.Target.ID && firstCopy == 0 {
					firstCopy = i + 1
					assert.Equal(t, KindLoad, d.Kind, "the copy goes where the document is not")
				}
				if c.answered {
					clock.ms += 60
					require.NoError(t, r.FirstChunk(&d.Ticket))
					require.NoError(t, r.Release(d.Ticket))
				}
			}
			assert.Len(t, used, c.targets, "targets used: %v", used)
			if c.targets > 1 {
				assert.LessOrEqual(t, firstCopy, 4, "copied within the burst's first requests")
				assert.Greater(t, used[first.Target.ID], 1, "the holder keeps taking its share")
			}
		})
	}
}

func TestAStalledHolderHasItsPrefixCopied(t *testing.T) {
	// Target X computes a 2000-token document in 200 ms (10 tokens a ms), then takes a
	// request on it every second, each with 400 tokens of its own: far too few to put
	// the document in demand. Each is answered 40 ms after it is sent and keeps
	// decoding, so X runs past the fair-share cap, which does not outweigh the
	// document's cache there. Then one request is not answered: a second later X has
	// shown none of its 400 tokens' prefill (its running slots are full), and the next
	// request copies the document elsewhere. With that request answered it stays on X.
	for _, stalled := range []bool{false, true} {
		t.Run(fmt.Sprintf("stalled=%v", stalled), func(t *testing.T) {
			rng := rand.New(rand.NewSource(33))
			doc := words(rng, 8000)
			clock := &fakeClock{ms: 1e6}
			r := NewRouter(testConfig(t, ""), state.NewMemoryStore(), clock.now)
			first := r.Decide(textRequest(doc, 1), NoRank)
			clock.ms += 200
			require.NoError(t, r.FirstChunk(&first.Ticket))
			x := first.Target.ID
			for i := 0; i < 13; i++ {
				clock.ms += 1000
				d := r.Decide(textRequest(doc+words(rng, 1600), uint64(10+i)), NoRank)
				require.Equal(t, x, d.Target.ID, "request %d stays with the document", i)
				if i < 12 || !stalled {
					clock.ms += 40
					require.NoError(t, r.FirstChunk(&d.Ticket))
				}
			}
			clock.ms += 1000
			d := r.Decide(textRequest(doc+words(rng, 1600), 30), NoRank)
			if !stalled {
				assert.Equal(t, x, d.Target.ID)
				return
			}
			assert.NotEqual(t, x, d.Target.ID, "the document is copied off its stalled holder")
			assert.Equal(t, KindLoad, d.Kind)
		})
	}
}

func TestEveryReplicaCopiesAPrefixOntoTheSameTargets(t *testing.T) {
	// Eight targets; two gateway replicas that share nothing each see a burst on the
	// same document. Wherever each computed it first, both copy it onto the targets
	// the document's hash ranks first, so their copies land on the same few targets.
	cfg := eightTargets(t, 100)
	rng := rand.New(rand.NewSource(32))
	doc := words(rng, 8000)
	copies := map[uint64]bool{}
	for replica := uint64(0); replica < 2; replica++ {
		clock := &fakeClock{ms: 1e6}
		r := NewRouter(cfg, state.NewMemoryStore(), clock.now)
		first := r.Decide(textRequest(doc, 100*replica+1), NoRank)
		clock.ms += 200
		require.NoError(t, r.FirstChunk(&first.Ticket))
		require.NoError(t, r.Release(first.Ticket))
		for i := uint64(0); i < 12; i++ {
			clock.ms += 5
			d := r.Decide(textRequest(doc+words(rng, 1600), 100*replica+10+i), NoRank)
			if d.Target.ID != first.Target.ID {
				copies[d.Target.ID] = true
			}
		}
	}
	assert.NotEmpty(t, copies)
	assert.LessOrEqual(t, len(copies), prefix.TargetsPerEntry, "both replicas' copies: %v", copies)
}

func TestCopiesByDemandStopBeforeTheEntryFillsInALargePool(t *testing.T) {
	// A burst far beyond what any number of holders keeps up with. In a pool twice
	// the size of an index entry it is copied until it has as many holders as the
	// entry names; in a pool four times that size it stops one short, since a full
	// entry counts as held on every target and the burst would then spread over all.
	const w = prefix.TargetsPerEntry
	for _, c := range []struct{ pool, holders int }{{2 * w, w}, {4 * w, w - 1}} {
		t.Run(fmt.Sprint(c.pool), func(t *testing.T) {
			rng := rand.New(rand.NewSource(34))
			doc := words(rng, 8000)
			clock := &fakeClock{ms: 1e6}
			r := NewRouter(targets(t, c.pool, 100), state.NewMemoryStore(), clock.now)
			first := r.Decide(textRequest(doc, 1), NoRank)
			clock.ms += 200
			require.NoError(t, r.FirstChunk(&first.Ticket))
			require.NoError(t, r.Release(first.Ticket))
			used := map[uint64]bool{}
			for i := uint64(0); i < 40; i++ {
				clock.ms += 2
				d := r.Decide(textRequest(doc+words(rng, 1600), 10+i), NoRank)
				used[d.Target.ID] = true
			}
			assert.Len(t, used, c.holders)
		})
	}
}

func TestAPrefixInDemandWithEveryPlaceAtTheCap(t *testing.T) {
	// Twice as many targets as an index entry names, at fair_share_multiplier 1. The
	// document's holder and the targets its hash ranks first (as many as an entry
	// names) each have two requests of other prompts: all are at the cap. A burst of
	// requests that each add three times the document's tokens (the document too
	// small a share of them for its holder to take them as continuations) goes to
	// the other targets.
	rng := rand.New(rand.NewSource(33))
	doc := words(rng, 8000)
	clock := &fakeClock{ms: 1e6}
	r := NewRouter(targets(t, 2*prefix.TargetsPerEntry, 1), state.NewMemoryStore(), clock.now)
	first := r.Decide(textRequest(doc, 1), NoRank)
	clock.ms += 200
	require.NoError(t, r.FirstChunk(&first.Ticket))
	require.NoError(t, r.Release(first.Ticket))
	// The hash of the document's deepest checkpoint, which a burst request matches.
	q := textRequest(doc, 2)
	cps, _ := prefix.HashCheckpoints(q.Model, q.Prompt, q.BlockBytes, nil)
	key := cps[len(cps)-1].Hash
	ts := append([]Target(nil), r.DecodeTargets()...)
	sort.Slice(ts, func(a, b int) bool {
		return hashx.RendezvousScore(key, ts[a].ID) > hashx.RendezvousScore(key, ts[b].ID)
	})
	full := map[uint64]bool{first.Target.ID: true}
	for _, tg := range ts[:prefix.TargetsPerEntry] {
		full[tg.ID] = true
	}
	for id := range full {
		for k := 0; k < 2; k++ {
			_, err := r.decode.ledger.AcquireQueued(id, 100, 0, 0, clock.ms)
			require.NoError(t, err)
		}
	}
	for i := uint64(0); i < 6; i++ {
		clock.ms += 5
		d := r.Decide(textRequest(doc+words(rng, 24000), 10+i), NoRank)
		assert.False(t, full[d.Target.ID], "request %d went to a target at the cap", i)
	}
}

// eightTargets is a pool of eight targets at the fair-share multiplier m.
func eightTargets(t *testing.T, m int) *config.Config { return targets(t, 8, m) }

// targets is a pool of n targets at the fair-share multiplier m.
func targets(t *testing.T, n, m int) *config.Config {
	t.Helper()
	eps := make([]string, n)
	for i := range eps {
		eps[i] = fmt.Sprintf(`{"address":"10.0.0.%d:8000"}`, i+1)
	}
	js := fmt.Sprintf(`{"pools":{"decode":{"endpoints":[%s]}},"balance":{"fair_share_multiplier":%d}}`,
		strings.Join(eps, ","), m)
	cfg, err := config.ParseConfig([]byte(js))
	require.NoError(t, err)
	return &cfg
}

func TestAPrefixIsCopiedWhenRequestsQueueForItBehindMoreThanIt(t *testing.T) {
	// Target X computes a 2000-token document in 200 ms (10 tokens a ms). Other
	// prefill is queued on X, and a second request on the document, with 400 tokens
	// of its own, goes to X behind it. A third request on the document arrives: too
	// few between them to put it in demand. While the second waits behind more than
	// the document's tokens, the document computed on an idle target would have come
	// sooner for it, and the third copies it there. With less queued ahead of the
	// second it stays on X; so it does when the other prefill was sent after the
	// second (X is busy, but not with the document: the cost spreads that), when
	// every other target has so much queued that the document computed there would
	// not come sooner, and when the pool is backlogged (its mean queue longer than
	// the document: a copy's time is taken from other requests). Before any first
	// chunk another rule applies (TestAColdPrefixIsCopiedOntoHalfTheTargetsLeftIdle).
	for _, c := range []struct {
		name          string
		before, after int64    // uncached tokens queued on X before and after the second
		others        [2]int64 // uncached tokens queued on the two other targets
		copied        bool
	}{
		{"queued for behind more than it", 3000, 0, [2]int64{}, true},
		{"queued for behind less than it", 1000, 0, [2]int64{}, false},
		{"busy with other prompts since", 0, 3000, [2]int64{}, false},
		{"no sooner elsewhere", 2400, 600, [2]int64{1000, 1000}, false},
		{"a backlogged pool", 3000, 0, [2]int64{3000, 0}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewSource(34))
			doc := words(rng, 8000)
			clock := &fakeClock{ms: 1e6}
			r := NewRouter(testConfig(t, `,"balance":{"fair_share_multiplier":100}`), state.NewMemoryStore(), clock.now)
			first := r.Decide(textRequest(doc, 1), NoRank)
			x := first.Target.ID
			clock.ms += 200
			require.NoError(t, r.FirstChunk(&first.Ticket))
			require.NoError(t, r.Release(first.Ticket))
			queue := func(id uint64, tokens int64) {
				if tokens > 0 {
					_, err := r.decode.ledger.AcquireQueued(id, tokens, tokens, 0, clock.ms)
					require.NoError(t, err)
				}
			}
			queue(x, c.before)
			k := 0
			for _, tg := range r.DecodeTargets() {
				if tg.ID != x {
					queue(tg.ID, c.others[k])
					k++
				}
			}
			second := r.Decide(textRequest(doc+words(rng, 1600), 2), NoRank)
			require.Equal(t, x, second.Target.ID)
			queue(x, c.after)
			d := r.Decide(textRequest(doc+words(rng, 1600), 3), NoRank)
			if !c.copied {
				assert.Equal(t, x, d.Target.ID, "the request stays with the document")
				return
			}
			assert.NotEqual(t, x, d.Target.ID, "the document is copied off its queue")
			assert.Equal(t, KindLoad, d.Kind)
		})
	}
}

// A copy weighed against its prefix's holder is charged, on each candidate, for the
// requests the candidate draws beyond its share of the pool's recent sends while it
// computes the request: they wait behind that prefill. The holder (target 0) holds
// 8000 of the request's 9000 tokens behind 12 000 queued; targets 1–3 hold none and
// are idle. The sends are over the last 300 ms.
func TestACopyIsChargedForWhatItsTargetDrawsBeyondItsShare(t *testing.T) {
	const nowMS = 3*recentHalfLifeMS + 10000
	for _, tc := range []struct {
		name string
		sent [4]int64 // recent sends, in requests
		rate [4]int64 // tokens a ms over 1000 ms of first chunks
		want []int    // the places the request may go
	}{
		{"every target drawing alike: a copy", [4]int64{25, 25, 25, 25}, [4]int64{40, 40, 40, 40}, []int{1, 2, 3}},
		{"two drawing four times the rest: the copy goes to the third", [4]int64{10, 40, 40, 10}, [4]int64{40, 40, 40, 40}, []int{3}},
		{"a target twice as fast drawing twice as much is at its share", [4]int64{20, 40, 20, 20}, [4]int64{38, 80, 38, 38}, []int{1}},
		{"one twice as fast drawing four times as much is not", [4]int64{20, 80, 20, 20}, [4]int64{38, 80, 38, 38}, []int{2, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.DefaultConfig()
			r := &Router{cfg: &cfg}
			targets := NewPoolTargets(config.Pool{Endpoints: []config.Endpoint{{Address: "10.0.0.1:8000", DPSize: 4}}})
			v := &poolView{pool: &poolState{targets: targets, sendsFromMS: nowMS - 300}, nowMS: nowMS,
				loads: make([]Load, 4), ahead: make([]int64, 4), eligible: []int{0, 1, 2, 3}, copyTokens: 8000}
			var rtok, rms int64
			for i := range v.loads {
				v.loads[i] = Load{RecentSent: tc.sent[i] * countUnit, RateTokens: tc.rate[i] * 1000, RateMS: 1000}
				v.total.RecentSent += tc.sent[i] * countUnit
				rtok, rms = rtok+tc.rate[i]*1000, rms+1000
			}
			v.rate = float64(rtok) / float64(rms)
			v.loads[0].Prefill, v.loads[0].Prefills, v.ahead[0] = 12000, 2, 12000
			req := &extract.Request{Tokens: 9000, Identity: 5}
			matched := []int{8000, 0, 0, 0}
			got := r.cheapestFrom(v, v.eligible, req, matched, 0, 0, 0)
			assert.Contains(t, tc.want, got)
		})
	}
}

// Before any first chunk has come back, a document's requests (2000 tokens of it, 400
// of their own, 20 ms apart) are sent to a pool of eight targets, some of them busy
// with other prompts' prefill. Each finds the document's holders still computing it
// and copies it onto an idle target while its holders stay at most half of the
// targets the other prompts leave, rounded up: four in an idle pool, three with three
// targets busy, two with four or five, and none but the first with six. In a pool of
// sixteen the room is that of the eight places a prefix may have: four holders again,
// two with four busy. With another prompt sent to an idle target after the
// document's first request, the half is rounded down: one holder with four busy before.
func TestAColdPrefixIsCopiedOntoHalfTheTargetsLeftIdle(t *testing.T) {
	for _, c := range []struct {
		targets, busy, later, holders int
	}{{8, 0, 0, 4}, {8, 3, 0, 3}, {8, 4, 0, 2}, {8, 5, 0, 2}, {8, 6, 0, 1}, {8, 4, 1, 1}, {16, 0, 0, 4}, {16, 4, 0, 2}} {
		t.Run(fmt.Sprintf("%d+%d of %d busy", c.busy, c.later, c.targets), func(t *testing.T) {
			rng := rand.New(rand.NewSource(35))
			clock := &fakeClock{ms: 1e6}
			cfg := testConfig(t, `,"balance":{"fair_share_multiplier":100}`)
			cfg.Pools.Decode.Endpoints = []config.Endpoint{{Address: "10.0.0.1:8000", DPSize: c.targets}}
			r := NewRouter(cfg, state.NewMemoryStore(), clock.now)
			others := map[uint64]bool{}
			for _, tg := range r.DecodeTargets()[:c.busy] {
				_, err := r.decode.ledger.AcquireQueued(tg.ID, 1500, 1500, 0, clock.ms)
				require.NoError(t, err)
				others[tg.ID] = true
			}
			doc := words(rng, 8000)
			holders := map[uint64]bool{}
			for i := 0; i < 8; i++ {
				d := r.Decide(textRequest(doc+words(rng, 1600), uint64(i)), NoRank)
				assert.False(t, others[d.Target.ID], "request %d went behind another prompt", i)
				holders[d.Target.ID] = true
				clock.ms += 20
				for _, tg := range r.DecodeTargets()[c.busy:] {
					if i == 0 && len(others) < c.busy+c.later && !holders[tg.ID] {
						_, err := r.decode.ledger.AcquireQueued(tg.ID, 1500, 1500, clock.ms, clock.ms)
						require.NoError(t, err)
						others[tg.ID] = true
					}
				}
			}
			assert.Len(t, holders, c.holders)
		})
	}
}
