package prefix

// prefixTable is a VM's own copy of a pool's prefix index: a set-associative table of
// checkpoint entries (8 ways a set, least recently recorded evicted), each keeping the
// 8 targets that most recently served its prefix. It is plain memory: a lookup or a
// record costs no host call. PrefixIndex keeps the copies of all VMs in step through
// shared data.
type prefixTable struct {
	sets    uint64
	entries []prefixEntry
	clock   uint32   // advances on every write; an entry's stamp is its last write
	news    []uint64 // record's result, reused
}

const (
	prefixWays = 8
	// An entry that names as many holders as it can counts its prefix as held by
	// every target (PrefixSearch.CommonDepth). Eight tell a pool of up to 8 targets
	// (4 engines of 2 ranks) that holds a prefix on some of them from one that holds
	// it on all.
	prefixTargetsPerEntry = 8
	// TargetsPerEntry is how many holders a prefix's entry names at most.
	TargetsPerEntry = prefixTargetsPerEntry
)

type prefixEntry struct {
	hash    uint64
	targets [prefixTargetsPerEntry]uint32 // 0 marks an empty slot
	// clocks[s] is targets[s]'s write clock when it last recorded the prefix: once
	// the clock has moved on by more than the target's cache holds less the prefix,
	// the copy is gone (PrefixSearch.live).
	clocks [prefixTargetsPerEntry]uint32
	stamp  uint32 // 0 marks an empty entry
	// Since heatFrom (in heatUnitMS units, wrapping) the requests whose deepest match
	// was this prefix brought heat − 1 blocks of their own, saturating; the first of
	// them only started the count (0: none yet). The prefix's demand now.
	heatFrom, heat uint16
}

const (
	heatUnitMS   = 16   // so heatFrom wraps after 17 minutes
	HeatWindowMS = 1024 // demand is counted over the last one to two of these
)

// warm counts a request of own blocks of its own on e at nowMS and returns the blocks
// of their own that the requests since the first one counted brought before this one,
// and the time since that first one, in ms: from the first request, which starts the
// clock, the next ones' tokens over the time they took to come. Past two windows the
// count is scaled to the last window, as if its requests had come evenly.
func (e *prefixEntry) warm(nowMS int64, own int) (blocks int, spanMS int64) {
	now := uint16(nowMS / heatUnitMS)
	if e.heat == 0 {
		e.heatFrom, e.heat = now, 1
		return 0, 0
	}
	span := int64(uint16(now-e.heatFrom)) * heatUnitMS
	if span > 2*HeatWindowMS {
		e.heat = uint16(int64(e.heat-1)*HeatWindowMS/span) + 1
		e.heatFrom, span = now-HeatWindowMS/heatUnitMS, HeatWindowMS
	}
	before := int(e.heat) - 1
	e.heat = uint16(min(int(e.heat)+own, 1<<16-1))
	return before, span
}

func newPrefixTable(capacity int) *prefixTable {
	sets := (capacity + prefixWays - 1) / prefixWays
	if sets < 1 {
		sets = 1
	}
	// The entries are made at the first record: a pool that never routes (an unused
	// prefill pool, an idle fleet of many) costs the VM no memory.
	return &prefixTable{sets: uint64(sets)}
}

// set maps the hash's top 32 bits onto the sets by a multiply and a shift (Lemire's
// reduction; the table has far fewer than 2^32 sets): one 64-bit multiply, where
// bits.Mul64 is a dozen in wasm.
func (t *prefixTable) set(hash uint64) []prefixEntry {
	s := setOf(hash, t.sets)
	return t.entries[s*prefixWays : (s+1)*prefixWays]
}

// setOf is the index of hash's set among sets (see set).
func setOf(hash, sets uint64) uint64 { return (hash >> 32) * sets >> 32 }

// find returns the entry of hash, or nil. It stops at the first empty way (see slot).
func (t *prefixTable) find(hash uint64) *prefixEntry {
	if t.entries == nil {
		return nil
	}
	set := t.set(hash)
	for i := range set {
		if set[i].stamp == 0 {
			return nil
		}
		if set[i].hash == hash {
			return &set[i]
		}
	}
	return nil
}

// recordedAfter reports whether target recorded the prefix of hash at a write clock
// later than clock (clocks wrap: later is less than 2^31 ahead).
func (t *prefixTable) recordedAfter(hash uint64, target, clock uint32) bool {
	e := t.find(hash)
	if e == nil {
		return false
	}
	for s := range e.targets {
		if e.targets[s] == target {
			return int32(e.clocks[s]-clock) > 0
		}
	}
	return false
}

