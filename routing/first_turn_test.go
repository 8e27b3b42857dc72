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

// slotsCase sets up three targets: a 1000-token system prompt computed and done on
// the holder (so its rate is known, about 6 tokens a ms; the others have none of
// their own), running[j] requests past their first chunk on target j (the holder
// first), and waiting[j] requests of 50 uncached tokens each sent to it, still without
// a first chunk afterMS later; then it places a new conversation that shares the
// prompt.
func slotsCase(t *testing.T, running, waiting [3]int, afterMS int64) (targets []Target, got Target) {
	clock := &fakeClock{ms: 1e6}
	r := NewRouter(testConfig(t, ""), state.NewMemoryStore(), clock.now)
	rng := rand.New(rand.NewSource(9))
	system := words(rng, 4000)
	warm := r.Decide(textRequest(system+words(rng, 300), 1), NoRank)
	clock.ms += 200
	require.NoError(t, r.FirstChunk(&warm.Ticket))
	require.NoError(t, r.Release(warm.Ticket))
	targets = []Target{warm.Target}
	for _, tg := range r.DecodeTargets() {
		if tg.ID != warm.Target.ID {
			targets = append(targets, tg)
		}
	}
	for j, n := range running {
		for k := 0; k < n; k++ {
			tk, err := r.decode.ledger.AcquireQueued(targets[j].ID, 100, 0, 0, clock.ms)
			require.NoError(t, err)
			require.NoError(t, r.decode.ledger.FirstChunk(&tk, clock.ms))
		}
	}
	for j, n := range waiting {
		for k := 0; k < n; k++ {
			_, err := r.decode.ledger.AcquireQueued(targets[j].ID, 100, 50, clock.ms, clock.ms)
			require.NoError(t, err)
		}
	}
	clock.ms += afterMS
	req := textRequest(system+words(rng, 300), 2)
	req.Conversation, req.HasConversation = 7, true
	d := r.Decide(req, NoRank)
	require.Equal(t, KindNewConversation, d.Kind)
	return targets, d.Target
}

// A first turn and targets out of running slots (Load.OutOfSlots). got: the target
// it should take, by its index in slotsCase's order (the holder first), or -1 for
// any but the holder.
func TestFirstTurnAndRunningSlots(t *testing.T) {
	for _, tc := range []struct {
		name             string
		running, waiting [3]int
		afterMS          int64
		got              int
	}{
		// Sixteen running and two waiting where their prefill should long be done:
		// the engine starts none until another ends, and the turn would wait too.
		{"holder full", [3]int{16, 15, 15}, [3]int{2}, 1000, -1},
		// The pool's engines are taken to run as many as the full one: a target with
		// 16 in flight would be full with this turn too.
		{"as loaded as the full one", [3]int{16, 16, 15}, [3]int{2}, 1000, 2},
		{"every target full: the cache decides", [3]int{16, 18, 18}, [3]int{2}, 1000, 0},
		// The same two 2 ms after they were sent: their prefill is still running.
		{"prefill still due", [3]int{16, 15, 15}, [3]int{2}, 2, 0},
		// One late request may be a prompt that took longer than the rate says.
		{"one late", [3]int{16, 15, 15}, [3]int{1}, 1000, 0},
		// Under sixteen running, requests without a first chunk are more likely not
		// streamed (their body comes whole at the end) than waiting for a slot.
		{"few running", [3]int{15, 10, 10}, [3]int{3}, 1000, 0},
		// A target with no rate of its own is judged at its peers'.
		{"full without a rate of its own", [3]int{16, 16, 10}, [3]int{0, 2}, 1000, 2},
		// Two full targets: the busier one's count is the pool's (a target with 17
		// in flight has room), and a full target is left out whatever its count.
		{"two full", [3]int{16, 20, 15}, [3]int{2, 2, 2}, 1000, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts, got := slotsCase(t, tc.running, tc.waiting, tc.afterMS)
			if tc.got < 0 {
				assert.NotEqual(t, ts[0].Address, got.Address)
			} else {
				assert.Equal(t, ts[tc.got].Address, got.Address)
			}
		})
	}
}
