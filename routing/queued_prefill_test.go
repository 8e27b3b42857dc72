package routing

import (
	"math/rand"
	"testing"

	"github.com/kvroute/kvroute/routing/hashx"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// decodeLoad is the ledger's view of the load on target address in r's decode pool,
// without its clocks and rate.
func decodeLoad(t *testing.T, r *Router, address string) Load {
	t.Helper()
	loads, err := r.Loads()
	require.NoError(t, err)
	for i, tg := range r.DecodeTargets() {
		if l := loads[i]; tg.Address == address {
			return Load{Requests: l.Requests, Prefills: l.Prefills, Tokens: l.Tokens, Prefill: l.Prefill}
		}
	}
	t.Fatalf("no target %s", address)
	return Load{}
}

func TestQueuedPrefillTokensLeaveAtTheFirstChunk(t *testing.T) {
	r := NewRouter(testConfig(t, ""), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	rng := rand.New(rand.NewSource(3))
	doc := words(rng, 8000)
	d := r.Decide(textRequest(doc, 1), NoRank)
	at := d.Target.Address
	assert.Equal(t, Load{Requests: 1, Prefills: 1, Tokens: 2000, Prefill: 2000}, decodeLoad(t, r, at), "nothing cached: the whole prompt queues")

	require.NoError(t, r.FirstChunk(&d.Ticket))
	assert.Equal(t, Load{Requests: 1, Tokens: 2000}, decodeLoad(t, r, at), "the prefill is over; the request still runs")
	require.NoError(t, r.FirstChunk(&d.Ticket), "a second chunk changes nothing")
	assert.Equal(t, Load{Requests: 1, Tokens: 2000}, decodeLoad(t, r, at))
	require.NoError(t, r.Release(d.Ticket))
	assert.Equal(t, Load{}, decodeLoad(t, r, at))

	// The next turn finds the document cached there: only its new tokens queue, and a
	// stream that ends before any chunk takes them back at its end.
	turn := doc + words(rng, 800)
	d2 := r.Decide(textRequest(turn, 2), NoRank)
	assert.Equal(t, KindContinuation, d2.Kind)
	assert.Equal(t, at, d2.Target.Address)
	l := decodeLoad(t, r, at)
	assert.Equal(t, int64(2200), l.Tokens)
	// The index reports at least 7/8 of the matched 2000 tokens.
	assert.GreaterOrEqual(t, l.Prefill, int64(200), "the uncached tail queues")
	assert.LessOrEqual(t, l.Prefill, int64(2200-2000*7/8))
	require.NoError(t, r.Release(d2.Ticket))
	assert.Equal(t, Load{}, decodeLoad(t, r, at))
}

func TestCostWeighsTheQueuedPrefillAgainstTheCache(t *testing.T) {
	// A request sharing half its prompt with a document cached on one target goes
	// there while that target is free, but not while a long prefill is queued there:
	// waiting for 9000 tokens costs more than computing the 2000 shared ones again
	// (weighed 4 times).
	cfg := testConfig(t, `,"balance":{"fair_share_multiplier":100}`)
	rng := rand.New(rand.NewSource(4))
	doc := words(rng, 8000)
	for _, queued := range []bool{false, true} {
		r := NewRouter(cfg, state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
		first := r.Decide(textRequest(doc, 1), NoRank)
		require.NoError(t, r.FirstChunk(&first.Ticket))
		if queued {
			// Another long prompt is sent to the same target and is still in prefill.
			_, err := r.decode.ledger.AcquireQueued(first.Target.ID, 9000, 9000, 0, 1e6)
			require.NoError(t, err)
		}
		q := textRequest(doc+words(rng, 8000), 2)
		d := r.Decide(q, NoRank)
		if queued {
			assert.NotEqual(t, first.Target.Address, d.Target.Address, "9000 queued tokens outweigh 2000 cached ones")
			assert.Equal(t, KindLoad, d.Kind)
		} else {
			assert.Equal(t, first.Target.Address, d.Target.Address)
			assert.Equal(t, KindPrefix, d.Kind)
		}
	}
}

func TestMappedTargetAtTheCapKeepsATurnWhileItIsTheCheapest(t *testing.T) {
	// fair_share_multiplier 1 with 3 targets: one active request puts a target at the
	// cap. The conversation's target holds its 2000-token history; its one other
	// request is past its prefill (decoding) in the first case, still in a prefill of
	// 13000 tokens in the second — more than the history is worth (6 × 2000).
	cfg := testConfig(t, `,"balance":{"fair_share_multiplier":1}`)
	rng := rand.New(rand.NewSource(5))
	history := words(rng, 8000)
	for _, inPrefill := range []bool{false, true} {
		r := NewRouter(cfg, state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
		req := textRequest(history, 1)
		req.Conversation, req.HasConversation = hashx.FingerprintString("c"), true
		first := r.Decide(req, NoRank)
		require.Equal(t, KindNewConversation, first.Kind)
		require.NoError(t, r.FirstChunk(&first.Ticket))
		require.NoError(t, r.Release(first.Ticket))
		queued := int64(0)
		if inPrefill {
			queued = 13000
		}
		_, err := r.decode.ledger.AcquireQueued(first.Target.ID, 13000, queued, 0, 1e6)
		require.NoError(t, err)
		next := textRequest(history+words(rng, 400), 2)
		next.Conversation, next.HasConversation = req.Conversation, true
		d := r.Decide(next, NoRank)
		if inPrefill {
			assert.Equal(t, KindOverflow, d.Kind, "13000 queued tokens cost more than recomputing 2000")
			assert.NotEqual(t, first.Target.Address, d.Target.Address)
		} else {
			assert.Equal(t, KindSticky, d.Kind, "at the cap, but its cache makes it the cheapest")
			assert.Equal(t, first.Target.Address, d.Target.Address)
		}
	}
}

func TestAnOverflowWeighsTheTurnItsMappingMustComputeAgain(t *testing.T) {
	// Every target caches a shared 1024-token system prompt; the conversation's target
	// also holds its first turn (32 tokens more). That target is at the fair-share cap
	// by decode load alone, nothing queued: moving this turn saves its decode share
	// but only 32 cached tokens, and leaves the turn's 200 new tokens off the mapping,
	// where the next turn would compute them again.
	cfg := testConfig(t, `,"balance":{"fair_share_multiplier":1}`)
	r := NewRouter(cfg, state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	rng := rand.New(rand.NewSource(7))
	system := words(rng, 4096)
	turn := func(conv, text string, id uint64) Decision {
		req := textRequest(text, id)
		req.Conversation, req.HasConversation = hashx.FingerprintString(conv), true
		return r.Decide(req, NoRank)
	}
	done := func(d Decision) {
		require.NoError(t, r.FirstChunk(&d.Ticket))
		require.NoError(t, r.Release(d.Ticket))
	}
	for i, c := range []string{"x", "y", "z"} { // round robin: one on each target
		done(turn(c, system+words(rng, 128), uint64(i)))
	}
	first := system + words(rng, 128)
	d := turn("c", first, 10)
	require.Equal(t, KindNewConversation, d.Kind)
	done(d)
	// Decode load: two requests on the conversation's target (at the cap of 2), one on
	// each other target.
	for _, tg := range r.DecodeTargets() {
		n := 1
		if tg.ID == d.Target.ID {
			n = 2
		}
		for k := 0; k < n; k++ {
			_, err := r.decode.ledger.AcquireQueued(tg.ID, 1000, 0, 0, 1e6)
			require.NoError(t, err)
		}
	}
	next := turn("c", first+words(rng, 800), 11)
	assert.Equal(t, KindSticky, next.Kind)
	assert.Equal(t, d.Target.Address, next.Target.Address)
}
