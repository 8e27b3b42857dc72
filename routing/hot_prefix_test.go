package routing

import (
	"math/rand"
	"testing"

	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAPrefixIsCopiedWhenItsDemandOutrunsItsHolder(t *testing.T) {
	// Target X computes a 2000-token document in 200 ms (10 tokens a ms). Then eight
	// requests on the document, each with 400 tokens of its own, arrive: 5 ms apart
	// they bring eight times what X computes, and the burst is copied to the other
	// targets from its first few requests on, while X's queue is still well under
	// what its copy is worth at ownWeight. A second apart, each answered before the
	// next, they all stay on X.
	rng := rand.New(rand.NewSource(31))
	doc := words(rng, 8000)
	for _, c := range []struct {
		name     string
		gapMS    int64
		answered bool
		targets  int
	}{{"a burst", 5, false, 3}, {"a second apart", 1000, true, 1}} {
		t.Run(c.name, func(t *testing.T) {
			clock := &fakeClock{ms: 1e6}
			r := NewRouter(testConfig(t, `,"balance":{"fair_share_multiplier":100}`), state.NewMemoryStore(), clock.now)
			first := r.Decide(textRequest(doc, 1), NoRank)
			clock.ms += 200
			require.NoError(t, r.FirstChunk(&first.Ticket))
			require.NoError(t, r.Release(first.Ticket))
			used := map[uint64]int{}
			firstCopy := 0
			for i := 0; i < 8; i++ {
				clock.ms += c.gapMS
				d := r.Decide(textRequest(doc+words(rng, 1600), uint64(10+i)), NoRank)
				used[d.Target.ID]++
				if d.Target.ID != first.Target.ID && firstCopy == 0 {
					firstCopy = i + 1
					assert.Equal(t, KindLoad, d.Kind, "the copy goes where the document is not")
				}
				if c.answered {
					clock.ms += 60
					require.NoError(t, r.FirstChunk(&d.Ticket))
					require.NoError(t, r.Release(d.Ticket))
				}
			}
			assert.Len(t, used, c.targets, "targets used: %v", used)
			if c.targets > 1 {
				assert.LessOrEqual(t, firstCopy, 4, "copied within the burst's first requests")
				assert.Greater(t, used[first.Target.ID], 1, "the holder keeps taking its share")
			}
		})
	}
}
