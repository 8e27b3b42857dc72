package routing

import (
	"math/rand"
	"testing"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/hashx"
	"github.com/kvroute/kvroute/routing/prefix"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// secondTurnOverTheCap maps a conversation to rank 0 of one three-rank endpoint with
// a first turn that computes a 4000-token system prompt there; caches the same prompt
// on rank 1; puts rank 0 at the fair-share cap with two long replies decoding and
// queued prefill of queued tokens; and decides the conversation's second turn.
func secondTurnOverTheCap(t *testing.T, queued int64) (home Target, d Decision) {
	cfg, err := config.ParseConfig([]byte(`{"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":3}]}}}`))
	require.NoError(t, err)
	clock := &fakeClock{ms: 1e6}
	r := NewRouter(&cfg, state.NewMemoryStore(), clock.now)
	rng := rand.New(rand.NewSource(3))
	system, first, second := words(rng, 16000), words(rng, 800), words(rng, 400)
	warm := r.Decide(textRequest(system+words(rng, 800), 1), 1)
	require.NoError(t, r.FirstChunk(&warm.Ticket))
	require.NoError(t, r.Release(warm.Ticket))
	turn := func(text string, id uint64, rank int) Decision {
		q := textRequest(text, id)
		q.Conversation, q.HasConversation = hashx.FingerprintString("c"), true
		return r.Decide(q, rank)
	}
	d = turn(system+first, 2, 0)
	require.Equal(t, KindNewConversation, d.Kind)
	home = d.Target
	require.NoError(t, r.FirstChunk(&d.Ticket))
	require.NoError(t, r.Release(d.Ticket))
	for i := 0; i < 2; i++ {
		_, err := r.decode.ledger.Acquire(home.ID, 10000, clock.ms)
		require.NoError(t, err)
	}
	if queued > 0 {
		_, err := r.decode.ledger.AcquireQueued(home.ID, queued, queued, 0, clock.ms)
		require.NoError(t, err)
	}
	return home, turn(system+first+second, 3, NoRank)
}

func TestStickyTurnStaysOverTheCapWhenItsQueueFits(t *testing.T) {
	// Nothing queued at home: its decode load and the charge for being over the cap
	// are less than what the history cached there is worth, though another target
	// caches the system prompt and would cost less by the cost alone.
	home, d := secondTurnOverTheCap(t, 0)
	assert.Equal(t, KindSticky, d.Kind)
	assert.Equal(t, home.ID, d.Target.ID)
}

func TestStickyTurnOverTheCapOverflowsBehindALongQueue(t *testing.T) {
	// 40000 tokens queued at home outweigh its cache (4 × 4200): the cost decides, and
	// the target that caches the system prompt wins.
	home, d := secondTurnOverTheCap(t, 40000)
	assert.Equal(t, KindOverflow, d.Kind)
	assert.NotEqual(t, home.ID, d.Target.ID)
}

// continuationBesideABusyHolder caches a 2000-token prompt without an id on one of
// three targets, has decoding requests of 2000 tokens each decoding there (their
// prefill over), and decides the prompt's continuation, 100 tokens longer.
func continuationBesideABusyHolder(t *testing.T, decoding int) (holder Target, d Decision) {
	clock := &fakeClock{ms: 1e6}
	r := NewRouter(testConfig(t, ""), state.NewMemoryStore(), clock.now)
	rng := rand.New(rand.NewSource(11))
	prompt := words(rng, 8000)
	warm := r.Decide(textRequest(prompt, 1), NoRank)
	require.NoError(t, r.FirstChunk(&warm.Ticket))
	require.NoError(t, r.Release(warm.Ticket))
	for i := 0; i < decoding; i++ {
		tk, err := r.decode.ledger.AcquireQueued(warm.Target.ID, 2000, 2000, 0, clock.ms)
		require.NoError(t, err)
		require.NoError(t, r.decode.ledger.FirstChunk(&tk, clock.ms))
	}
	return warm.Target, r.Decide(textRequest(prompt+words(rng, 400), 2), NoRank)
}

func TestContinuationStaysOnAHolderJustAtTheCap(t *testing.T) {
	// 4 requests put the holder at the cap (2 × ceil(5 / 3)): one request's charge
	// (2000 tokens, the recent mean) is less than recomputing 2000 cached tokens.
	holder, d := continuationBesideABusyHolder(t, 4)
	assert.Equal(t, KindContinuation, d.Kind)
	assert.Equal(t, holder.ID, d.Target.ID)
}

func TestContinuationLeavesAHolderFarOverTheCap(t *testing.T) {
	// 20 requests, 7 from one below the cap (2 × ceil(21 / 3)) up: the charge
	// outweighs the prompt cached there, and the continuation is computed elsewhere.
	holder, d := continuationBesideABusyHolder(t, 20)
	assert.Equal(t, KindLoad, d.Kind)
	assert.NotEqual(t, holder.ID, d.Target.ID)
}

func TestContinuationWeighsItsHolderAtTheCapBeforeAShorterMatch(t *testing.T) {
	// A conversation without an id: a system prompt and its history are cached on one
	// of eight targets, the system prompt alone on another. With 4 requests decoding
	// there and 1 on each other target, the history's holder is at the cap. The next
	// turn's match on the other target is long enough for a continuation too, but the
	// holder is weighed first: one request's charge and its decode load cost less
	// than recomputing the history elsewhere. So it is when the history ends between
	// two of the index's checkpoints, past the system prompt's last one: the deepest
	// checkpoint matched is then the system prompt's, held by both targets, and the
	// history is found beside it.
	for _, c := range []struct {
		name            string
		system, history int // characters: 4 a token, 64 a 16-token block
	}{
		{"the history past a checkpoint", 24000, 4000},
		{"the history between checkpoints", 513 * 64, 60 * 64},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := config.ParseConfig([]byte(`{"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":8}]}}}`))
			require.NoError(t, err)
			clock := &fakeClock{ms: 1e6}
			r := NewRouter(&cfg, state.NewMemoryStore(), clock.now)
			rng := rand.New(rand.NewSource(12))
			system, history := words(rng, c.system), words(rng, c.history)
			ts := r.DecodeTargets()
			holder, other := ts[0], ts[1]
			for _, rec := range []struct {
				text   string
				target Target
			}{{system + history, holder}, {system + words(rng, 400), other}} {
				q := textRequest(rec.text, 1)
				cps, _ := prefix.HashCheckpoints(q.Model, q.Prompt, q.BlockBytes, nil)
				r.decode.index.Record(cps, rec.target.ID, 0, 0)
			}
			for _, tg := range ts {
				decoding := 1
				if tg.ID == holder.ID {
					decoding = 4
				}
				for n := 0; n < decoding; n++ {
					tk, err := r.decode.ledger.AcquireQueued(tg.ID, 2000, 2000, 0, clock.ms)
					require.NoError(t, err)
					require.NoError(t, r.decode.ledger.FirstChunk(&tk, clock.ms))
				}
			}
			d := r.Decide(textRequest(system+history+words(rng, 800), 2), NoRank)
			assert.Equal(t, KindContinuation, d.Kind)
			assert.Equal(t, holder.ID, d.Target.ID)
		})
	}
}
