// Package prefix is the prefix index: which targets recently served which prompt
// prefixes, kept per VM in plain memory and shared between the VMs through a journal
// in shared data.
package prefix

import (
	"github.com/kvroute/kvroute/routing/state"
)

// PrefixIndex remembers which targets recently served which prompt prefixes, so that
// a request meets the target that holds its prefix's KV cache.
//
// Design. A prompt is hashed as one chain of blocks (HashCheckpoints) and only its
// checkpoints are kept: every block count up to 16, then 8 per octave, plus the
// prompt's last full block — 16 + 8·log2(n/16) + 1 entries for n blocks. Each entry
// (a checkpoint hash and its 4 most recent targets) lives in a set-associative table
// (prefixTable). Recording a prompt refreshes all its checkpoints, so within one
// lineage an earlier checkpoint is never older than a later one: "some target holds
// checkpoint i" is monotone in i, and a lookup binary-searches the checkpoints — a
// few more rounds find targets that hold shorter prefixes. Because checkpoints are
// chain hashes, a reported match is never longer than the true longest common prefix
// with a recorded prompt; because the grid has 8 points per octave, it is never
// shorter than 7/8 of it. A lookup on a hashed Prompt (StartPromptMatch) also finds a
// recorded prompt's last block between two checkpoints: a previous turn, whole.
//
// Where it lives. Reading shared data costs a host call and a copy, and a prompt has
// dozens of checkpoints, so each VM keeps its own table and the VMs share what they
// record through shared data instead (prefixJournal): a request's lookup and record
// cost no host call at all, and every tick each VM publishes what it recorded since
// the last tick as one value and applies what the others published. A VM therefore
// sees its own records at once and other VMs' records within a tick.
type PrefixIndex struct {
	table   *prefixTable
	journal *prefixJournal
	search  PrefixSearch // the lookup in progress, reused
}

// NewPrefixIndex returns the index of one pool, holding at most capacityBlocks
// checkpoint entries.
func NewPrefixIndex(s state.Store, namespace, pool string, capacityBlocks, retries int) *PrefixIndex {
	return &PrefixIndex{
		table:   newPrefixTable(capacityBlocks),
		journal: newPrefixJournal(s, namespace, pool, retries),
	}
}

// PrefixMatch says how many leading blocks of a prompt a target holds.
type PrefixMatch struct {
	Target uint32 // low 32 bits of the target id
	Blocks int
	Clock  uint32 // the target's write clock when it recorded the prefix
}

// maxMatchRounds bounds the binary searches of one lookup: the first finds the
// deepest match of any target, each further one the deepest of targets not found yet.
const maxMatchRounds = 4

// Match returns the matched block count of each target that holds a prefix of the
// prompt. known says whether a 32-bit target id is one the pool still has; others are
// ignored. The result is valid until the next Match.
func (x *PrefixIndex) Match(cps []Checkpoint, known func(uint32) bool) []PrefixMatch {
	m := x.StartMatch(cps, known)
	for m.Next() {
	}
	return m.Found()
}

// StartMatch begins a lookup that runs one binary search per Next: a caller that only
// needs the deepest match (a continuation) stops after the first.
func (x *PrefixIndex) StartMatch(cps []Checkpoint, known func(uint32) bool) *PrefixSearch {
	return x.StartMatchLive(cps, known, nil)
}

// StartMatchLive is StartMatch that also drops evicted copies: a target holds the
// first p blocks of a prefix while its write clock has moved on, since it recorded the
// prefix, by no more than its cache less p (an LRU cache evicts the least recently
// used blocks first, a request's last ones first: see live). clockOf gives a
// target's clock and cache; a target whose cache is 0 (unknown) keeps every copy.
func (x *PrefixIndex) StartMatchLive(cps []Checkpoint, known func(uint32) bool, clockOf func(uint32) (uint32, uint32)) *PrefixSearch {
	// Field by field: in wasm a struct literal is zeroed and copied by host calls.
	// ids, state and now need no reset: only their first nids count.
	m := &x.search
	m.x, m.cps, m.known, m.hi, m.rounds, m.found, m.deepest, m.deepestPos = x, cps, known, len(cps), 0, m.found[:0], nil, 0
	m.nids, m.clockOf, m.lastNow, m.lastCap, m.lastID, m.lastState = 0, clockOf, 0, 0, 0, 0
	m.prompt, m.end, m.endPos = nil, nil, 0
	return m
}

