package prefix

import (
	"bytes"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/routing/state"
)

// FuzzPrefixIndex splits the input into up to eight prompts (at 0xFF bytes), hashes
// each in blocks of 1–16 bytes (or of 32–128 when bs is 128 or more, where a lookup
// also hashes the blocks between checkpoints), records them on four targets and checks
// the index against the exact longest common prefixes: never above, never below 7/8,
// and a prompt just recorded matches in full. It also checks the checkpoint list
// itself.
func FuzzPrefixIndex(f *testing.F) {
	f.Add([]byte("hello world\xffhello there\xffhello world, again"), uint8(3))
	f.Add(bytes.Repeat([]byte("abcdefgh"), 100), uint8(8))
	f.Add([]byte("\xff\xff\xffx"), uint8(1))
	f.Add(append(bytes.Repeat([]byte("a"), 500), append([]byte{0xff}, bytes.Repeat([]byte("a"), 700)...)...), uint8(16))
	// A prompt that ends between two checkpoints (34 blocks of 32 bytes), then one
	// that continues it.
	f.Add(append(bytes.Repeat([]byte("a"), 1100), append([]byte{0xff}, bytes.Repeat([]byte("a"), 1500)...)...), uint8(128))
	f.Fuzz(func(t *testing.T, data []byte, bs uint8) {
		blockBytes := int(bs%16) + 1
		if bs >= 128 {
			blockBytes = 32 * (int(bs%4) + 1)
		}
		prompts := bytes.SplitN(data, []byte{0xff}, 8)
		x := NewPrefixIndex(state.NewMemoryStore(), "ns", "decode", 1<<14, 8)
		all := func(uint32) bool { return true }
		var recorded [][]byte
		var targets []uint32
		var hashed Prompt
		for i, p := range prompts {
			cps, n := HashCheckpoints("m", p, blockBytes, nil)
			hashed.Hash("m", p, blockBytes)
			if !slices.Equal(cps, hashed.Checkpoints) || hashed.Blocks != n {
				t.Fatalf("a Prompt's checkpoints %v, HashCheckpoints' %v", hashed.Checkpoints, cps)
			}
			if n != len(p)/blockBytes {
				t.Fatalf("blocks %d, want %d", n, len(p)/blockBytes)
			}
			for j, cp := range cps {
				if cp.Pos < 1 || cp.Pos > n || (j > 0 && cp.Pos <= cps[j-1].Pos) || (!isCheckpoint(cp.Pos) && cp.Pos != n) {
					t.Fatalf("bad checkpoint list %v for %d blocks", cps, n)
				}
			}
			if n > 0 && cps[len(cps)-1].Pos != n {
				t.Fatalf("the last block %d is not a checkpoint: %v", n, cps)
			}
			// Against the exact longest common prefix with every recorded prompt.
			want := map[uint32]int{}
			for k, q := range recorded {
				l := 0
				for l < len(p) && l < len(q) && p[l] == q[l] {
					l++
				}
				want[targets[k]] = max(want[targets[k]], l/blockBytes)
			}
			search := x.StartPromptMatch(&hashed, all, nil)
			for search.Next() {
			}
			for _, m := range search.Found() {
				w := want[m.Target]
				if m.Blocks > w {
					t.Fatalf("prompt %d: target %d matched %d blocks, exact %d", i, m.Target, m.Blocks, w)
				}
				if 8*m.Blocks < 7*w {
					t.Fatalf("prompt %d: target %d matched %d blocks, below 7/8 of %d", i, m.Target, m.Blocks, w)
				}
				delete(want, m.Target)
			}
			for tg, w := range want {
				if w > 0 {
					t.Fatalf("prompt %d: target %d holds %d blocks but was not found", i, tg, w)
				}
			}
			tg := uint32(i%4 + 1)
			x.Record(cps, uint64(tg), 0, 0)
			recorded, targets = append(recorded, p), append(targets, tg)
			if n > 0 {
				got := x.Match(cps, func(t uint32) bool { return t == tg })
				if len(got) != 1 || got[0].Blocks != n {
					t.Fatalf("prompt %d just recorded on %d: %v", i, tg, got)
				}
			}
		}
	})
}
