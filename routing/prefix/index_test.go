package prefix

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckpointGrid(t *testing.T) {
	var grid []int
	for k := 1; k <= 64; k++ {
		if isCheckpoint(k) {
			grid = append(grid, k)
		}
	}
	assert.Equal(t, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
		18, 20, 22, 24, 26, 28, 30, 32, 36, 40, 44, 48, 52, 56, 60, 64}, grid)
	// The largest grid point at or below L is above 7/8 of L, for every L.
	last, bad := 0, -1
	for L := 1; L <= 1<<20; L++ {
		if isCheckpoint(L) {
			last = L
		}
		if 8*last <= 7*L && bad < 0 {
			bad = L
		}
	}
	assert.Equal(t, -1, bad, "first L whose grid point is at or below 7/8 of it")
}

func TestHashCheckpointsChainAndSeed(t *testing.T) {
	a := []byte("0123456789abcdef0123456789abcdef-tail")
	b := []byte("0123456789abcdef0123456789ABCDEF-tail")
	ca, n := HashCheckpoints("m", a, 8, nil)
	assert.Equal(t, 4, n)
	require.Len(t, ca, 4)
	cb, _ := HashCheckpoints("m", b, 8, nil)
	assert.Equal(t, ca[0], cb[0])
	assert.Equal(t, ca[1], cb[1])
	assert.Equal(t, ca[2], cb[2])
	assert.NotEqual(t, ca[3].Hash, cb[3].Hash, "the block with the difference differs")
	c, _ := HashCheckpoints("m", append([]byte("X"), a[1:]...), 8, nil)
	for i := range c {
		assert.NotEqual(t, ca[i].Hash, c[i].Hash, "the chain carries a difference forward")
	}
	cm, _ := HashCheckpoints("other-model", a, 8, nil)
	assert.NotEqual(t, ca[0].Hash, cm[0].Hash, "seeded with the model")
	none, n := HashCheckpoints("m", []byte("short"), 8, nil)
	assert.Empty(t, none)
	assert.Zero(t, n)
}

func TestHashCheckpointsHashesEveryBlockOfLongPrompts(t *testing.T) {
	// A 128k-token prompt (512 KiB at 4 bytes a token) in blocks of 64 bytes: 8192 blocks.
	p := make([]byte, 512<<10)
	rand.New(rand.NewSource(1)).Read(p)
	cps, n := HashCheckpoints("m", p, 64, nil)
	assert.Equal(t, 8192, n)
	assert.Equal(t, 8192, cps[len(cps)-1].Pos)
	assert.LessOrEqual(t, len(cps), 16+8*8+32*1+1)
	q := append([]byte(nil), p...)
	q[len(q)-1] ^= 1 // a change in the very last block
	cq, _ := HashCheckpoints("m", q, 64, nil)
	assert.Equal(t, cps[len(cps)-2], cq[len(cq)-2])
	assert.NotEqual(t, cps[len(cps)-1].Hash, cq[len(cq)-1].Hash)
}

// exactIndex is the reference: every recorded prompt, in full.
type exactIndex struct {
	prompts [][]uint64 // full chain hash per block
	targets []uint32
}

func chainOf(p []byte, blockBytes int) []uint64 {
	var out []uint64
	n := len(p) / blockBytes
	for k := 1; k <= n; k++ {
		cps, _ := HashCheckpoints("m", p[:k*blockBytes], blockBytes, nil)
		out = append(out, cps[len(cps)-1].Hash)
	}
	return out
}

func (e *exactIndex) record(chain []uint64, t uint32) {
	e.prompts = append(e.prompts, chain)
	e.targets = append(e.targets, t)
}

func (e *exactIndex) match(chain []uint64) map[uint32]int {
	out := map[uint32]int{}
	for i, p := range e.prompts {
		l := 0
		for l < len(p) && l < len(chain) && p[l] == chain[l] {
			l++
		}
		if l > out[e.targets[i]] {
			out[e.targets[i]] = l
		}
	}
	return out
}