// StartPromptMatch is StartMatchLive on a hashed prompt, whose first round also finds
// a recorded prompt that ended between two of its checkpoints: a conversation's
// previous turn. The grid alone would match such a turn only up to the checkpoint
// below its end, which up to an eighth of the turn short of it may be a prefix many
// others share (a system prompt); so when that checkpoint has two holders or more, the
// first round hashes each block between it and the next checkpoint and looks each up
// as a record's last block (endBetween).
func (x *PrefixIndex) StartPromptMatch(p *Prompt, known func(uint32) bool, clockOf func(uint32) (uint32, uint32)) *PrefixSearch {
	m := x.StartMatchLive(p.Checkpoints, known, clockOf)
	m.prompt = p
	return m
}

// PrefixSearch is a lookup in progress (see StartMatch).
type PrefixSearch struct {
	x      *PrefixIndex
	cps    []Checkpoint
	prompt *Prompt      // the prompt of cps, to hash blocks between them; nil: the grid alone
	end    *prefixEntry // the first round's match between checkpoints (endBetween), nil if none
	endPos int          // and its blocks
	gap    []uint64     // endBetween's hashes, reused
	known  func(uint32) bool
	hi     int // search checkpoints [0, hi)
	rounds int
	found  []PrefixMatch
	// deepest is the entry of the deepest checkpoint matched (the first round's), nil
	// if none, and deepestPos its blocks.
	deepest    *prefixEntry
	deepestPos int
	// known and "found already" are asked of the same few ids at every probe: their
	// answers are kept here rather than asked through a closure each time (costly in
	// wasm). state: 1 known, 2 known and found, -1 unknown.
	ids   [2 * prefixTargetsPerEntry]uint32
	state [2 * prefixTargetsPerEntry]int8
	now   [2 * prefixTargetsPerEntry]uint32 // the target's write clock
	caps  [2 * prefixTargetsPerEntry]uint32 // the target's cache, in clock units (0: unknown)
	nids  int

	clockOf func(uint32) (uint32, uint32) // see StartMatchLive; nil: copies never go stale
	lastNow uint32                        // the clock of the target fresh last answered for
	lastCap uint32                        // and its cache
	// The target status last answered for and its answer: a search asks of the same
	// target probe after probe, and this answer is inlined where the cache above
	// costs a call.
	lastID    uint32 // 0: none yet (no target is 0)
	lastState int8
}

// Found is every match found so far, deepest first.
func (m *PrefixSearch) Found() []PrefixMatch { return m.found }

// Demand counts this request, with own blocks of its own beyond its deepest checkpoint
// matched, on that checkpoint's prefix at nowMS. It returns the blocks of their own
// that the other requests whose deepest checkpoint matched that was brought in the
// last one to two seconds (not counting the first of them, which starts the clock),
// and the time since that first one in ms; 0, 0 without a match. The count is this
// VM's own. A record found between checkpoints (StartPromptMatch) does not move it:
// the turns of conversations that share a prompt count toward that prompt's demand
// until their history passes a checkpoint, as the load they bring to its holders.
func (m *PrefixSearch) Demand(nowMS int64, own int) (blocks int, spanMS int64) {
	if m.deepest == nil {
		return 0, 0
	}
	return m.deepest.warm(nowMS, own)
}

// DeepestBlocks is the blocks of the deepest checkpoint matched, the prefix Demand
// counts on (0 without a match).
func (m *PrefixSearch) DeepestBlocks() int { return m.deepestPos }

// DeepestHash is the hash of the deepest checkpoint matched (0 without a match): the
// same for every request that shares that prefix, on every VM and replica.
func (m *PrefixSearch) DeepestHash() uint64 {
	if m.deepest == nil {
		return 0
	}
	return m.deepest.hash
}

// Done reports whether further rounds can find nothing more.
func (m *PrefixSearch) Done() bool { return m.rounds >= maxMatchRounds || m.hi <= 0 }

func (m *PrefixSearch) fresh(t uint32) bool { return m.status(t) == 1 }

// holder reports whether t is a target of the pool, found or not.
func (m *PrefixSearch) holder(t uint32) bool { return m.status(t) > 0 }

// status is 1 for a known target not found yet, 2 for one found, -1 for an unknown
// one; it leaves the target's write clock in lastNow.
func (m *PrefixSearch) status(t uint32) int8 {
	if t == m.lastID { // lastNow is still t's
		return m.lastState
	}
	return m.lookupStatus(t)
}

