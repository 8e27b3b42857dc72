package routing

import (
	"math/rand"
	"testing"

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
	req := textRequest(system+words(rng, 300), 2)
	req.Conversation, req.HasConversation = 7, true
	d := r.Decide(req, NoRank)
	require.Equal(t, KindNewConversation, d.Kind)
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
