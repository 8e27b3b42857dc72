package prefix

import (
	"math/rand"
	"testing"

	"github.com/cespare/xxhash/v2"
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
