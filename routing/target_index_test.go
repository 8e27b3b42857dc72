package routing

import (
	"math/rand"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestTargetIndexFindsEveryKeyAndNoOther(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	for _, n := range []int{0, 1, 2, 3, 8, 63, 64, 65, 1000} {
		x := newTargetIndex(n)
		keys := map[uint64]int{}
		for len(keys) < n {
			k := rng.Uint64()
			if rng.Intn(4) == 0 {
				k &= 0xff // small keys cluster in the low bits
			}
			if _, dup := keys[k]; !dup {
				keys[k] = len(keys)
				x.put(k, keys[k])
			}
		}
		for k, i := range keys {
			assert.Equal(t, i, x.get(k), "n=%d key %x", n, k)
		}
		for j := 0; j < 1000; j++ {
			k := rng.Uint64()
			if _, ok := keys[k]; !ok {
				assert.Equal(t, -1, x.get(k), "n=%d absent key %x", n, k)
			}
		}
	}
}

func TestTargetIndexKeepsTheFirstPosition(t *testing.T) {
	x := newTargetIndex(2)
	x.put(42, 0)
	x.put(42, 1)
	assert.Equal(t, 0, x.get(42))
}