// compareWithExact records every prompt of a workload on a random target of four and,
// before each, compares the index's matches with the exact index's. It returns how many
// target matches were checked and how many were at least 7/8 of the exact match.
func compareWithExact(t *testing.T, rng *rand.Rand, next func() []byte, n int) (checked, within int) {
	const blockBytes = 8
	targets := []uint32{11, 22, 33, 44}
	known := func(t uint32) bool { return t == 11 || t == 22 || t == 33 || t == 44 }
	x := NewPrefixIndex(state.NewMemoryStore(), "ns", "decode", 1<<20, 8)
	exact := &exactIndex{}
	for i := 0; i < n; i++ {
		p := next()
		chain := chainOf(p, blockBytes)
		cps, _ := HashCheckpoints("m", p, blockBytes, nil)
		got := x.Match(cps, known)
		want := exact.match(chain)
		gotBy := map[uint32]int{}
		for _, m := range got {
			gotBy[m.Target] = m.Blocks
		}
		for tg := range gotBy {
			require.Contains(t, want, tg, "a match must come from a recorded prompt")
		}
		for tg, w := range want {
			g := gotBy[tg]
			require.LessOrEqual(t, g, w, "prompt %d target %d: never above the exact match", i, tg)
			checked++
			if 8*g < 7*w && testing.Verbose() {
				t.Logf("prompt %d (%d blocks) target %d: got %d want %d", i, len(chain), tg, g, w)
			}
			if 8*g >= 7*w {
				within++
			}
		}
		tg := targets[rng.Intn(len(targets))]
		x.Record(cps, uint64(tg), 0, 0)
		exact.record(chain, tg)
	}
	return checked, within
}

func randomText(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + rng.Intn(26))
	}
	return b
}

func TestPrefixIndexAgainstExactIndexOnRealisticTraffic(t *testing.T) {
	// Conversations that grow turn by turn (some behind a shared system prompt) and
	// documents that many questions are asked about, interleaved.
	rng := rand.New(rand.NewSource(42))
	system := randomText(rng, 600)
	var convs [][]byte
	var docs [][]byte
	next := func() []byte {
		switch r := rng.Intn(10); {
		case r < 2 || len(convs) == 0:
			var c []byte
			if rng.Intn(2) == 0 {
				c = append(c, system...)
			}
			c = append(c, randomText(rng, 50+rng.Intn(800))...)
			convs = append(convs, c)
			return c
		case r < 6:
			i := rng.Intn(len(convs))
			convs[i] = append(convs[i], randomText(rng, 20+rng.Intn(600))...)
			return convs[i]
		case r < 7 || len(docs) == 0:
			d := randomText(rng, 2000+rng.Intn(6000))
			docs = append(docs, d)
			return append(append([]byte(nil), d...), randomText(rng, 40)...)
		default:
			d := docs[rng.Intn(len(docs))]
			return append(append([]byte(nil), d...), randomText(rng, 20+rng.Intn(100))...)
		}
	}
	checked, within := compareWithExact(t, rng, next, 600)
	assert.Greater(t, checked, 500)
	assert.Equal(t, checked, within, "every match at least 7/8 of the exact one")
}

func TestPrefixIndexAgainstExactIndexOnAdversarialTree(t *testing.T) {
	// Every prompt forks a random earlier one at a random point: many branches crowd
	// the same levels, so bucket-local eviction can lose a branch's deep checkpoints.
	// The match is still never above the exact one, and rarely below 7/8 of it.
	rng := rand.New(rand.NewSource(7))
	var prompts [][]byte
	next := func() []byte {
		var p []byte
		if len(prompts) > 0 && rng.Intn(4) > 0 {
			base := prompts[rng.Intn(len(prompts))]
			cut := rng.Intn(len(base) + 1)
			p = append(append([]byte(nil), base[:cut]...), randomText(rng, rng.Intn(3000))...)
		} else {
			p = randomText(rng, rng.Intn(4000))
		}
		prompts = append(prompts, p)
		return p
	}
	checked, within := compareWithExact(t, rng, next, 400)
	t.Logf("%d of %d matches at least 7/8 of the exact one", within, checked)
	assert.GreaterOrEqual(t, float64(within), 0.9*float64(checked))
}

// countingStore counts host operations.
type countingStore struct {
	state.Store
	gets, sets int
}

