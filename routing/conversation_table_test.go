package routing

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/kvroute/kvroute/routing/hashx"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConversationTableRecordsAndFinds(t *testing.T) {
	tab := NewConversationTable(state.NewMemoryStore(), "ns", "decode", 1000, 8)
	for i := 0; i < 500; i++ {
		require.NoError(t, tab.Record(uint64(i)*0x9e3779b97f4a7c15, uint64(i)))
	}
	for i := 0; i < 500; i++ {
		got, ok, err := tab.Lookup(uint64(i) * 0x9e3779b97f4a7c15)
		require.NoError(t, err)
		require.True(t, ok, i)
		assert.Equal(t, uint64(i), got)
	}
	_, ok, err := tab.Lookup(12345)
	require.NoError(t, err)
	assert.False(t, ok)
}

func TestConversationTableIsBoundedUnder100kIDs(t *testing.T) {
	store := state.NewMemoryStore()
	const maxSessions = 4096
	tab := NewConversationTable(store, "kvroute", "decode", maxSessions, 8)
	for i := 0; i < 100_000; i++ {
		require.NoError(t, tab.Record(hashx.FingerprintString("conv-"+strconv.Itoa(i)), uint64(i%7)))
	}
	keys, bytes := store.Footprint()
	assert.Equal(t, maxSessions/conversationBucketSize, keys)
	// 16 bytes an entry, one format byte and a short key per bucket: ≤ 32 bytes/entry.
	assert.LessOrEqual(t, bytes, maxSessions*32)
	assert.GreaterOrEqual(t, bytes, maxSessions*conversationEntryBytes)
	// The most recent ids are still there; the oldest are gone.
	recent, old := 0, 0
	for i := 0; i < 1000; i++ {
		if _, ok, _ := tab.Lookup(hashx.FingerprintString("conv-" + strconv.Itoa(99_999-i))); ok {
			recent++
		}
		if _, ok, _ := tab.Lookup(hashx.FingerprintString("conv-" + strconv.Itoa(i))); ok {
			old++
		}
	}
	assert.Equal(t, 1000, recent)
	assert.Equal(t, 0, old)
}

func TestConversationTableEvictsLeastRecentlyUsed(t *testing.T) {
	// One bucket of 16: touching an old entry saves it from eviction.
	tab := NewConversationTable(state.NewMemoryStore(), "ns", "decode", conversationBucketSize, 8)
	for i := 0; i < conversationBucketSize; i++ {
		require.NoError(t, tab.Record(uint64(i+1), 100))
	}
	_, ok, err := tab.Lookup(1) // deepest entry: promoted to the front
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, tab.Record(999, 100)) // evicts the least recent: 2
	_, ok, _ = tab.Lookup(1)
	assert.True(t, ok, "a recently used entry survives")
	_, ok, _ = tab.Lookup(2)
	assert.False(t, ok, "the least recently used entry is evicted")
}

func TestConversationTableStartsAfreshOnUnknownFormat(t *testing.T) {
	store := state.NewMemoryStore()
	tab := NewConversationTable(store, "ns", "decode", 16, 8)
	require.NoError(t, store.Set(tab.key(7), []byte{99, 1, 2, 3}, 0))
	_, ok, err := tab.Lookup(7)
	require.NoError(t, err)
	assert.False(t, ok)
	require.NoError(t, tab.Record(7, 5))
	got, ok, err := tab.Lookup(7)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, uint64(5), got)
	v, _, _ := store.Get(tab.key(7))
	assert.Equal(t, byte(conversationFormat), v[0], fmt.Sprintf("%v", v))
}
