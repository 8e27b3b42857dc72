package prefix

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestPrefixTableRefreshesAClockThatMovedOn(t *testing.T) {
	tab := newPrefixTable(64)
	assert.True(t, tab.record(1, 7, 10, 4), "a new entry")
	assert.False(t, tab.record(1, 7, 11, 4), "within one multiple of refresh: no news for the peers")
	assert.True(t, tab.record(1, 7, 12, 4), "crossed a multiple of refresh")
	assert.False(t, tab.record(1, 7, 15, 4))
	assert.False(t, tab.record(1, 7, 100, 0), "refresh 0: clocks are never news")
	assert.Equal(t, uint32(100), tab.find(1).clocks[0])
	assert.True(t, tab.record(1, 8, 5, 0), "a new first target")
	assert.Equal(t, [4]uint32{8, 7}, tab.find(1).targets)
	assert.Equal(t, [4]uint32{5, 100}, tab.find(1).clocks, "clocks move with their targets")
}
