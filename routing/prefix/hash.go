package prefix

import (
	"encoding/binary"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// Checkpoint is the chain hash of a prompt's first Pos blocks: it covers every byte of
// those blocks and the model name, so two prompts share a checkpoint hash exactly when
// they share those blocks (up to 64-bit collisions).
type Checkpoint struct {
	Pos  int // blocks covered, 1-based
	Hash uint64
	// acc is the chain's accumulators after Pos blocks, from which a lookup hashes the
	// blocks after it (Prompt); zero unless a block is a whole number of stripes.
	acc [4]uint64
}

// isCheckpoint reports whether block count k is on the checkpoint grid: every k up to
// 16, then 8 evenly spaced points per octave ([2^l, 2^(l+1)) in steps of 2^(l-3)),
// and 32 (steps of 2^(l-5)) from fineOctave on. The largest grid point at or below
// any L is therefore above 7/8 of L (31/32 past 2^fineOctave blocks), and a prompt of
// n blocks has at most 16 + 8·log2(n/16) grid points, and 24 more per octave past
// 2^fineOctave.
func isCheckpoint(k int) bool {
	if k <= 16 {
		return k >= 1
	}
	l := bits.Len(uint(k)) - 1
	if l >= fineOctave {
		return k&(1<<(l-5)-1) == 0
	}
	return k&(1<<(l-3)-1) == 0
}

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
	// Seeded with the model's hash rather than fed its name, the chain stays aligned
	// to xxhash's 32-byte stripes. At the defaults a block is 64 bytes, so the stripes
	// are hashed inline here and a checkpoint's sum has no tail to fold in, sparing the
	// Write and Sum64 calls of xxhash.Digest that would otherwise dominate in wasm with
	// a checkpoint every few blocks. Other block sizes go through the Digest; both give
	// xxhash64 of the blocks with the model's hash as seed.
	seed := xxhash.Sum64String(model)
	if blockBytes%xxStripe == 0 {
		return hashStripes(seed, prompt, blockBytes, n, dst), n
	}
	var d xxhash.Digest
	d.ResetWithSeed(seed)
	written := 0
	for k := nextCheckpoint(0); ; k = nextCheckpoint(k) {
		if k > n {
			k = n
		}
		// The bytes between two checkpoints go in one write: one call instead of one a
		// block, and the same chain.
		_, _ = d.Write(prompt[written*blockBytes : k*blockBytes])
		written = k
		dst = append(dst, Checkpoint{Pos: k, Hash: d.Sum64()})
		if k == n {
			return dst, n
		}
	}
}

// Prompt is a prompt hashed as the index's chain: its checkpoints, each with the
// chain's state there, and the text, from which a lookup hashes the blocks between
// two checkpoints without hashing the prompt again (PrefixIndex.StartPromptMatch).
type Prompt struct {
	Checkpoints []Checkpoint // as HashCheckpoints gives them
	Blocks      int          // full blocks
	text        []byte
	blockBytes  int // 0 when a block is not a whole number of stripes: no state kept
}

// Hash hashes text into p, reusing its checkpoints' buffer.
func (p *Prompt) Hash(model string, text []byte, blockBytes int) {
	p.Checkpoints, p.Blocks = HashCheckpoints(model, text, blockBytes, p.Checkpoints)
	p.text, p.blockBytes = text, 0
	if blockBytes > 0 && blockBytes%xxStripe == 0 {
		p.blockBytes = blockBytes
	}
}

// xxhash64's constants (github.com/cespare/xxhash, after Yann Collet's spec).
const (
	xxStripe        = 32
	xxPrime1 uint64 = 11400714785074694791
	xxPrime2 uint64 = 14029467366897019727
	xxPrime3 uint64 = 1609587929392839161
	xxPrime4 uint64 = 9650029242287828579
)

// hashStripes is HashCheckpoints for blocks of a whole number of stripes: the same
// values as xxhash.Digest seeded with seed, summed at each checkpoint, where it also
// keeps the accumulators.
//
// In wasm a jump between basic blocks goes through the function's dispatcher and
// moves every live local, so the loops are shaped for few jumps and few live values:
// the checkpoints' positions are copied in first, then one pass hashes up to each.
func hashStripes(seed uint64, prompt []byte, blockBytes, n int, dst []Checkpoint) []Checkpoint {
	// The grid points below n, then n.
	dst = append(dst[:0], gridCheckpoints[:gridPointsBelow(n)]...)
	dst = append(dst, Checkpoint{Pos: n})
	v1, v2, v3, v4 := seed+xxPrime1+xxPrime2, seed+xxPrime2, seed, seed-xxPrime1
	p := 0
	for i := range dst {
		b := prompt[:dst[i].Pos*blockBytes]
		// Two stripes a pass, stopping after either: a checkpoint is a whole number of
		// stripes past the last one, at least one.
		for {
			w := b[p : p+xxStripe : p+xxStripe]
			v1 = xxRound(v1, binary.LittleEndian.Uint64(w[0:8]))
			v2 = xxRound(v2, binary.LittleEndian.Uint64(w[8:16]))
			v3 = xxRound(v3, binary.LittleEndian.Uint64(w[16:24]))
			v4 = xxRound(v4, binary.LittleEndian.Uint64(w[24:32]))
			p += xxStripe
			if p == len(b) {
				break
			}
			w = b[p : p+xxStripe : p+xxStripe]
			v1 = xxRound(v1, binary.LittleEndian.Uint64(w[0:8]))
			v2 = xxRound(v2, binary.LittleEndian.Uint64(w[8:16]))
			v3 = xxRound(v3, binary.LittleEndian.Uint64(w[16:24]))
			v4 = xxRound(v4, binary.LittleEndian.Uint64(w[24:32]))
			p += xxStripe
			if p == len(b) {
				break
			}
		}
		// Stored beside the hash, these cost the loop no value kept live.
		dst[i].acc = [4]uint64{v1, v2, v3, v4}
		// The digest written out: a call a checkpoint costs more in wasm than the sum.
		h := bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		h = xxMerge(xxMerge(xxMerge(xxMerge(h, v1), v2), v3), v4)
		dst[i].Hash = xxAvalanche(h + uint64(p))
	}
	return dst
}

