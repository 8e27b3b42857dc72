package routing

import (
	"math/rand"
	"testing"

	"github.com/kvroute/kvroute/routing/hashx"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// convTurns sends the turns of conversations to a router on a fake clock.
type convTurns struct {
	t     *testing.T
	r     *Router
	clock *fakeClock
}

// send decides a turn of conv.
func (c convTurns) send(conv, text string, id uint64) Decision {
	req := textRequest(text, id)
	req.Conversation, req.HasConversation = hashx.FingerprintString(conv), true
	return c.r.Decide(req, NoRank)
}

// done streams d's first chunk 100 ms later and ends it.
func (c convTurns) done(d Decision) {
	c.clock.ms += 100
	require.NoError(c.t, c.r.FirstChunk(&d.Ticket))
	require.NoError(c.t, c.r.Release(d.Ticket))
}

// historyCase starts three targets with a cache of 20000 tokens each, a 2000-token
// system prompt computed on every one, and a conversation whose 500-token first turn
// went to home. Another conversation mapped to home then sends it written tokens of
// its own, after the system prompt (which stays fresh there); a reply of 8000
// tokens is left decoding at home, and queued tokens queued there. It returns the
// conversation's second turn.
func historyCase(t *testing.T, written int, queued int64) (home Target, d Decision) {
	clock := &fakeClock{ms: 1e6}
	r := NewRouter(testConfig(t, `,"prefix":{"target_cache_tokens":20000}`), state.NewMemoryStore(), clock.now)
	rng := rand.New(rand.NewSource(21))
	system := words(rng, 8000)
	c := convTurns{t, r, clock}
	turn, done := c.send, c.done
	onEach(t, r, func(i int, conv string) { done(turn(conv, system+words(rng, 128), uint64(i))) })
	first := system + words(rng, 2000)
	d = turn("c", first, 10)
	require.Equal(t, KindNewConversation, d.Kind)
	home = d.Target
	done(d)
	require.NoError(t, r.decode.conv.Record(hashx.FingerprintString("w"), home.ID))
	other := turn("w", system+words(rng, 4*written), 11)
	require.Equal(t, home.ID, other.Target.ID)
	done(other)
	_, err := r.decode.ledger.Acquire(home.ID, 8000, clock.ms)
	require.NoError(t, err)
	if queued > 0 {
		_, err := r.decode.ledger.AcquireQueued(home.ID, queued, queued, clock.ms, clock.ms)
		require.NoError(t, err)
	}
	return home, turn("c", first+words(rng, 400), 12)
}

// onEach maps a conversation of its own to each target and has send place its turn.
func onEach(t *testing.T, r *Router, send func(i int, conv string)) {
	for i, tg := range r.DecodeTargets() {
		conv := "on-" + tg.Address
		require.NoError(t, r.decode.conv.Record(hashx.FingerprintString(conv), tg.ID))
		send(i, conv)
	}
}

func TestATurnStaysWhileItsTargetHoldsItsHistory(t *testing.T) {
	// 10000 tokens written since the first turn, and 1000 queued: its 2500 tokens
	// still fit the cache, and the queue is worth less than they are there.
	home, d := historyCase(t, 10000, 1000)
	assert.Equal(t, KindSticky, d.Kind)
	assert.Equal(t, home.ID, d.Target.ID)
}

func TestATurnWhoseHistoryTurnedOverLeavesAQueue(t *testing.T) {
	// 18000 tokens written, and 1000 queued: the history is gone (2500 + 19000 is
	// more than the cache), and home caches only the system
	// prompt every target holds. Keeping the turn there saves nothing and its copy
	// would likely go the same way: an idle target wins.
	home, d := historyCase(t, 18000, 1000)
	assert.Equal(t, KindOverflow, d.Kind)
	assert.NotEqual(t, home.ID, d.Target.ID)
}

func TestATurnWhoseHistoryTurnedOverStaysWithNothingToWaitFor(t *testing.T) {
	// The same, with nothing queued at home: the turn waits for nothing there, and
	// stays, though the reply decoding there makes other targets cheaper by the cost.
	home, d := historyCase(t, 19000, 0)
	assert.Equal(t, KindSticky, d.Kind)
	assert.Equal(t, home.ID, d.Target.ID)
}

func TestATurnFollowsItsHistoryToWhereItsLastTurnOverflowed(t *testing.T) {
	// The second turn overflows behind 40000 queued tokens, so another target holds
	// the conversation's longest history. With that queue down to 1000 tokens, the
	// third turn goes where the second went: home caches less of it.
	clock := &fakeClock{ms: 1e6}
	r := NewRouter(testConfig(t, `,"prefix":{"target_cache_tokens":1000000}`), state.NewMemoryStore(), clock.now)
	rng := rand.New(rand.NewSource(22))
	system := words(rng, 8000)
	c := convTurns{t, r, clock}
	turn := func(text string, id uint64) Decision { return c.send("c", text, id) }
	done := c.done
	onEach(t, r, func(i int, conv string) { done(c.send(conv, system+words(rng, 128), uint64(100+i))) })
	first := system + words(rng, 2000)
	d := turn(first, 1)
	require.Equal(t, KindNewConversation, d.Kind)
	home := d.Target
	done(d)
	long, err := r.decode.ledger.AcquireQueued(home.ID, 40000, 40000, 0, clock.ms)
	require.NoError(t, err)
	second := first + words(rng, 4000)
	d = turn(second, 2)
	require.Equal(t, KindOverflow, d.Kind)
	moved := d.Target
	done(d)
	require.NoError(t, r.Release(long))
	_, err = r.decode.ledger.AcquireQueued(home.ID, 1000, 1000, clock.ms, clock.ms)
	require.NoError(t, err)
	d = turn(second+words(rng, 400), 3)
	assert.Equal(t, KindOverflow, d.Kind)
	assert.Equal(t, moved.ID, d.Target.ID)
}
