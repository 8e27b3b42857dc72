package prefix

import (
	"math/rand"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recordOne records one hash and reports whether it was news.
func recordOne(tab *prefixTable, hash uint64, target, clock, refresh uint32) bool {
	return len(tab.record([]Checkpoint{{Hash: hash}}, target, clock, refresh)) > 0
}

func TestPrefixTableRefreshesAClockThatMovedOn(t *testing.T) {
	tab := newPrefixTable(64)
	assert.True(t, recordOne(tab, 1, 7, 10, 4), "a new entry")
	assert.False(t, recordOne(tab, 1, 7, 11, 4), "within one multiple of refresh: no news for the peers")
	assert.True(t, recordOne(tab, 1, 7, 12, 4), "crossed a multiple of refresh")
	assert.False(t, recordOne(tab, 1, 7, 15, 4))
	assert.False(t, recordOne(tab, 1, 7, 100, 0), "refresh 0: clocks are never news")
	assert.Equal(t, uint32(100), tab.find(1).clocks[0])
	assert.True(t, recordOne(tab, 1, 8, 5, 0), "a new first target")
	assert.Equal(t, []uint32{8, 7, 0}, tab.find(1).targets[:3])
	assert.Equal(t, []uint32{5, 100, 0}, tab.find(1).clocks[:3], "clocks move with their targets")
	// Targets 9 on, each at its number less 3, fill the entry; one more drops the
	// oldest, 7.
	last := uint32(8 + prefixTargetsPerEntry - 1)
	for tg := uint32(9); tg < last; tg++ {
		assert.True(t, recordOne(tab, 1, tg, tg-3, 0))
	}
	assert.Equal(t, uint32(7), tab.find(1).targets[prefixTargetsPerEntry-1], "full")
	assert.True(t, recordOne(tab, 1, last, last-3, 0), "one more target drops the oldest")
	var targets, clocks [prefixTargetsPerEntry]uint32
	for s := range targets {
		targets[s] = last - uint32(s)
		clocks[s] = targets[s] - 3
	}
	assert.Equal(t, targets, tab.find(1).targets)
	assert.Equal(t, clocks, tab.find(1).clocks)
	assert.True(t, recordOne(tab, 1, 9, 9, 0), "a known target moves first")
	// 9 was next to last: the ones before it move down one.
	copy(targets[1:], targets[:prefixTargetsPerEntry-2])
	copy(clocks[1:], clocks[:prefixTargetsPerEntry-2])
	targets[0], clocks[0] = 9, 9
	assert.Equal(t, targets, tab.find(1).targets)
	assert.Equal(t, clocks, tab.find(1).clocks)
}

// referenceRecord is the plain record of one hash that record must match: found, the
// entry is stamped and its target put first (news unless it was first already and
// its clock stayed within a multiple of refresh); not found, it takes the way least
// recently written (news).
func referenceRecord(t *prefixTable, hash uint64, target, clock, refresh uint32) (news bool) {
	if t.entries == nil {
		t.entries = make([]prefixEntry, t.sets*prefixWays)
	}
	t.clock++
	if t.clock == 0 {
		t.clock = 1
	}
	set := t.set(hash)
	for i := range set {
		if e := &set[i]; e.hash == hash && e.stamp != 0 {
			e.stamp = t.clock
			if e.targets[0] == target {
				old := e.clocks[0]
				e.clocks[0] = clock
				return refresh > 0 && clock/refresh != old/refresh
			}
			j := len(e.targets) - 1
			for s, t := range e.targets {
				if t == target {
					j = s
					break
				}
			}
			copy(e.targets[1:j+1], e.targets[:j])
			copy(e.clocks[1:j+1], e.clocks[:j])
			e.targets[0], e.clocks[0] = target, clock
			return true
		}
	}
	victim := 0
	for i := range set {
		if set[i].stamp < set[victim].stamp {
			victim = i
		}
	}
	set[victim] = prefixEntry{hash: hash, targets: [prefixTargetsPerEntry]uint32{target},
		clocks: [prefixTargetsPerEntry]uint32{clock}, stamp: t.clock}
	return true
}

// referenceFind is the plain lookup that find must match: every way of the set.
func referenceFind(t *prefixTable, hash uint64) *prefixEntry {
	if t.entries == nil {
		return nil
	}
	set := t.set(hash)
	for i := range set {
		if set[i].hash == hash && set[i].stamp != 0 {
			return &set[i]
		}
	}
	return nil
}

// A prompt's checkpoints recorded in one call leave the table, its clock and the news
// exactly as the plain record of one hash at a time does, through evictions, repeats
// (a hash twice in one call), new first targets, refreshes and a wrapping clock; and
// find, which stops at a set's first empty way, finds what a search of every way
// does (hash 0, the hash of an empty way, included).
func TestPrefixTableRecordsABatchAsOneAtATime(t *testing.T) {
	rng := rand.New(rand.NewSource(6))
	batch, single := newPrefixTable(64), newPrefixTable(64)
	batch.clock, single.clock = ^uint32(0)-500, ^uint32(0)-500
	for call := 0; call < 400; call++ {
		cps := make([]Checkpoint, rng.Intn(40))
		for i := range cps {
			// Few hashes over the 8 sets: repeats and evictions.
			cps[i].Hash = uint64(rng.Intn(120)) * 0x9e3779b97f4a7c15
		}
		target, clock, refresh := uint32(1+rng.Intn(6)), uint32(rng.Intn(1000)), uint32(rng.Intn(3)*50)
		var want []uint64
		for _, cp := range cps {
			if referenceRecord(single, cp.Hash, target, clock, refresh) {
				want = append(want, cp.Hash)
			}
		}
		got := batch.record(cps, target, clock, refresh)
		require.Equal(t, len(want), len(got), "call %d", call)
		if len(want) > 0 {
			require.Equal(t, want, got, "call %d", call)
		}
		require.Equal(t, single.clock, batch.clock)
		require.Equal(t, single.entries, batch.entries, "call %d", call)
		for h := uint64(0); h < 120; h++ {
			require.Equal(t, referenceFind(single, h*0x9e3779b97f4a7c15), batch.find(h*0x9e3779b97f4a7c15))
		}
	}
}

func TestAPrefixCountsItsDemand(t *testing.T) {
	tab := newPrefixTable(64)
	recordOne(tab, 1, 7, 10, 0)
	e := tab.find(1)
	n, span := e.warm(16_000, 20)
	assert.Equal(t, 0, n, "the first request starts the clock")
	assert.Equal(t, int64(0), span)
	n, span = e.warm(16_096, 30)
	assert.Equal(t, 0, n, "the first one's own tokens are not counted: it came at the start")
	assert.Equal(t, int64(96), span, "from the first request")
	n, span = e.warm(18_000, 10)
	assert.Equal(t, 30, n, "the blocks of the requests since the first")
	assert.Equal(t, int64(2000), span)
	// Past two windows, what was counted is taken as even over the time and scaled
	// to the last window.
	n, span = e.warm(20_000, 10)
	assert.Equal(t, 40*HeatWindowMS/4000, n)
	assert.Equal(t, int64(HeatWindowMS), span)
	// An entry that another hash takes over starts with no demand.
	tab2 := newPrefixTable(8)
	recordOne(tab2, 1, 7, 10, 0)
	tab2.find(1).warm(16_000, 5)
	tab2.find(1).warm(16_016, 5)
	tab2.find(1).warm(16_032, 5)
	for h := uint64(2); h <= prefixWays; h++ {
		recordOne(tab2, h, 7, 10+uint32(h), 0) // one set: the table has one
	}
	recordOne(tab2, 100, 7, 30, 0) // the set is full: the least recently written way, 1's, goes
	require.Nil(t, tab2.find(1))
	n, _ = tab2.find(100).warm(16_048, 5)
	assert.Equal(t, 0, n, "a new entry on an old way has no demand")
}