// lookupStatus is status through the cache of ids, else known and clockOf; it
// keeps its answer as the last.
func (m *PrefixSearch) lookupStatus(t uint32) int8 {
	m.lastID = t
	for i := 0; i < m.nids; i++ {
		if m.ids[i] == t {
			m.lastNow, m.lastCap, m.lastState = m.now[i], m.caps[i], m.state[i]
			return m.lastState
		}
	}
	ok := m.known(t)
	m.lastNow, m.lastCap = 0, 0
	if ok && m.clockOf != nil {
		m.lastNow, m.lastCap = m.clockOf(t)
	}
	st := int8(-1)
	if ok {
		st = 1
		for _, f := range m.found {
			if f.Target == t {
				st = 2
			}
		}
	}
	if m.nids < len(m.ids) {
		m.ids[m.nids], m.state[m.nids], m.now[m.nids], m.caps[m.nids] = t, st, m.lastNow, m.lastCap
		m.nids++
	}
	m.lastState = st
	return st
}

func (m *PrefixSearch) markFound(t uint32) {
	if t == m.lastID {
		m.lastState = 2
	}
	for i := 0; i < m.nids; i++ {
		if m.ids[i] == t {
			m.state[i] = 2
		}
	}
}

// CommonDepth is the deepest checkpoint position (in blocks) whose entry names as
// many live holders as an entry can: a prefix that popular (a shared system prompt)
// is taken to be held by every target, since the entry can only name its most
// recent holders. Without it every request sharing such a prefix would go to the
// few named holders, and each would keep them named. 0 if none.
func (m *PrefixSearch) CommonDepth() int {
	if m.end != nil && m.full(m.end, m.endPos) { // deeper than any checkpoint held
		return m.endPos
	}
	lo, hi, top := 0, len(m.cps), -1
	for lo < hi {
		mid := (lo + hi) / 2
		if m.full(m.x.table.find(m.cps[mid].Hash), m.cps[mid].Pos) {
			top, lo = mid, mid+1
		} else {
			hi = mid
		}
	}
	if top < 0 {
		return 0
	}
	return m.cps[top].Pos
}

// full reports whether e, the checkpoint at pos, names as many live holders as an
// entry can.
func (m *PrefixSearch) full(e *prefixEntry, pos int) bool {
	n := 0
	for s := 0; e != nil && s < prefixTargetsPerEntry; s++ {
		if t := e.targets[s]; t != 0 && m.holder(t) && m.live(e, s, pos) {
			n++
		}
	}
	return n == prefixTargetsPerEntry
}

// Next runs one more binary search: the deepest checkpoint below the last one found
// that a target not found yet holds. It reports whether it found any.
func (m *PrefixSearch) Next() bool {
	if m.Done() {
		return false
	}
	m.rounds++
	lo, top := 0, -1
	var topEntry *prefixEntry
	for hi := m.hi; lo < hi; {
		mid := (lo + hi) / 2
		e := m.x.table.find(m.cps[mid].Hash)
		holds := false
		for s := 0; e != nil && s < prefixTargetsPerEntry; s++ {
			if t := e.targets[s]; t != 0 && m.fresh(t) && m.live(e, s, m.cps[mid].Pos) {
				holds = true
				break
			}
		}
		if holds {
			top, topEntry, lo = mid, e, mid+1
		} else {
			hi = mid
		}
	}
	if top < 0 {
		m.hi = 0
		return false
	}
	if m.rounds == 1 {
		m.deepest, m.deepestPos = topEntry, m.cps[top].Pos
		if pos, e := m.endBetween(top, topEntry); e != nil {
			m.end, m.endPos = e, pos
			m.take(e, pos)
		}
	}
	m.take(topEntry, m.cps[top].Pos)
	m.hi = top // targets not found yet hold less: look below
	return true
}

// take adds the targets of e not found yet, holding pos blocks.
func (m *PrefixSearch) take(e *prefixEntry, pos int) {
	for s, t := range e.targets {
		if t != 0 && m.fresh(t) && m.live(e, s, pos) {
			m.found = append(m.found, PrefixMatch{Target: t, Blocks: pos, Clock: e.clocks[s]})
			m.markFound(t)
		}
	}
}

