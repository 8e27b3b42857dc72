package routing

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/engine"
	"github.com/kvroute/kvroute/routing/prefix"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAHolderWhoseCacheTurnedOverHoldsNothing(t *testing.T) {
	// A document of 2000 tokens is recorded on one target; then that target takes in
	// 5000 uncached tokens of other work. With a cache of 4000 tokens per target the
	// document's copy is gone and its continuation is placed afresh; with the capacity
	// unknown (0) or large enough for the writes and the document (8000) it is still a
	// continuation there. With no cache configured
	// and engine metrics on, the size the holder's engine reports counts the same way;
	// a configured cache outranks it, and a report gone stale no longer counts.
	rng := rand.New(rand.NewSource(6))
	doc := words(rng, 8000)
	next := doc + words(rng, 400)
	for _, c := range []struct {
		name, cache string
		reported    float64 // the holder's engine's report (0: engine metrics off)
		staleBy     int64   // ms the report has aged by at the continuation
		kind        Kind
	}{
		{"unknown", "0", 0, 0, KindContinuation},
		{"configured above the writes", "8000", 0, 0, KindContinuation},
		{"configured under them", "4000", 0, 0, KindLoad},
		{"reported under them", "0", 4000, 0, KindLoad},
		{"reported above them", "0", 8000, 0, KindContinuation},
		{"configured outranks reported", "8000", 4000, 0, KindContinuation},
		{"reported, gone stale", "0", 4000, 5001, KindContinuation},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := &fakeClock{ms: 1e6}
			extra := ""
			if c.reported > 0 {
				extra = `,"engine_metrics":{"enabled":true,"stale_ms":5000}`
			}
			cfg := testConfig(t, `,"prefix":{"target_cache_tokens":`+c.cache+`},"balance":{"fair_share_multiplier":100}`+extra)
			r := NewRouter(cfg, state.NewMemoryStore(), clock.now)
			first := r.Decide(textRequest(doc, 1), NoRank)
			require.NoError(t, r.Release(first.Ticket))
			if c.reported > 0 {
				require.NoError(t, r.PublishEngineFigures(false, first.Target.Address, map[int]engine.EngineFigures{first.Target.Rank: {CacheTokens: c.reported}}))
			}
			other, err := r.decode.ledger.AcquireQueued(first.Target.ID, 5000, 5000, 0, clock.ms)
			require.NoError(t, err)
			require.NoError(t, r.decode.ledger.Release(other, clock.now))
			clock.ms += c.staleBy
			d := r.Decide(textRequest(next, 2), NoRank)
			assert.Equal(t, c.kind, d.Kind)
		})
	}
}

func TestAHolderThatKeepsUsingItsCopyKeepsIt(t *testing.T) {
	// The same, but the document is asked about again between the other work: the
	// record refreshes the copy's clock, as the engine's LRU refreshes its blocks. The
	// cache (5000) holds 2500 tokens of writes and the document, never 5000 and it.
	rng := rand.New(rand.NewSource(7))
	doc := words(rng, 8000)
	cfg := testConfig(t, `,"prefix":{"target_cache_tokens":5000},"balance":{"fair_share_multiplier":100}`)
	r := NewRouter(cfg, state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	first := r.Decide(textRequest(doc, 1), NoRank)
	require.NoError(t, r.Release(first.Ticket))
	for i := 0; i < 2; i++ {
		other, err := r.decode.ledger.AcquireQueued(first.Target.ID, 2500, 2500, 0, 1e6)
		require.NoError(t, err)
		require.NoError(t, r.decode.ledger.Release(other, func() int64 { return 1e6 }))
		d := r.Decide(textRequest(doc+words(rng, 400), uint64(2+i)), NoRank)
		assert.Equal(t, KindContinuation, d.Kind, "round %d", i)
		assert.Equal(t, first.Target.ID, d.Target.ID)
		require.NoError(t, r.Release(d.Ticket))
	}
}

func TestAPrefixEveryEntrySlotHoldsCountsAsHeldByAll(t *testing.T) {
	// Two more targets than an index entry names; a system prompt is recorded on as
	// many as it names, each of which carries a little load. A new request with that
	// system prompt goes to an idle target: a prefix that popular is taken to be
	// cached everywhere rather than sending every such request to the few the entry
	// happens to name. With the prompt on one target fewer, the named holders'
	// cache wins.
	const w = prefix.TargetsPerEntry
	js := fmt.Sprintf(`{"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":%d}]}},"balance":{"fair_share_multiplier":100}}`, w+2)
	cfg, err := config.ParseConfig([]byte(js))
	require.NoError(t, err)
	rng := rand.New(rand.NewSource(9))
	system := words(rng, 4000)
	for _, holders := range []int{w, w - 1} {
		r := NewRouter(&cfg, state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
		ts := r.DecodeTargets()
		named := map[uint64]bool{}
		sys := textRequest(system, 0)
		cps, _ := prefix.HashCheckpoints(sys.Model, sys.Prompt, sys.BlockBytes, nil)
		for i := 0; i < holders; i++ {
			r.decode.index.Record(cps, ts[i].ID, 0, 0)
			_, err := r.decode.ledger.Acquire(ts[i].ID, 100, 1e6)
			require.NoError(t, err)
			named[ts[i].ID] = true
		}
		d := r.Decide(textRequest(system+words(rng, 4000), 1), NoRank)
		if holders == w {
			assert.False(t, named[d.Target.ID], "an idle target: the system prompt counts as cached there too")
		} else {
			assert.True(t, named[d.Target.ID], "one named holder fewer: the cache there wins")
		}
		assert.Equal(t, KindPrefix, d.Kind)
	}
}