// hashBetween appends to dst the chain's hash through each block after p's checkpoint
// i and before checkpoint i+1, going on from the state kept at checkpoint i; it
// returns dst unchanged when p kept no state.
func hashBetween(p *Prompt, i int, dst []uint64) []uint64 {
	if p.blockBytes == 0 || i+1 >= len(p.Checkpoints) {
		return dst
	}
	cp := &p.Checkpoints[i]
	v1, v2, v3, v4 := cp.acc[0], cp.acc[1], cp.acc[2], cp.acc[3]
	// As hashStripes: every block a whole number of stripes, the digest written out.
	b := p.text[cp.Pos*p.blockBytes : (p.Checkpoints[i+1].Pos-1)*p.blockBytes]
	at, next := 0, p.blockBytes
	for at < len(b) {
		w := b[at : at+xxStripe : at+xxStripe]
		v1 = xxRound(v1, binary.LittleEndian.Uint64(w[0:8]))
		v2 = xxRound(v2, binary.LittleEndian.Uint64(w[8:16]))
		v3 = xxRound(v3, binary.LittleEndian.Uint64(w[16:24]))
		v4 = xxRound(v4, binary.LittleEndian.Uint64(w[24:32]))
		at += xxStripe
		if at != next {
			continue
		}
		next += p.blockBytes
		h := bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		h = xxMerge(xxMerge(xxMerge(xxMerge(h, v1), v2), v3), v4)
		dst = append(dst, xxAvalanche(h+uint64(cp.Pos*p.blockBytes+at)))
	}
	return dst
}

// checkpointGrid is every grid point in order, up to 2^40 blocks (16 up to 16, then 8
// an octave, and 32 an octave from fineOctave on).
var checkpointGrid = func() (g [16 + 8*(fineOctave-4) + 32*(40-fineOctave)]int) {
	k := 0
	for i := range g {
		k = nextCheckpoint(k)
		g[i] = k
	}
	return g
}()

// gridCheckpoints is checkpointGrid as checkpoints, copied in one move into a
// prompt's list rather than appended one at a time (a jump back each in wasm).
var gridCheckpoints = func() (g [len(checkpointGrid)]Checkpoint) {
	for i, k := range checkpointGrid {
		g[i].Pos = k
	}
	return g
}()

// gridPointsBelow is how many grid points are below n (at most len(checkpointGrid)):
// every k up to 16, then 8 an octave, and 32 from fineOctave on.
func gridPointsBelow(n int) int {
	m := n - 1 // the largest block count counted
	if m <= 16 {
		return max(m, 0)
	}
	// m's octave is [2^l, 2^(l+1)); its points are 2^l + j·2^(l-3), j < 8 (from
	// fineOctave on 2^l + j·2^(l-5), j < 32), after the 15 below 16 and those of each
	// octave from 16 on.
	l := bits.Len(uint(m)) - 1
	if l < fineOctave {
		return 15 + 8*(l-4) + (m-1<<l)>>(l-3) + 1
	}
	inOctave := (m-1<<l)>>(l-5) + 1
	return min(15+8*(fineOctave-4)+32*(l-fineOctave)+inOctave, len(checkpointGrid))
}

// fineOctave is the first octave of block counts with 32 grid points rather than 8,
// 4 096 blocks (65 536 tokens at the default block): past it, the 12 % of a prompt
// between two coarse points is thousands of tokens, which every request sharing the
// prompt would count as computed, and the prefill rate its first chunk teaches would
// be that many times too fast. Below it the coarse grid serves multi-turn traces
// better (BENCHMARKS.md).
const fineOctave = 12

func xxRound(acc, input uint64) uint64 {
	acc += input * xxPrime2
	acc = bits.RotateLeft64(acc, 31)
	return acc * xxPrime1
}

// xxAvalanche is the last step of xxhash64's digest.
func xxAvalanche(h uint64) uint64 {
	h ^= h >> 33
	h *= xxPrime2
	h ^= h >> 29
	h *= xxPrime3
	return h ^ h>>32
}

func xxMerge(acc, val uint64) uint64 {
	acc ^= xxRound(0, val)
	return acc*xxPrime1 + xxPrime4
}

// nextCheckpoint returns the smallest grid point above k.
func nextCheckpoint(k int) int {
	if k < 16 {
		return k + 1
	}
	l := bits.Len(uint(k+1)) - 1 // the octave of k+1
	step := 1 << (l - 3)
	if l >= fineOctave {
		step = 1 << (l - 5)
	}
	return (k/step + 1) * step
}