// slot returns the entry of hash, else the empty way of its set that a new hash takes,
// else nil (a full set without it). A set's entries are its first ways: a new entry
// takes the first empty way, and an entry is only ever replaced. So a search stops at
// the first empty way, and in a table far from full that is soon.
func (t *prefixTable) slot(hash uint64) *prefixEntry {
	set := t.set(hash)
	for i := range set {
		if set[i].hash == hash || set[i].stamp == 0 {
			return &set[i]
		}
	}
	return nil
}

// record makes target the most recent holder of each checkpoint's hash, in order, at
// its write clock. It returns the hashes whose record changed something a peer would
// need to hear about (a new entry, a new first target, or a clock that crossed a
// multiple of refresh), valid until the next record; a repeat otherwise only
// refreshes the entry's recency and clock.
//
// A prompt's checkpoints go in one call: in wasm a call costs more than a
// checkpoint's record.
func (t *prefixTable) record(cps []Checkpoint, target, clock, refresh uint32) []uint64 {
	if t.entries == nil {
		t.entries = make([]prefixEntry, t.sets*prefixWays)
	}
	if cap(t.news) < len(cps) {
		t.news = make([]uint64, len(cps))
	}
	news, n := t.news[:len(cps)], 0
	// Kept in locals: the loop's stores to entries would otherwise have every
	// iteration load them from t again.
	entries, sets := t.entries, t.sets
	stamp := t.clock
	// Most records repeat a prefix on the target that holds it first, in the first
	// way of its set (a table far from full): the inner loop takes those alone, with
	// no call in it, so that in wasm it keeps its values in locals (a call would have
	// every iteration store them) and takes no jump but its own; it stops at any
	// other hash, which recordSlot takes before the loop goes on. The first way of
	// the hash is what slot would find.
	for i := 0; i < len(cps); i++ {
		for ; i < len(cps); i++ {
			h := cps[i].Hash
			stamp++
			if stamp == 0 { // wrapped: stamps restart, ordering is approximate for a moment
				stamp = 1
			}
			set := setOf(h, sets)
			e := &entries[set*prefixWays]
			if e.hash != h || e.stamp == 0 || e.targets[0] != target {
				break
			}
			e.stamp = stamp
			// Crossing a multiple of refresh is news: peers then hear of a prefix in
			// use at least once every refresh of clock.
			old := e.clocks[0]
			e.clocks[0] = clock
			if refresh != 0 && clock/refresh != old/refresh {
				news[n] = h
				n++
			}
		}
		if i < len(cps) && t.recordSlot(cps[i].Hash, target, clock, refresh, stamp) {
			news[n] = cps[i].Hash
			n++
		}
	}
	t.clock = stamp
	return news[:n]
}

// recordSlot is record's step for one hash at stamp off its common path, out of
// line (the record loop keeps fewer live values without it): it makes target the
// most recent holder of hash on its entry, or on the empty way a new hash takes, or,
// in a full set without it, on the way least recently written. It reports whether
// that is news.
func (t *prefixTable) recordSlot(hash uint64, target, clock, refresh, stamp uint32) bool {
	e := t.slot(hash)
	if e != nil && e.stamp != 0 {
		e.stamp = stamp
		if e.targets[0] != target {
			promoteTarget(e, target, clock)
			return true
		}
		old := e.clocks[0]
		e.clocks[0] = clock
		return refresh != 0 && clock/refresh != old/refresh
	}
	if e == nil {
		set := t.set(hash)
		victim := 0
		for i := range set {
			if set[i].stamp < set[victim].stamp {
				victim = i
			}
		}
		e = &set[victim]
	}
	// Field by field: in wasm a struct literal is zeroed by a host call.
	e.hash, e.stamp = hash, stamp
	e.targets = [prefixTargetsPerEntry]uint32{target}
	e.clocks = [prefixTargetsPerEntry]uint32{clock}
	e.heatFrom, e.heat = 0, 0
	return true
}

// promoteTarget puts target first with its clock, keeping the others in order
// (dropping the oldest).
func promoteTarget(e *prefixEntry, target, clock uint32) {
	ts := &e.targets
	j := len(ts) - 1
	for i, t := range ts {
		if t == target {
			j = i
			break
		}
	}
	copy(ts[1:j+1], ts[:j])
	copy(e.clocks[1:j+1], e.clocks[:j])
	ts[0], e.clocks[0] = target, clock
}
