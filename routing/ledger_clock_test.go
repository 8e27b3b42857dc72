package routing

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A target that left the pool carries no load, and its write clock goes with it: the
// key does not grow with every rollout.
func TestLedgerForgetsTheWriteClockOfATargetThatLeft(t *testing.T) {
	store := state.NewMemoryStore()
	inPool := map[uint64]bool{11: true, 22: true}
	l := NewLoadLedger(store, "ns", "decode", 600_000, 8)
	l.keepClock = func(id uint64) bool { return inPool[id] }
	now := func() int64 { return 1_000 }
	for _, id := range []uint64{11, 22} {
		tk, _ := l.AcquireQueued(id, 100, 100, 0, now())
		require.NoError(t, l.Release(tk, now))
	}
	require.NoError(t, l.Flush(now()))
	holds := func(id uint64) bool {
		v, _, err := store.Get(l.key)
		require.NoError(t, err)
		return bytes.Contains(v, binary.LittleEndian.AppendUint64(nil, id))
	}
	require.True(t, holds(11), "an idle target keeps its write clock")
	require.True(t, holds(22))

	delete(inPool, 22)
	require.NoError(t, l.Flush(now()))
	require.True(t, holds(11))
	require.False(t, holds(22), "the clock of a target that left is dropped at the next flush")
}

func TestLedgerRecentWorkHalvesEveryHalfLife(t *testing.T) {
	store := state.NewMemoryStore()
	a := NewLoadLedger(store, "ns", "decode", 600_000, 8)
	b := NewLoadLedger(store, "ns", "decode", 600_000, 8)
	recent := func(l *LoadLedger, nowMS int64) (int64, int64) {
		var got [1]Load
		require.NoError(t, l.LoadsInto(nowMS, func(id uint64) int {
			if id == 11 {
				return 0
			}
			return -1
		}, got[:]))
		return got[0].Recent, got[0].RecentSent
	}
	t0 := int64(16 * recentHalfLifeMS)
	now := func() int64 { return t0 }
	x, err := a.AcquireQueued(11, 1000, 800, 0, t0)
	require.NoError(t, err)
	y, err := a.AcquireQueued(11, 500, 0, 0, t0)
	require.NoError(t, err)
	require.NoError(t, a.FirstChunk(&x, t0+10))
	require.NoError(t, a.Release(x, now))
	require.NoError(t, a.Release(y, now))
	tok, sent := recent(a, t0)
	assert.Equal(t, [2]int64{800, 2 * countUnit}, [2]int64{tok, sent}, "the uncached tokens and the requests sent; releases keep them")

	require.NoError(t, a.Flush(t0))
	tok, sent = recent(b, t0+recentHalfLifeMS)
	assert.Equal(t, [2]int64{400, countUnit}, [2]int64{tok, sent}, "another VM reads them, halved after a half-life")
	_, err = b.AcquireQueued(11, 400, 400, 0, t0+recentHalfLifeMS)
	require.NoError(t, err)
	require.NoError(t, b.Flush(t0+recentHalfLifeMS))
	require.NoError(t, a.Flush(t0+recentHalfLifeMS))
	tok, sent = recent(a, t0+recentHalfLifeMS)
	assert.Equal(t, [2]int64{800, 2 * countUnit}, [2]int64{tok, sent}, "both VMs' work, as of the later half-life")
	tok, sent = recent(a, t0+3*recentHalfLifeMS)
	assert.Equal(t, [2]int64{200, countUnit / 2}, [2]int64{tok, sent}, "half a request is still counted")
	tok, sent = recent(a, t0+80*recentHalfLifeMS)
	assert.Equal(t, [2]int64{0, 0}, [2]int64{tok, sent})
}

func TestThePoolsWorkPerRequestOutlastsAHalving(t *testing.T) {
	// Three requests of 1000 uncached tokens, read a half-life later: 1500 tokens
	// over one and a half requests. Counted in whole requests, the three would halve
	// to one, and each request would seem to bring 1500 tokens.
	clock := &fakeClock{ms: 16*recentHalfLifeMS - 10}
	r := NewRouter(testConfig(t, ""), state.NewMemoryStore(), clock.now)
	id := r.DecodeTargets()[0].ID
	for k := 0; k < 3; k++ {
		tk, err := r.decode.ledger.AcquireQueued(id, 1000, 1000, clock.ms, clock.ms)
		require.NoError(t, err)
		require.NoError(t, r.decode.ledger.FirstChunk(&tk, clock.ms+1))
		require.NoError(t, r.decode.ledger.Release(tk, clock.now))
	}
	clock.ms += recentHalfLifeMS
	v, err := r.view(r.decode, NoRank, clock.ms)
	require.NoError(t, err)
	assert.Equal(t, int64(1000), v.perRequest)
}
