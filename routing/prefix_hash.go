package routing

import (
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// Checkpoint is the chain hash of a prompt's first Pos blocks: it covers every byte of
// those blocks and the model name, so two prompts share a checkpoint hash exactly when
// they share those blocks (up to 64-bit collisions).
type Checkpoint struct {
	Pos  int // blocks covered, 1-based
	Hash uint64
}

// isCheckpoint reports whether block count k is on the checkpoint grid: every k up to
// 16, then 8 evenly spaced points per octave ([2^l, 2^(l+1)) in steps of 2^(l-3)).
// The largest grid point at or below any L is therefore above 7/8 of L, and a prompt
// of n blocks has at most 16 + 8·log2(n/16) grid points.
func isCheckpoint(k int) bool {
	if k <= 16 {
		return k >= 1
	}
	l := bits.Len(uint(k)) - 1
	return k&(1<<(l-3)-1) == 0
}

// level is the octave of block count k: floor(log2 k).
func level(k int) int { return bits.Len(uint(k)) - 1 }

// HashCheckpoints hashes prompt in blocks of blockBytes as one chain seeded with the
// model name, in one pass and without allocating beyond dst, and returns the
// checkpoints (grid points, plus the last full block) and the number of full blocks.
// A partial last block is not hashed: it cannot be reused as a cached block anyway.
func HashCheckpoints(model string, prompt []byte, blockBytes int, dst []Checkpoint) ([]Checkpoint, int) {
	dst = dst[:0]
	if blockBytes < 1 {
		return dst, 0
	}
	n := len(prompt) / blockBytes
	if n == 0 {
		return dst, 0
	}
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(model)
	_, _ = d.Write([]byte{0})
	// The digest takes the bytes between two checkpoints in one write: far faster
	// than a write a block (16× in wasm), and the same chain.
	written := 0
	for k := nextCheckpoint(0); ; k = nextCheckpoint(k) {
		if k > n {
			k = n
		}
		_, _ = d.Write(prompt[written*blockBytes : k*blockBytes])
		written = k
		dst = append(dst, Checkpoint{Pos: k, Hash: d.Sum64()})
		if k == n {
			return dst, n
		}
	}
}

// nextCheckpoint returns the smallest grid point above k.
func nextCheckpoint(k int) int {
	if k < 16 {
		return k + 1
	}
	l := bits.Len(uint(k+1)) - 1 // the octave of k+1
	step := 1 << (l - 3)
	return (k/step + 1) * step
}