func (c *countingStore) Get(k string) ([]byte, uint32, error) { c.gets++; return c.Store.Get(k) }
func (c *countingStore) Set(k string, v []byte, cas uint32) error {
	c.sets++
	return c.Store.Set(k, v, cas)
}

func TestPrefixIndexCostsNoHostCallPerRequest(t *testing.T) {
	for _, blocks := range []int{64, 1024, 16384} {
		t.Run(fmt.Sprint(blocks), func(t *testing.T) {
			cs := &countingStore{Store: state.NewMemoryStore()}
			x := NewPrefixIndex(cs, "ns", "decode", 1<<20, 8)
			p := make([]byte, blocks*8)
			rand.New(rand.NewSource(int64(blocks))).Read(p)
			cps, _ := HashCheckpoints("m", p, 8, nil)
			octaves := bitsLen(blocks) - 5 // from 16 blocks on
			assert.LessOrEqual(t, len(cps), 16+8*octaves+24*max(0, bitsLen(blocks)-1-fineOctave)+1, "O(log n) checkpoints")
			x.Record(cps, 5, 0, 0)
			got := x.Match(cps, func(uint32) bool { return true })
			require.Len(t, got, 1)
			assert.Equal(t, blocks, got[0].Blocks)
			assert.Zero(t, cs.gets+cs.sets, "lookup and record touch no shared data")
			// The tick publishes the records in one chunk: the registry is read and
			// written (the slot claimed), then the chunk and the head are written.
			require.NoError(t, x.Sync(1e6, nil))
			assert.Equal(t, 1, cs.gets)
			assert.Equal(t, 3, cs.sets)
			// A later tick with nothing new reads the registry and writes nothing.
			cs.gets, cs.sets = 0, 0
			require.NoError(t, x.Sync(1e6+100, nil))
			assert.Equal(t, 1, cs.gets)
			assert.Zero(t, cs.sets)
		})
	}
}

func bitsLen(n int) int {
	l := 0
	for ; n > 0; n >>= 1 {
		l++
	}
	return l
}

func TestPrefixIndexIsBounded(t *testing.T) {
	ms := state.NewMemoryStore()
	x := NewPrefixIndex(ms, "ns", "decode", 4096, 8)
	rng := rand.New(rand.NewSource(7))
	for i := 0; i < 3000; i++ {
		p := make([]byte, 8*(1+rng.Intn(200)))
		rng.Read(p)
		cps, _ := HashCheckpoints("m", p, 8, nil)
		x.Record(cps, uint64(1+i%4), 0, 0)
		if i%50 == 0 {
			require.NoError(t, x.Sync(int64(1e6+i), nil))
		}
	}
	used := 0
	for _, e := range x.table.entries {
		if e.stamp != 0 {
			used++
		}
	}
	assert.LessOrEqual(t, used, 4096)
	assert.Equal(t, 4096, len(x.table.entries))
	keys, bytes := ms.Footprint()
	// One slot's ring and head, plus the registry.
	assert.LessOrEqual(t, keys, journalRing+2)
	assert.LessOrEqual(t, bytes, (journalRing+1)*(64+journalHeaderBytes+journalMaxEntries*journalEntryBytes)+2048)
}

func TestPrefixIndexKeepsMostRecentTargets(t *testing.T) {
	x := NewPrefixIndex(state.NewMemoryStore(), "ns", "decode", 1024, 8)
	p := make([]byte, 8*40)
	cps, _ := HashCheckpoints("m", p, 8, nil)
	n := uint64(TargetsPerEntry + 2)
	for tg := uint64(1); tg <= n; tg++ {
		x.Record(cps, tg, 0, 0)
	}
	got := x.Match(cps, func(uint32) bool { return true })
	var ts, want []uint32
	for _, m := range got {
		ts = append(ts, m.Target)
		assert.Equal(t, 40, m.Blocks)
	}
	for tg := uint32(3); tg <= uint32(n); tg++ {
		want = append(want, tg)
	}
	assert.ElementsMatch(t, want, ts, "all but the two first recorded")
}

