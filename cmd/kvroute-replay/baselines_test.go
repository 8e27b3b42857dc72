package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// idleFleet is a fleet of n targets with nothing in flight.
func idleFleet(n int) *Fleet {
	return NewFleet(FleetConfig{Endpoints: n, DPSize: 1, CacheTokens: 512 * 64, PrefillMSPerToken: 1, DecodeMSPerToken: 1, MaxRunning: 64}, 512)
}

// load puts k one-token requests in flight on target t: their prefills queue behind
// each other (all but the first wait), and nothing completes unless the fleet advances.
func load(f *Fleet, t, k int) {
	for i := 0; i < k; i++ {
		f.assign(textReq(100000+i, f.now, []uint64{uint64(1<<40 + t<<20 + i)}, 1, 1, "x"), t)
	}
}

// words returns n characters of deterministic text for seed.
func words(seed uint64, n int) string {
	b := make([]byte, n)
	fillWords(b, seed)
	return string(b)
}

func TestRoundRobinCycles(t *testing.T) {
	p, f := newRoundRobin(), idleFleet(3)
	var got []int
	for i := 0; i < 7; i++ {
		got = append(got, p.Choose(nil, f))
	}
	assert.Equal(t, []int{0, 1, 2, 0, 1, 2, 0}, got)
}

func TestLeastLoadedPicksFewestInFlightRoundRobinAmongTies(t *testing.T) {
	p, f := newLeastLoaded(), idleFleet(3)
	load(f, 0, 2)
	load(f, 1, 1)
	load(f, 2, 1)
	assert.Equal(t, 1, p.Choose(nil, f))
	assert.Equal(t, 2, p.Choose(nil, f), "ties (1 and 2) are taken in turn")
	load(f, 1, 5)
	assert.Equal(t, 2, p.Choose(nil, f))
}

func TestConsistentHashKeys(t *testing.T) {
	cfg := FleetConfig{Endpoints: 4, DPSize: 2}
	p := newConsistentHash(cfg)
	require.Len(t, p.ring, 8*virtualNodesPerTarget)
	shared := words(1, 2048)
	a := textReq(0, 0, nil, 1000, 1, shared+words(2, 500))
	b := textReq(1, 0, nil, 1000, 1, shared+words(3, 900))
	assert.Equal(t, p.Choose(a, nil), p.Choose(b, nil), "the same first 512-token block goes to the same target")

	// Without ids, different first blocks spread over the ring.
	seen := map[int]bool{}
	for i := 0; i < 200; i++ {
		seen[p.Choose(textReq(i, 0, nil, 10, 1, words(uint64(100+i), 3000)), nil)] = true
	}
	assert.Len(t, seen, 8)

	// An explicit conversation id wins over the text.
	c1 := textReq(2, 0, nil, 1, 1, words(7, 3000))
	c2 := textReq(3, 0, nil, 1, 1, words(8, 3000))
	c1.Conversation, c2.Conversation = "conv-42", "conv-42"
	assert.Equal(t, p.Choose(c1, nil), p.Choose(c2, nil))

	// Adding a target moves only the keys that land on it.
	bigger := newConsistentHash(FleetConfig{Endpoints: 5, DPSize: 2})
	moved := 0
	for i := 0; i < 500; i++ {
		r := textReq(i, 0, nil, 1, 1, words(uint64(1000+i), 2100))
		if before, after := p.Choose(r, nil), bigger.Choose(r, nil); before != after {
			moved++
			assert.GreaterOrEqual(t, after, 8, "a key only moves to a new target")
		}
	}
	assert.Less(t, moved, 200)
}

func TestSGLangCacheThreshold(t *testing.T) {
	p, f := newSGLangCacheAware(3), idleFleet(3)
	sys := words(1, 64*40) // 40 chunks
	first := textReq(0, 0, nil, 1, 1, sys+words(2, 64*10))
	t0 := p.Choose(first, f)
	assert.Equal(t, 0, t0, "an empty system goes to the smallest tree: the first of equals")

	// 40 of ~60 chunks match (> 0.3): the matching worker, although its tree is largest.
	cont := textReq(1, 0, nil, 1, 1, sys+words(3, 64*20))
	assert.Equal(t, t0, p.Choose(cont, f))

	// A request matching 10 of 100 chunks (0.1 <= 0.3) goes to the smallest tree.
	low := textReq(2, 0, nil, 1, 1, sys[:64*10]+words(4, 64*90))
	got := p.Choose(low, f)
	assert.NotEqual(t, t0, got)
	assert.Equal(t, 1, got)
	assert.Equal(t, 100, p.trees[1].Len(), "the text is inserted into the chosen tree")
}