// endBetween returns the deepest block between checkpoint top, whose entry is e, and
// the next one whose hash the index holds (a recorded prompt's last block) with a live
// target, and its entry; nil when there is none or no prompt to hash. It looks only
// when e names two live holders or more: a prompt that ended past top went through
// top on the same target, so with one holder the probes could only find that holder
// deeper, and the choice between targets would not change.
func (m *PrefixSearch) endBetween(top int, e *prefixEntry) (pos int, found *prefixEntry) {
	if m.prompt == nil || top+1 >= len(m.cps) || m.cps[top+1].Pos == m.cps[top].Pos+1 {
		return 0, nil
	}
	holders := 0
	for s, t := range e.targets {
		if t != 0 && m.fresh(t) && m.live(e, s, m.cps[top].Pos) {
			holders++
		}
	}
	if holders < 2 {
		return 0, nil
	}
	// The blocks' hashes first, then the probes from the deepest down: a previous
	// turn usually ends near this one's end, and a probe (a table row far from any
	// other) costs more than a hash.
	m.gap = hashBetween(m.prompt, top, m.gap[:0])
	first := m.cps[top].Pos + 1
	for k := len(m.gap) - 1; k >= 0; k-- {
		e := m.x.table.find(m.gap[k])
		for s := 0; e != nil && s < prefixTargetsPerEntry; s++ {
			if t := e.targets[s]; t != 0 && m.fresh(t) && m.live(e, s, first+k) {
				return first + k, e
			}
		}
	}
	return 0, nil
}

// live reports whether slot s of e, the checkpoint at pos blocks, is a copy the target
// still holds (fresh must have just answered for e.targets[s]). An engine evicts the
// least recently used blocks first and, of one request's, the last first (vLLM frees
// them in reverse; SGLang's radix tree evicts leaves): the first pos blocks of a
// prompt recorded age blocks of writes ago are all there while age + pos is within
// the cache. A long prompt's head thus outlives its tail.
func (m *PrefixSearch) live(e *prefixEntry, s, pos int) bool {
	if m.lastCap == 0 {
		return true
	}
	age := m.lastNow - e.clocks[s]
	return age >= 1<<31 || uint64(age)+uint64(pos) <= uint64(m.lastCap) // past 2^31: a clock read before the record, fresh
}

// YoungerHead is the deepest of the search's checkpoints shallower than pos blocks
// that target t recorded at a later write clock than clock, in blocks (0 if none): a
// head of the prompt that a later request refreshed there, which outlives the copy
// recorded at clock. A request records every checkpoint of its prompt at one clock,
// so on one target a shallower checkpoint's clock is never behind a deeper one's, and
// the search halves.
func (m *PrefixSearch) YoungerHead(t uint32, pos int, clock uint32) int {
	if len(m.cps) == 0 || m.cps[0].Pos >= pos || !m.x.table.recordedAfter(m.cps[0].Hash, t, clock) {
		return 0 // the first checkpoint is the youngest: none is younger
	}
	lo, hi, head := 1, len(m.cps), m.cps[0].Pos
	for lo < hi {
		mid := (lo + hi) / 2
		cp := &m.cps[mid]
		if cp.Pos < pos && m.x.table.recordedAfter(cp.Hash, t, clock) {
			head, lo = cp.Pos, mid+1
		} else {
			hi = mid
		}
	}
	return head
}

// Record stores the prompt's checkpoints against target at its write clock, and
// queues for the other VMs what changed (a clock moved on by at least refresh counts;
// 0 never does).
func (x *PrefixIndex) Record(cps []Checkpoint, target uint64, clock, refresh uint32) {
	t32 := PrefixTargetID(target)
	for _, hash := range x.table.record(cps, t32, clock, refresh) {
		x.journal.queue(hash, t32)
	}
}

// Sync publishes this VM's recent records and applies the other VMs', each at the
// target's write clock as this VM sees it (clockOf; nil: 0). It runs on the tick,
// never on a request.
func (x *PrefixIndex) Sync(nowMS int64, clockOf func(uint32) uint32) error {
	return x.journal.sync(nowMS, func(hash uint64, t32 uint32) {
		var c uint32
		if clockOf != nil {
			c = clockOf(t32)
		}
		x.table.record([]Checkpoint{{Hash: hash}}, t32, c, 0)
	})
}

// PrefixTargetID is the 32-bit form of a target id that the prefix index keeps (0 is
// reserved for an empty slot).
func PrefixTargetID(id uint64) uint32 {
	if t := uint32(id); t != 0 {
		return t
	}
	return 1
}