func TestPrefixIndexIsSharedBetweenVMsOnTheTick(t *testing.T) {
	store := state.NewMemoryStore()
	a := NewPrefixIndex(store, "ns", "decode", 4096, 8)
	b := NewPrefixIndex(store, "ns", "decode", 4096, 8)
	all := func(uint32) bool { return true }
	p := make([]byte, 8*100)
	rand.New(rand.NewSource(1)).Read(p)
	cps, _ := HashCheckpoints("m", p, 8, nil)
	require.NoError(t, b.Sync(1000, nil)) // b registers first
	a.Record(cps, 7, 0, 0)
	assert.Empty(t, b.Match(cps, all), "not before a's tick")
	require.NoError(t, a.Sync(1100, nil))
	assert.Empty(t, b.Match(cps, all), "nor before b's")
	require.NoError(t, b.Sync(1200, nil))
	got := b.Match(cps, all)
	require.Len(t, got, 1)
	assert.Equal(t, PrefixMatch{Target: 7, Blocks: 100}, got[0])
	// b's records flow back to a.
	b.Record(cps, 9, 0, 0)
	require.NoError(t, b.Sync(1300, nil))
	require.NoError(t, a.Sync(1400, nil))
	got = a.Match(cps, all)
	require.Len(t, got, 2)
	assert.Equal(t, uint32(9), got[0].Target, "the most recent holder first")

	// A VM that starts later (a reconfiguration) replays what the rings still hold.
	c := NewPrefixIndex(store, "ns", "decode", 4096, 8)
	require.NoError(t, c.Sync(1500, nil))
	assert.Len(t, c.Match(cps, all), 2)
}

func TestPrefixJournalSurvivesFallingBehindAndGarbage(t *testing.T) {
	store := state.NewMemoryStore()
	a := NewPrefixIndex(store, "ns", "decode", 1<<16, 8)
	b := NewPrefixIndex(store, "ns", "decode", 1<<16, 8)
	all := func(uint32) bool { return true }
	require.NoError(t, b.Sync(1000, nil))
	rng := rand.New(rand.NewSource(2))
	var last []Checkpoint
	for i := 0; i < 3*journalRing; i++ { // a publishes far more than a ring while b sleeps
		p := make([]byte, 8*20)
		rng.Read(p)
		last, _ = HashCheckpoints("m", p, 8, nil)
		a.Record(last, 3, 0, 0)
		require.NoError(t, a.Sync(int64(1001+i), nil))
	}
	require.NoError(t, b.Sync(1100, nil))
	assert.Len(t, b.Match(last, all), 1, "the newest chunks arrive")
	// Garbage in the keys is skipped, not fatal.
	require.NoError(t, store.Set("ns/pj/decode/slots", []byte{42, 1, 2}, 0))
	require.NoError(t, store.Set("ns/pj/decode/0/head", []byte{42}, 0))
	require.NoError(t, a.Sync(2000, nil))
	require.NoError(t, b.Sync(2001, nil))
}

func TestPrefixJournalWithEverySlotTakenSharesNothing(t *testing.T) {
	store := state.NewMemoryStore()
	var idx []*PrefixIndex
	for i := 0; i < journalSlots; i++ {
		x := NewPrefixIndex(store, "ns", "decode", 1024, 8)
		require.NoError(t, x.Sync(1000, nil))
		idx = append(idx, x)
	}
	late := NewPrefixIndex(store, "ns", "decode", 1024, 8)
	p := make([]byte, 8*20)
	cps, _ := HashCheckpoints("m", p, 8, nil)
	late.Record(cps, 4, 0, 0)
	require.NoError(t, late.Sync(1001, nil))
	assert.Equal(t, -1, late.journal.slot)
	assert.Empty(t, late.journal.outbox, "the outbox does not grow without a slot")
	assert.Len(t, late.Match(cps, func(uint32) bool { return true }), 1, "its own table still works")
	// After the others go quiet for the slot TTL, it gets a slot.
	require.NoError(t, late.Sync(1001+journalSlotTTLms+journalRegisterMS+1, nil))
	assert.GreaterOrEqual(t, late.journal.slot, 0)
}

