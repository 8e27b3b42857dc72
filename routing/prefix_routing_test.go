package routing

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/routing/extract"
	"github.com/kvroute/kvroute/routing/hashx"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// textRequest is an anonymous request whose canonical prompt is text.
func textRequest(text string, id uint64) *extract.Request {
	return &extract.Request{Model: "m", Prompt: []byte(text), BlockBytes: 16 * 4, Tokens: len(text) / 4, Identity: id}
}

func words(rng *rand.Rand, n int) string {
	var b strings.Builder
	for b.Len() < n {
		fmt.Fprintf(&b, "w%d ", rng.Intn(100000))
	}
	return b.String()[:n]
}

func TestChatsWithoutIDsFollowTheirHistory(t *testing.T) {
	r := NewRouter(testConfig(t, ""), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	rng := rand.New(rand.NewSource(1))
	const chats = 9
	history := make([]string, chats)
	home := make([]string, chats)
	for turn := 0; turn < 6; turn++ {
		for c := 0; c < chats; c++ {
			// Each turn adds a question and an answer to a history that starts long
			// enough for the previous turn to be ≥ 75% of the next.
			if turn == 0 {
				history[c] = words(rng, 2500)
			}
			history[c] += words(rng, 300+rng.Intn(400))
			d := r.Decide(textRequest(history[c], rng.Uint64()), NoRank)
			if turn == 0 {
				assert.Equal(t, KindLoad, d.Kind)
				home[c] = d.Target.Address
			} else {
				assert.Equal(t, KindContinuation, d.Kind, "chat %d turn %d", c, turn)
				assert.Equal(t, home[c], d.Target.Address, "chat %d turn %d", c, turn)
			}
			_ = r.Release(d.Ticket)
		}
	}
	spread := map[string]int{}
	for _, h := range home {
		spread[h]++
	}
	assert.Len(t, spread, 3, "first turns spread by load: %v", spread)
}

func TestSharedDocumentAttractsItsQuestions(t *testing.T) {
	r := NewRouter(testConfig(t, ""), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	rng := rand.New(rand.NewSource(2))
	doc := words(rng, 20000)
	first := r.Decide(textRequest(doc+" Q: summarise", 1), NoRank)
	_ = r.Release(first.Ticket)
	for q := 0; q < 10; q++ {
		// Other traffic in between.
		other := r.Decide(textRequest(words(rng, 3000), rng.Uint64()), NoRank)
		d := r.Decide(textRequest(doc+fmt.Sprintf(" Q%d: %s", q, words(rng, 200)), rng.Uint64()), NoRank)
		assert.Contains(t, []Kind{KindContinuation, KindPrefix}, d.Kind)
		assert.Equal(t, first.Target.Address, d.Target.Address, "question %d", q)
		_ = r.Release(d.Ticket)
		_ = r.Release(other.Ticket)
	}
}

func TestSharedSystemPromptUnderTheGateSpreadsByLoad(t *testing.T) {
	r := NewRouter(testConfig(t, `,"prefix":{"match_rate_threshold":0.2}`), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	rng := rand.New(rand.NewSource(3))
	system := words(rng, 640) // 10 blocks
	seen := map[string]int{}
	var held []LoadTicket
	for i := 0; i < 30; i++ {
		// The shared part is ~10% of each prompt: under the 0.2 gate.
		d := r.Decide(textRequest(system+words(rng, 5760), rng.Uint64()), NoRank)
		assert.Equal(t, KindLoad, d.Kind)
		seen[d.Target.Address]++
		held = append(held, d.Ticket)
	}
	assert.Equal(t, map[string]int{"10.0.0.1:8000": 10, "10.0.0.2:8000": 10, "10.0.0.3:8000": 10}, seen)
	for _, tk := range held {
		_ = r.Release(tk)
	}
}

func TestGateBoundaryIsStrict(t *testing.T) {
	for _, c := range []struct {
		sharedBlocks int
		want         Kind
	}{{1, KindLoad}, {2, KindPrefix}} {
		t.Run(fmt.Sprint(c.sharedBlocks), func(t *testing.T) {
			r := NewRouter(testConfig(t, ""), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
			rng := rand.New(rand.NewSource(4))
			shared := words(rng, 64*c.sharedBlocks)
			// Seed the shared blocks on one target and keep a little load on it, so
			// load alone would choose another target.
			seed := r.Decide(textRequest(shared+words(rng, 64*9), 1), NoRank)
			_ = r.Release(seed.Ticket)
			_, err := r.decode.ledger.Acquire(seed.Target.ID, 10, 1e6)
			require.NoError(t, err)
			// 10 blocks, 160 tokens: 1 shared block is a rate of exactly 0.1.
			req := textRequest(shared+words(rng, 640-64*c.sharedBlocks), 2)
			require.Equal(t, 160, req.Tokens)
			d := r.Decide(req, NoRank)
			assert.Equal(t, c.want, d.Kind)
			if c.want == KindPrefix {
				assert.Equal(t, seed.Target.ID, d.Target.ID)
			} else {
				assert.NotEqual(t, seed.Target.ID, d.Target.ID)
			}
		})
	}
}

func TestSkipBlocksKeepsASharedPrefixFromLookingLikeAContinuation(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	system := words(rng, 64*12) // 12 blocks of system prompt
	tail := words(rng, 64*3)
	for _, c := range []struct {
		skip string
		want Kind
	}{{"0", KindContinuation}, {"12", KindPrefix}} {
		t.Run(c.skip, func(t *testing.T) {
			r := NewRouter(testConfig(t, `,"prefix":{"skip_blocks":`+c.skip+`}`), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
			first := r.Decide(textRequest(system+words(rng, 64*3), 1), NoRank)
			_ = r.Release(first.Ticket)
			// 12 of 15 blocks match (0.8 ≥ 0.75), but all of them are the system prompt.
			d := r.Decide(textRequest(system+tail, 2), NoRank)
			assert.Equal(t, c.want, d.Kind)
		})
	}
}

func TestContinuationOfA300kCharacterPrompt(t *testing.T) {
	r := NewRouter(testConfig(t, ""), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	rng := rand.New(rand.NewSource(6))
	long := words(rng, 300_000)
	first := r.Decide(textRequest(long, 1), NoRank)
	_ = r.Release(first.Ticket)
	for i := 0; i < 5; i++ {
		o := r.Decide(textRequest(words(rng, 5000), rng.Uint64()), NoRank)
		defer r.Release(o.Ticket)
	}
	d := r.Decide(textRequest(long+" and one more question", 2), NoRank)
	assert.Equal(t, KindContinuation, d.Kind)
	assert.Equal(t, first.Target.ID, d.Target.ID)
}

func TestTokenIDPromptsMatchByIDBlocks(t *testing.T) {
	r := NewRouter(testConfig(t, ""), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	ids := func(n int, seed int64) []byte {
		rng := rand.New(rand.NewSource(seed))
		out := make([]byte, 0, 4*n)
		for i := 0; i < n; i++ {
			v := rng.Uint32() % 128000
			out = append(out, byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
		}
		return out
	}
	p := ids(400, 9)
	req := func(b []byte, id uint64) *extract.Request {
		return &extract.Request{Model: "m", Prompt: b, BlockBytes: 16 * 4, Tokens: len(b) / 4, Identity: id}
	}
	first := r.Decide(req(p, 1), NoRank)
	_ = r.Release(first.Ticket)
	d := r.Decide(req(append(append([]byte(nil), p...), ids(40, 10)...), 2), NoRank)
	assert.Equal(t, KindContinuation, d.Kind)
	assert.Equal(t, first.Target.ID, d.Target.ID)
}

func TestFirstTurnScoreUsesThePrefix(t *testing.T) {
	r := NewRouter(testConfig(t, `,"conversation":{"first_turn":"score"}`), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	rng := rand.New(rand.NewSource(7))
	system := words(rng, 4000)
	var home uint64
	for i := 0; i < 6; i++ {
		req := textRequest(system+words(rng, 300), rng.Uint64())
		req.Conversation, req.HasConversation = uint64(1000+i), true
		d := r.Decide(req, NoRank)
		assert.Equal(t, KindNewConversation, d.Kind)
		if i == 0 {
			home = d.Target.ID
		}
		assert.Equal(t, home, d.Target.ID, "a long shared system prompt draws new conversations")
		_ = r.Release(d.Ticket)
	}
}

func TestPrefixDisabledRoutesByLoad(t *testing.T) {
	r := NewRouter(testConfig(t, `,"prefix":{"enabled":false}`), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	rng := rand.New(rand.NewSource(8))
	long := words(rng, 4000)
	for i := 0; i < 5; i++ {
		d := r.Decide(textRequest(long, uint64(i)), NoRank)
		assert.Equal(t, KindLoad, d.Kind)
		_ = r.Release(d.Ticket)
	}
}

func TestMatchedTokensAreTheChosenTargetsPrefixBeforeTheRequest(t *testing.T) {
	r := NewRouter(testConfig(t, ""), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	rng := rand.New(rand.NewSource(3))
	history := words(rng, 4000) // 1000 tokens, 62 full blocks of 16
	first := r.Decide(textRequest(history, 1), NoRank)
	assert.Equal(t, 0, first.MatchedTokens, "nothing recorded yet: its own record is not a match")
	require.NoError(t, r.FirstChunk(&first.Ticket))
	next := r.Decide(textRequest(history+words(rng, 400), 2), NoRank)
	require.Equal(t, first.Target.ID, next.Target.ID)
	// The index keeps checkpoints, not every block: a match is at least 7/8 of the truth.
	assert.True(t, next.MatchedTokens >= 62*16*7/8 && next.MatchedTokens <= 62*16, "%d", next.MatchedTokens)
	other := r.Decide(textRequest(words(rng, 4000), 3), NoRank)
	assert.Equal(t, 0, other.MatchedTokens)
}

func TestMatchedTokensOfAStickyConversation(t *testing.T) {
	r := NewRouter(testConfig(t, ""), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	rng := rand.New(rand.NewSource(4))
	history := words(rng, 4000)
	req := func(text string) *extract.Request {
		q := textRequest(text, uint64(len(text)))
		q.Conversation, q.HasConversation = hashx.FingerprintString("c"), true
		return q
	}
	first := r.Decide(req(history), NoRank)
	assert.Equal(t, KindNewConversation, first.Kind)
	assert.Equal(t, 0, first.MatchedTokens)
	second := r.Decide(req(history+words(rng, 400)), NoRank)
	assert.Equal(t, KindSticky, second.Kind)
	assert.True(t, second.MatchedTokens >= 62*16*7/8 && second.MatchedTokens <= 62*16,
		"a sticky placement looks no match up to place, but one is measured: %d", second.MatchedTokens)
}

func TestUncachedOnlyDisaggregatesANewConversation(t *testing.T) {
	cfg := pdConfig(t, `{"mode":"vllm","threshold_tokens":200,"uncached_only":true}`)
	r := NewRouter(cfg, state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	rng := rand.New(rand.NewSource(5))
	q := textRequest(words(rng, 4000), 1)
	q.Conversation, q.HasConversation = hashx.FingerprintString("new"), true
	d := r.Decide(q, NoRank)
	assert.Equal(t, KindNewConversation, d.Kind)
	assert.Equal(t, PDDisaggregated, d.PD, "the request's own prefix record is not a cache hit")
}

func TestRoundRobinFirstTurnsGoWhereTheirSystemPromptIsCached(t *testing.T) {
	// The default first_turn: a request without an id caches a long system prompt on
	// one target; the new conversations that share it rotate over the targets that
	// cache it (that one), not over all three.
	r := NewRouter(testConfig(t, ""), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	rng := rand.New(rand.NewSource(7))
	system := words(rng, 4000)
	warm := r.Decide(textRequest(system+words(rng, 300), 1), NoRank)
	require.NoError(t, r.FirstChunk(&warm.Ticket))
	require.NoError(t, r.Release(warm.Ticket))
	for i := 0; i < 6; i++ {
		req := textRequest(system+words(rng, 300), rng.Uint64())
		req.Conversation, req.HasConversation = uint64(1000+i), true
		d := r.Decide(req, NoRank)
		assert.Equal(t, KindNewConversation, d.Kind)
		assert.Equal(t, warm.Target.ID, d.Target.ID, "conversation %d", i)
		require.NoError(t, r.FirstChunk(&d.Ticket))
		require.NoError(t, r.Release(d.Ticket))
	}
}

func TestRoundRobinFirstTurnsSkipQueuedPrefill(t *testing.T) {
	// Nothing cached anywhere: the cursor rotates over the targets with no prefill
	// queued. Once none is queued, the target that has just computed 4000 tokens is
	// left out while the others have worked less lately; when that work has halved
	// away, all three are used again.
	clock := &fakeClock{ms: 1e6}
	r := NewRouter(testConfig(t, ""), state.NewMemoryStore(), clock.now)
	targets := r.DecodeTargets()
	busy, err := r.decode.ledger.AcquireQueued(targets[0].ID, 4000, 4000, 0, 1e6)
	require.NoError(t, err)
	var got []string
	for i := 0; i < 4; i++ {
		d := r.Decide(convRequest(fmt.Sprint("q", i)), NoRank)
		require.Equal(t, KindNewConversation, d.Kind)
		got = append(got, d.Target.Address)
		require.NoError(t, r.FirstChunk(&d.Ticket))
		require.NoError(t, r.Release(d.Ticket))
	}
	assert.NotContains(t, got, targets[0].Address)
	assert.NotEqual(t, got[0], got[1], "the turns alternate")
	require.NoError(t, r.FirstChunk(&busy))
	require.NoError(t, r.Release(busy))
	used := map[string]bool{}
	for i := 0; i < 6; i++ {
		d := r.Decide(convRequest(fmt.Sprint("r", i)), NoRank)
		used[d.Target.Address] = true
		require.NoError(t, r.Release(d.Ticket))
	}
	assert.Equal(t, map[string]bool{targets[1].Address: true, targets[2].Address: true}, used)
	clock.ms += 20 * recentHalfLifeMS
	used = map[string]bool{}
	for i := 0; i < 3; i++ {
		d := r.Decide(convRequest(fmt.Sprint("s", i)), NoRank)
		used[d.Target.Address] = true
		require.NoError(t, r.Release(d.Ticket))
	}
	assert.Len(t, used, 3)
}

// A round-robin first turn spreads by the time the targets' recent prefill work took
// there: three targets were each sent 40 000 tokens, computed in 1 s on the first two
// and in 2 s on the third, which is then left out, since its work counts twice as
// long. Its rate counts only once it has been observed over a second of prefill: in
// 500 ms against 250, all three take turns.
func TestRoundRobinFirstTurnsSpreadByTheTimeTheirWorkTook(t *testing.T) {
	for _, tc := range []struct {
		fast, slow int64 // ms the 40 000 tokens took
		used       int
	}{{1000, 2000, 2}, {1000, 1000, 3}, {250, 500, 3}} {
		clock := &fakeClock{ms: 1e6}
		r := NewRouter(testConfig(t, ""), state.NewMemoryStore(), clock.now)
		for i, tg := range r.DecodeTargets() {
			took := tc.fast
			if i == 2 {
				took = tc.slow
			}
			tk, err := r.decode.ledger.AcquireQueued(tg.ID, 40000, 40000, clock.ms, clock.ms)
			require.NoError(t, err)
			require.NoError(t, r.decode.ledger.FirstChunk(&tk, clock.ms+took))
			require.NoError(t, r.decode.ledger.Release(tk, clock.now))
		}
		clock.ms += 3000
		used := map[string]bool{}
		for i := 0; i < 6; i++ {
			d := r.Decide(convRequest(fmt.Sprint("c", i)), NoRank)
			require.Equal(t, KindNewConversation, d.Kind)
			used[d.Target.Address] = true
			require.NoError(t, r.Release(d.Ticket))
		}
		assert.Len(t, used, tc.used, "%d ms against %d", tc.slow, tc.fast)
	}
}
