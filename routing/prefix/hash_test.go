package prefix

import (
	"math/rand"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The inline stripe path gives exactly xxhash.Digest's values, for every block size
// that is a whole number of stripes, any model and any prompt length.
func TestHashStripesMatchesXXHashDigest(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	for _, blockBytes := range []int{32, 64, 96, 128, 512} {
		for _, model := range []string{"", "m", "meta-llama/Llama-3.1-8B-Instruct"} {
			prompt := make([]byte, 1+rng.Intn(300*blockBytes))
			rng.Read(prompt)
			got, n := HashCheckpoints(model, prompt, blockBytes, nil)
			require.Equal(t, len(prompt)/blockBytes, n)
			for _, cp := range got {
				d := xxhash.NewWithSeed(xxhash.Sum64String(model))
				_, _ = d.Write(prompt[:cp.Pos*blockBytes])
				require.Equal(t, d.Sum64(), cp.Hash, "block %d B, model %q, checkpoint %d", blockBytes, model, cp.Pos)
			}
		}
	}
}

// Every prompt length, so that each checkpoint ends after an odd and an even number of
// stripes, and the last full block is on the grid or not.
func TestHashStripesMatchesXXHashDigestAtEveryLength(t *testing.T) {
	rng := rand.New(rand.NewSource(4))
	for _, blockBytes := range []int{32, 64, 96} {
		prompt := make([]byte, 40*blockBytes)
		rng.Read(prompt)
		for l := 0; l <= len(prompt); l++ {
			got, n := HashCheckpoints("m", prompt[:l], blockBytes, nil)
			require.Equal(t, l/blockBytes, n)
			d := xxhash.NewWithSeed(xxhash.Sum64String("m"))
			var want []Checkpoint
			for k := 1; k <= n; k++ {
				_, _ = d.Write(prompt[(k-1)*blockBytes : k*blockBytes])
				if isCheckpoint(k) || k == n {
					want = append(want, Checkpoint{Pos: k, Hash: d.Sum64()})
				}
			}
			for i := range got {
				got[i].acc = [4]uint64{} // the state behind the hash, checked by resuming
			}
			require.Equal(t, want, got, "block %d B, %d bytes", blockBytes, l)
		}
	}
}

// gridPointsBelow counts the grid as walking it does, on both sides of every grid
// point and far into the grid.
func TestGridPointsBelowCountsTheGrid(t *testing.T) {
	below := func(n int) int {
		c := 0
		for _, k := range checkpointGrid {
			if k < n {
				c++
			}
		}
		return c
	}
	for n := -1; n <= 1<<12; n++ {
		require.Equal(t, below(n), gridPointsBelow(n), n)
	}
	for _, k := range checkpointGrid {
		for _, n := range []int{k - 1, k, k + 1} {
			require.Equal(t, below(n), gridPointsBelow(n), n)
		}
	}
	require.Equal(t, len(checkpointGrid), gridPointsBelow(1<<50))
}

func TestCheckpointGridIsEveryGridPoint(t *testing.T) {
	var want []int
	for k := 1; k <= 1<<(fineOctave+2); k++ {
		if isCheckpoint(k) {
			want = append(want, k)
		}
	}
	require.Equal(t, want, checkpointGrid[:len(want)])
	for i, k := range checkpointGrid {
		require.True(t, isCheckpoint(k), k)
		require.True(t, i == 0 || k > checkpointGrid[i-1], k)
	}
	require.Equal(t, 1<<40, checkpointGrid[len(checkpointGrid)-1])
}

// Resumed after any checkpoint, the chain gives the hash of every block up to the
// next one exactly as hashing the prompt up to that block does.
func TestAPromptResumesItsChainBetweenCheckpoints(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	for _, blockBytes := range []int{32, 64, 128} {
		text := make([]byte, 300*blockBytes+7)
		rng.Read(text)
		var p Prompt
		p.Hash("m", text, blockBytes)
		want, n := HashCheckpoints("m", text, blockBytes, nil)
		require.Equal(t, want, p.Checkpoints)
		require.Equal(t, n, p.Blocks)
		for i := 0; i+1 < len(p.Checkpoints); i++ {
			got := hashBetween(&p, i, nil)
			require.Len(t, got, p.Checkpoints[i+1].Pos-p.Checkpoints[i].Pos-1)
			for k, h := range got {
				b := p.Checkpoints[i].Pos + 1 + k
				d := xxhash.NewWithSeed(xxhash.Sum64String("m"))
				_, _ = d.Write(text[:b*blockBytes])
				require.Equal(t, d.Sum64(), h, "block %d B, block %d", blockBytes, b)
			}
		}
	}
	// Blocks that are not whole stripes keep no state: nothing to resume.
	var p Prompt
	p.Hash("m", make([]byte, 400), 8)
	require.Greater(t, len(p.Checkpoints), 1)
	assert.Empty(t, hashBetween(&p, 0, nil))
}