func TestNextCheckpointWalksTheGrid(t *testing.T) {
	k, n := 0, 0
	for k < 1<<16 {
		next := nextCheckpoint(k)
		for j := k + 1; j < next; j++ {
			require.False(t, isCheckpoint(j), "skipped grid point %d", j)
		}
		require.True(t, isCheckpoint(next), "%d is not a grid point", next)
		k = next
		n++
	}
	assert.Equal(t, 16+8*8+32*4, n)
}

// A conversation's turn is matched on the target that served its previous turn at
// that turn's every full block, wherever it ended between two checkpoints, when the
// deepest checkpoint matched has two holders or more (with one, the grid's match
// stands: only that holder could be found deeper), and never above the exact match;
// the grid alone matches it up to an eighth short.
// Its demand is still counted on the deepest checkpoint matched: while a turn's
// history ends within a checkpoint step of a shared prompt, its requests count toward
// that prompt's demand.
func TestAPromptMatchFindsThePreviousTurnBetweenCheckpoints(t *testing.T) {
	const blockBytes = 32
	rng := rand.New(rand.NewSource(7))
	known := func(t uint32) bool { return t >= 1 && t <= 4 }
	x := NewPrefixIndex(state.NewMemoryStore(), "ns", "decode", 1<<20, 8)
	exact := &exactIndex{}
	// Just past a checkpoint (576 blocks; the next is 640): the first turns of every
	// conversation end before the next one.
	system := randomText(rng, 576*blockBytes+8)
	type conv struct {
		text   []byte
		target uint32
	}
	var convs []conv
	short, exactly := 0, 0
	var p Prompt
	for i := 0; i < 400; i++ {
		var c *conv
		if len(convs) < 4 || rng.Intn(3) == 0 {
			convs = append(convs, conv{text: append(append([]byte(nil), system...), randomText(rng, 10+rng.Intn(300))...)})
			c = &convs[len(convs)-1]
		} else {
			c = &convs[rng.Intn(len(convs))]
			prev := len(c.text) / blockBytes
			c.text = append(c.text, randomText(rng, 10+rng.Intn(300))...)
			p.Hash("m", c.text, blockBytes)
			g := x.StartMatch(p.Checkpoints, known)
			g.Next()
			gridDeepest, shared := g.DeepestHash(), len(g.Found()) >= 2
			gridFound := map[uint32]int{}
			for g.Next() {
			}
			for _, f := range g.Found() {
				gridFound[f.Target] = f.Blocks
			}
			found := map[uint32]int{}
			m := x.StartPromptMatch(&p, known, nil)
			m.Next()
			require.Equal(t, gridDeepest, m.DeepestHash(), "turn %d: demand counts on the deepest checkpoint", i)
			for m.Next() {
			}
			for _, f := range m.Found() {
				found[f.Target] = f.Blocks
			}
			want := exact.match(chainOf(c.text, blockBytes))
			for tg, b := range found {
				require.LessOrEqual(t, b, want[tg], "turn %d target %d: never above the exact match", i, tg)
			}
			if !shared {
				require.Equal(t, gridFound, found, "turn %d: one holder, the grid's match", i)
				continue
			}
			require.GreaterOrEqual(t, found[c.target], prev, "turn %d: the previous turn's every block", i)
			exactly++
			if gridFound[c.target] < prev {
				short++
			}
		}
		p.Hash("m", c.text, blockBytes)
		c.target = uint32(1 + rng.Intn(4))
		x.Record(p.Checkpoints, uint64(c.target), 0, 0)
		exact.record(chainOf(c.text, blockBytes), c.target)
	}
	assert.Greater(t, exactly, 100)
	assert.Greater(t, short, exactly/2, "the grid alone falls short of most previous turns")
}

