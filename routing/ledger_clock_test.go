package routing

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/kvroute/kvroute/routing/state"
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