func TestSGLangBalanceThresholds(t *testing.T) {
	p, f := newSGLangCacheAware(2), idleFleet(2)
	text := words(5, 64*50)
	assert.Equal(t, 0, p.Choose(textReq(0, 0, nil, 1, 1, text), f))

	// max − min = 65 > 64 but 205 is not > 1.5 × 140: balanced, the cache wins.
	load(f, 0, 205)
	load(f, 1, 140)
	assert.Equal(t, 0, p.Choose(textReq(1, 0, nil, 1, 1, text), f))

	// Both thresholds exceeded: the least loaded, whatever the cache.
	f2 := idleFleet(2)
	load(f2, 0, 70)
	load(f2, 1, 5)
	assert.Equal(t, 1, p.Choose(textReq(2, 0, nil, 1, 1, text), f2))
	assert.True(t, p.trees[1].Contains(textReq(3, 0, nil, 1, 1, text).Full64()[0]),
		"imbalanced routing still inserts the text into the chosen tree")

	// abs threshold alone is not enough: 64 − 0 is not > 64.
	f3 := idleFleet(2)
	load(f3, 1, 64)
	p3 := newSGLangCacheAware(2)
	p3.Choose(textReq(4, 0, nil, 1, 1, words(6, 64*50)), idleFleet(2)) // tree 0 now holds it
	assert.Equal(t, 0, p3.Choose(textReq(5, 0, nil, 1, 1, words(6, 64*50)), f3))
}

func TestGIEPrefixScorerAndWeights(t *testing.T) {
	p, f := newGIEDefaultScorers(3, 1), idleFleet(3)
	doc := words(9, 64*300) // longer than 256 blocks: only the first 256 are hashed
	r0 := textReq(0, 0, nil, 1, 1, doc)
	require.Len(t, p.hashes(r0), 257, "the model hash and 256 blocks")
	t0 := p.Choose(r0, f)

	// The same prefix scores 3 × 1.0 on t0; others 0. With equal queues (2 × 1.0 each)
	// and kv-cache use, t0 wins.
	r1 := textReq(1, 0, nil, 1, 1, doc[:64*256]+words(10, 640))
	assert.Equal(t, t0, p.Choose(r1, f))

	// Load t0: 3 waiting prompts give it queue score 0 (others 1): 3×1 + 2×0 + 2 on t0
	// against 0 + 2×1 + 2 elsewhere: the prefix still wins...
	load(f, t0, 4)
	assert.Equal(t, t0, p.Choose(textReq(2, 0, nil, 1, 1, doc), f))
	// ...but a prompt sharing only half of the hashed prefix scores 3×129/257 + 0 + 2
	// on t0 against 4 elsewhere: it goes elsewhere.
	half := textReq(3, 0, nil, 1, 1, doc[:64*128]+words(11, 64*128))
	assert.NotEqual(t, t0, p.Choose(half, f))
}

func TestGIEShortPromptsAreNotHashed(t *testing.T) {
	p := newGIEDefaultScorers(2, 1)
	assert.Nil(t, p.hashes(textReq(0, 0, nil, 1, 1, "short prompt")))
}

// assertSeededSpread asserts that pick gives the same targets for the same seed and
// more than one target over its picks: a tie-break that is random but seeded.
func assertSeededSpread(t *testing.T, pick func(seed uint64) []int) {
	t.Helper()
	assert.Equal(t, pick(7), pick(7))
	seen := map[int]bool{}
	for _, target := range pick(7) {
		seen[target] = true
	}
	assert.Greater(t, len(seen), 1)
}

func TestGIETieBreakIsRandomButSeeded(t *testing.T) {
	pick := func(seed uint64) []int {
		p, f := newGIEDefaultScorers(4, seed), idleFleet(4)
		var out []int
		for i := 0; i < 20; i++ {
			// Under one 64-byte block: no prefix score; equal queues and KV: all tie.
			out = append(out, p.Choose(textReq(i, 0, nil, 1, 1, words(uint64(50+i), 40)), f))
		}
		return out
	}
	assertSeededSpread(t, pick)
}

func TestTRTLLMExplicitConversationIsSticky(t *testing.T) {
	p, f := newTRTLLMConversation(3), idleFleet(3)
	a := textReq(0, 0, nil, 1, 1, words(1, 1000))
	a.Conversation = "alice"
	ta := p.Choose(a, f)
	// A later turn of alice with unrelated text still goes to ta, even when ta is busy.
	p.load[ta] += 1_000_000
	a2 := textReq(1, 0, nil, 1, 1, words(2, 1000))
	a2.Conversation = "alice"
	assert.Equal(t, ta, p.Choose(a2, f))
	// A new explicit id is never matched implicitly: least loaded.
	b := textReq(2, 0, nil, 1, 1, words(1, 1000))
	b.Conversation = "bob"
	assert.NotEqual(t, ta, p.Choose(b, f))
}