// The blocks between checkpoints are looked up only when the deepest checkpoint
// matched has two holders or more: a previous turn on the one holder is then matched
// up to that checkpoint, as on the grid alone; once another target holds the shared
// prompt too, it is matched whole.
func TestAPreviousTurnIsLookedForOnlyBesideAnotherHolder(t *testing.T) {
	const blockBytes = 32
	rng := rand.New(rand.NewSource(8))
	known := func(t uint32) bool { return t == 1 || t == 2 }
	x := NewPrefixIndex(state.NewMemoryStore(), "ns", "decode", 1<<16, 8)
	system := randomText(rng, 576*blockBytes+8) // checkpoints 576, then 640
	first := append(append([]byte(nil), system...), randomText(rng, 20*blockBytes)...)
	next := append(append([]byte(nil), first...), randomText(rng, 10*blockBytes)...)
	var p Prompt
	p.Hash("m", first, blockBytes)
	x.Record(p.Checkpoints, 1, 0, 0)
	p.Hash("m", next, blockBytes)
	depth := func() int {
		m := x.StartPromptMatch(&p, known, nil)
		m.Next()
		for _, f := range m.Found() {
			if f.Target == 1 {
				return f.Blocks
			}
		}
		return 0
	}
	assert.Equal(t, 576, depth(), "one holder: the checkpoint")
	var other Prompt
	other.Hash("m", append(append([]byte(nil), system...), randomText(rng, 5*blockBytes)...), blockBytes)
	x.Record(other.Checkpoints, 2, 0, 0)
	assert.Equal(t, len(first)/blockBytes, depth(), "two holders: the previous turn whole")
}

// An engine evicts a request's last blocks first, so a long prompt's head outlives its
// tail: a prompt of 400 blocks recorded at clock 0 on a target with a cache of 500
// blocks is matched whole while no more than 100 blocks were written since, up to the
// checkpoint within 500 − written blocks after that, and not at all past 500.
func TestALongPromptsHeadOutlivesItsTail(t *testing.T) {
	const blockBytes = 32
	rng := rand.New(rand.NewSource(10))
	known := func(t uint32) bool { return t == 1 }
	x := NewPrefixIndex(state.NewMemoryStore(), "ns", "decode", 1<<16, 8)
	text := randomText(rng, 400*blockBytes+5)
	var p Prompt
	p.Hash("m", text, blockBytes)
	x.Record(p.Checkpoints, 1, 0, 0)
	for _, c := range []struct{ written, want int }{{0, 400}, {100, 400}, {101, 384}, {200, 288}, {480, 20}, {499, 1}, {501, 0}} {
		clockOf := func(uint32) (uint32, uint32) { return uint32(c.written), 500 }
		m := x.StartPromptMatch(&p, known, clockOf)
		for m.Next() {
		}
		got := 0
		for _, f := range m.Found() {
			got = f.Blocks
		}
		assert.Equal(t, c.want, got, "written %d", c.written)
	}
}

func TestAYoungerHeadIsWhatALaterRequestRecorded(t *testing.T) {
	// Target 1 records a system prompt and a history after it at clock 10, then the
	// same system prompt with another history at 20; target 2 only the first, at 10.
	// On target 1 the system prompt's checkpoints are younger than the history's copy;
	// on target 2 nothing is, nor on target 1 than a copy of clock 20.
	const blockBytes = 32
	rng := rand.New(rand.NewSource(12))
	known := func(t uint32) bool { return t == 1 || t == 2 }
	x := NewPrefixIndex(state.NewMemoryStore(), "ns", "decode", 1<<16, 8)
	system := randomText(rng, 100*blockBytes)
	var a, b Prompt
	a.Hash("m", append(append([]byte{}, system...), randomText(rng, 60*blockBytes)...), blockBytes)
	b.Hash("m", append(append([]byte{}, system...), randomText(rng, 10*blockBytes)...), blockBytes)
	x.Record(a.Checkpoints, 1, 10, 0)
	x.Record(a.Checkpoints, 2, 10, 0)
	x.Record(b.Checkpoints, 1, 20, 0)
	m := x.StartPromptMatch(&a, known, nil)
	for m.Next() {
	}
	deepest := a.Checkpoints[len(a.Checkpoints)-1].Pos
	assert.Equal(t, 96, m.YoungerHead(1, deepest, 10), "the system prompt's deepest checkpoint: 96 of its 100 blocks")
	assert.Equal(t, 0, m.YoungerHead(2, deepest, 10))
	assert.Equal(t, 0, m.YoungerHead(1, deepest, 20))
	assert.Equal(t, 88, m.YoungerHead(1, 90, 10), "only checkpoints shallower than pos")
}
