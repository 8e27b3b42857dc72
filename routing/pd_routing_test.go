package routing

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/extract"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func pdConfig(t testing.TB, disagg string) *config.Config {
	t.Helper()
	js := `{"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"},{"address":"10.0.1.2:8000"}]},
		"prefill":{"endpoints":[{"address":"10.0.2.1:8000","dp_size":2},{"address":"10.0.2.2:8000"}]}},
		"disaggregation":` + disagg + `}`
	cfg, err := config.ParseConfig([]byte(js))
	require.NoError(t, err)
	return &cfg
}

func TestThresholdClassification(t *testing.T) {
	r := NewRouter(pdConfig(t, `{"mode":"vllm","threshold_tokens":100}`), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	for _, c := range []struct {
		tokens int
		want   PDClass
		header string
	}{{99, PDDirect, "load;pd=direct"}, {100, PDDisaggregated, "load;pd=disaggregated"}, {5000, PDDisaggregated, "load;pd=disaggregated"}} {
		d := r.Decide(&extract.Request{Tokens: c.tokens, Identity: uint64(c.tokens)}, NoRank)
		assert.Equal(t, c.want, d.PD, "%d tokens", c.tokens)
		assert.Equal(t, c.header, d.Header())
		if c.want == PDDisaggregated {
			assert.Contains(t, []string{"10.0.2.1:8000", "10.0.2.2:8000"}, d.Prefill.Address)
			assert.True(t, d.PrefillTicket.Valid)
		} else {
			assert.False(t, d.PrefillTicket.Valid)
		}
	}
	r0 := NewRouter(pdConfig(t, `{"mode":"sidecar","threshold_tokens":0}`), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	assert.Equal(t, PDDisaggregated, r0.Decide(&extract.Request{Tokens: 0}, NoRank).PD, "threshold 0 disaggregates everything")
	off := NewRouter(testConfig(t, ""), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	d := off.Decide(&extract.Request{Tokens: 5000}, NoRank)
	assert.Equal(t, PDOff, d.PD)
	assert.Equal(t, "load", d.Header())
}

func TestUncachedOnlyCountsTokensNotOnTheDecodeTarget(t *testing.T) {
	r := NewRouter(pdConfig(t, `{"mode":"vllm","threshold_tokens":200,"uncached_only":true}`), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	rng := rand.New(rand.NewSource(1))
	history := words(rng, 4000) // 1000 tokens
	first := r.Decide(textRequest(history, 1), NoRank)
	assert.Equal(t, PDDisaggregated, first.PD, "nothing cached yet")
	_ = r.Release(first.Ticket)
	_ = r.ReleasePrefill(first.PrefillTicket)
	// The next turn adds 100 tokens: 1100 in all, but only ~100 not cached on the decoder.
	d := r.Decide(textRequest(history+words(rng, 400), 2), NoRank)
	assert.Equal(t, KindContinuation, d.Kind)
	assert.Equal(t, PDDirect, d.PD)
	// A long new tail is disaggregated again.
	d2 := r.Decide(textRequest(history+words(rng, 4000), 3), NoRank)
	assert.Equal(t, PDDisaggregated, d2.PD)
}

func TestPrefillIsStickyForConversationsAndHasItsOwnLedger(t *testing.T) {
	r := NewRouter(pdConfig(t, `{"mode":"vllm","threshold_tokens":10}`), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	var prefill string
	var tickets []LoadTicket
	for turn := 0; turn < 5; turn++ {
		req := convRequest("pd-conv")
		req.Tokens = 500
		d := r.Decide(req, NoRank)
		require.Equal(t, PDDisaggregated, d.PD)
		if turn == 0 {
			prefill = d.Prefill.Address + "#" + d.Prefill.RankText
		}
		assert.Equal(t, prefill, d.Prefill.Address+"#"+d.Prefill.RankText, "turn %d", turn)
		_ = r.Release(d.Ticket)
		// The prefill leg ends before the next turn, except the last one's.
		for _, tk := range tickets {
			_ = r.ReleasePrefill(tk)
		}
		tickets = []LoadTicket{d.PrefillTicket}
	}
	loads, err := r.prefill.ledger.Snapshot(1e6)
	require.NoError(t, err)
	var n int64
	for _, l := range loads {
		n += l.Requests
	}
	assert.Equal(t, int64(1), n, "prefill load is kept apart from decode load")
	for _, tk := range tickets {
		err := r.ReleasePrefill(tk)
		require.NoError(t, err)
	}
	loads, _ = r.prefill.ledger.Snapshot(1e6)
	assert.Empty(t, loads)
	dl, _ := r.Loads()
	assert.Equal(t, Load{}, total(dl))
}

func TestPrefillSpreadsAcrossThePrefillPool(t *testing.T) {
	r := NewRouter(pdConfig(t, `{"mode":"sidecar","threshold_tokens":10}`), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	seen := map[string]int{}
	var held []Decision
	for i := 0; i < 30; i++ {
		d := r.Decide(&extract.Request{Tokens: 100, Identity: uint64(i)}, NoRank)
		seen[fmt.Sprint(d.Prefill.Address, "#", d.Prefill.Rank)]++
		held = append(held, d)
	}
	// Three prefill targets (10.0.2.1 has two ranks), ten each with load in flight.
	assert.Equal(t, map[string]int{"10.0.2.1:8000#0": 10, "10.0.2.1:8000#1": 10, "10.0.2.2:8000#0": 10}, seen)
	for _, d := range held {
		_ = r.Release(d.Ticket)
		_ = r.ReleasePrefill(d.PrefillTicket)
	}
}

func TestADisaggregatedDecodeLegIsNoSlotSighting(t *testing.T) {
	// Sixteen replies decoding on every decode target, their rate known; the request's prefill goes to the prefill pool, so its decode leg's first
	// chunk comes when the prefill target is done, however late: the decode target is
	// not seen out of running slots. The same request undisaggregated is (control).
	for _, split := range []bool{true, false} {
		t.Run(fmt.Sprint("disaggregated ", split), func(t *testing.T) {
			threshold := 100
			if !split {
				threshold = 1 << 20
			}
			clock := &fakeClock{ms: 1e6}
			r := NewRouter(pdConfig(t, fmt.Sprintf(`{"mode":"vllm","threshold_tokens":%d}`, threshold)), state.NewMemoryStore(), clock.now)
			for _, tg := range r.DecodeTargets() {
				for i := 0; i < 16; i++ {
					tk, err := r.decode.ledger.AcquireQueued(tg.ID, 100, 100, 0, clock.ms-10)
					require.NoError(t, err)
					require.NoError(t, r.FirstChunk(&tk))
				}
			}
			d := r.Decide(&extract.Request{Tokens: 500, Identity: 1}, NoRank)
			require.Equal(t, split, d.PD == PDDisaggregated)
			clock.ms += 5000
			require.NoError(t, r.FirstChunk(&d.Ticket))
			loads, err := r.Loads()
			require.NoError(t, err)
			got := loads[r.decode.targets.Index(d.Target.ID)].FullRunning
			assert.Equal(t, !split, got > 0, "%d", got)
		})
	}
}

// A prefill pool's targets return no first chunk, so it never shows a rate: the
// second holder a decode pool gives a prefix before its first chunk (coldCopyFits)
// is not made there, and a document's second request is prefilled where its first
// still is.
func TestAPrefillPoolMakesNoCopyForWantOfARate(t *testing.T) {
	js := `{"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"},{"address":"10.0.1.2:8000"}]},
		"prefill":{"endpoints":[{"address":"10.0.2.1:8000","dp_size":8}]}},
		"disaggregation":{"mode":"vllm","threshold_tokens":100}}`
	cfg, err := config.ParseConfig([]byte(js))
	require.NoError(t, err)
	clock := &fakeClock{ms: 1e6}
	r := NewRouter(&cfg, state.NewMemoryStore(), clock.now)
	rng := rand.New(rand.NewSource(5))
	doc := words(rng, 32000)
	first := r.Decide(textRequest(doc+words(rng, 4000), 1), NoRank)
	require.Equal(t, PDDisaggregated, first.PD)
	clock.ms += 200
	second := r.Decide(textRequest(doc+words(rng, 4000), 2), NoRank)
	require.Equal(t, PDDisaggregated, second.PD)
	assert.Equal(t, first.Prefill, second.Prefill)
	assert.Greater(t, second.MatchedTokens, 7000)
}