func TestTRTLLMImplicitContinuationAt075(t *testing.T) {
	p, f := newTRTLLMConversation(3), idleFleet(3)
	turn1 := words(1, 128*30)
	t1 := p.Choose(textReq(0, 0, nil, 1, 1, turn1), f)
	// Turn 2 extends turn 1 by 8 blocks: 30 of 38 match (0.79 >= 0.75).
	turn2 := turn1 + words(2, 128*8)
	p.load[t1] += 1_000_000 // no overload gate
	assert.Equal(t, t1, p.Choose(textReq(1, 0, nil, 1, 1, turn2), f))
	// The session now holds turn 2's hashes: turn 3 = turn 2 + 10 blocks (38 of 48 = 0.79).
	turn3 := turn2 + words(3, 128*10)
	assert.Equal(t, t1, p.Choose(textReq(2, 0, nil, 1, 1, turn3), f))
	// A prompt sharing 30 of 60 blocks (0.5) is a new session on the least loaded.
	other := textReq(3, 0, nil, 1, 1, turn1+words(4, 128*30))
	assert.NotEqual(t, t1, p.Choose(other, f))
	assert.Equal(t, 2, len(p.sessions), "turns 1-3 are one implicit session, the other prompt a second")
}

func TestTRTLLMLeastLoadedByContentWeight(t *testing.T) {
	p, f := newTRTLLMConversation(2), idleFleet(2)
	big := textReq(0, 0, nil, 1, 1, words(1, 128*100))
	small := textReq(1, 0, nil, 1, 1, words(2, 128*2))
	assert.Equal(t, 0, p.Choose(big, f))   // loads equal: round-robin counter → 0
	assert.Equal(t, 1, p.Choose(small, f)) // 1 carries less content
	assert.Equal(t, 1, p.Choose(textReq(2, 0, nil, 1, 1, words(3, 128*5)), f))
	p.Done(big, 0) // weight released
	assert.Equal(t, 0, p.load[0])
	assert.Equal(t, 0, p.Choose(textReq(3, 0, nil, 1, 1, words(4, 128*5)), f))
}

func TestTRTLLMBlocksLeaveOutTheLastCodePoint(t *testing.T) {
	r := textReq(0, 0, nil, 1, 1, strings.Repeat("a", 129))
	assert.Len(t, r.Chain128, 1, "128 code points hashed: the 129th (last) is left out")
	r = textReq(0, 0, nil, 1, 1, strings.Repeat("a", 130))
	assert.Len(t, r.Chain128, 2, "the partial second block counts")
}

func TestDynamoWeighsPrefillBlocksAgainstActiveBlocks(t *testing.T) {
	p, f := newDynamoKV(3, 1), idleFleet(3)
	doc := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	f.assign(textReq(0, 0, doc, 8*512, 1, "d"), 0) // target 0 caches the 8 blocks
	next := func(i int) *Request {
		return textReq(i, 0, append(append([]uint64(nil), doc...), uint64(100+i)), 8*512+504, 1, "d")
	}
	// Target 0: 504 tokens to prefill (0.98 blocks) + 9 active blocks; elsewhere
	// 4600 / 512 = 8.98 + 9.
	assert.Equal(t, 0, p.Choose(next(1), f))
	assert.Equal(t, 504, p.prefill[0])
	assert.Len(t, p.active[0], 9)
	// Another question on the document: its 8 blocks are active there already and
	// count once (8 + 2 new, with 2 × 0.98 to prefill); still below 17.98.
	assert.Equal(t, 0, p.Choose(next(2), f))
	assert.Len(t, p.active[0], 10)
	// Prefill queued there past the document's worth sends the next one elsewhere.
	p.prefill[0] += 8 * 512
	assert.NotEqual(t, 0, p.Choose(next(3), f))
	// The first token takes a request's prefill off; completion frees its blocks,
	// the shared ones only with the last request holding them.
	p.FirstToken(next(1), 0)
	assert.Equal(t, 504+8*512, p.prefill[0])
	p.Done(next(1), 0)
	assert.Len(t, p.active[0], 9)
	p.Done(next(2), 0)
	assert.Empty(t, p.active[0])
	assert.Equal(t, 8*512, p.prefill[0])
}

func TestDynamoTieBreakIsRandomButSeeded(t *testing.T) {
	pick := func(seed uint64) []int {
		p, f := newDynamoKV(4, seed), idleFleet(4)
		var out []int
		for i := 0; i < 20; i++ {
			r := textReq(i, 0, []uint64{uint64(1000 + i)}, 100, 1, "x")
			out = append(out, p.Choose(r, f))
			p.Done(r, out[i])
		}
		return out
	}
	assertSeededSpread(t, pick)
}
