package routing

import (
	"encoding/binary"
)

// LoadLedger keeps the active requests and active (estimated prompt) tokens of every
// target of a pool in one shared-data key, so a decision reads the whole pool's load
// with one host call. Load is counted in time slots of lease/ledgerSlots: a request
// adds to the slot of its start time and its release takes from that same slot, and
// slots older than the lease are dropped. So a completion that never arrives (a VM
// restart, a lost stream) stops counting after lease_ms, give or take one slot.
//
// The ledger remembers the value and CAS token of its last read, and tries the next
// update against them before reading again: a decision reads the ledger anyway, so
// its update is then a single write. (After a write the token is unknown — Envoy's
// tokens come from one counter for all keys — so the next update reads first.)
type LoadLedger struct {
	store   Store
	key     string
	retries int
	slotMS  int64

	cached    []byte // the value last read or written, with its CAS token
	cachedCAS uint32
}

const (
	ledgerFormat = 1
	ledgerSlots  = 8
	// per target: id(8) slot count(1); per slot: epoch(8) requests(4) tokens(8)
	ledgerTargetHeader = 9
	ledgerSlotBytes    = 20
)

// Load is one target's current load.
type Load struct {
	Requests int64
	Tokens   int64
}

// LoadTicket is what a request must hand back, exactly once, to release its load.
type LoadTicket struct {
	Target uint64
	Epoch  int64
	Tokens int64
	Valid  bool
}

// LoadChange is what a ledger change leaves behind: the target's load and the pool's
// active requests.
type LoadChange struct {
	Target        Load
	TotalRequests int64
}

// NewLoadLedger returns the ledger of one pool.
func NewLoadLedger(s Store, namespace, pool string, leaseMS int64, retries int) *LoadLedger {
	slot := leaseMS / ledgerSlots
	if slot < 1 {
		slot = 1
	}
	return &LoadLedger{store: s, key: namespace + "/load/" + pool, retries: retries, slotMS: slot}
}

// ledgerSlot is one time slot of one target.
type ledgerSlot struct {
	epoch    int64
	requests int64
	tokens   int64
}

// ledgerEntry is one target's live slots.
type ledgerEntry struct {
	target uint64
	slots  []ledgerSlot
}

func (e *ledgerEntry) load() Load {
	var l Load
	for _, s := range e.slots {
		l.Requests += s.requests
		l.Tokens += s.tokens
	}
	return l
}

func (l *LoadLedger) oldestLiveEpoch(nowMS int64) int64 { return nowMS/l.slotMS - ledgerSlots }

// decodeLedger reads the live slots of every target; a value of another format (or a
// torn one) reads as empty, so the ledger starts afresh.
func decodeLedger(v []byte, oldest int64) []ledgerEntry {
	if len(v) < 1 || v[0] != ledgerFormat {
		return nil
	}
	v = v[1:]
	var out []ledgerEntry
	for len(v) >= ledgerTargetHeader {
		e := ledgerEntry{target: binary.LittleEndian.Uint64(v)}
		n := int(v[8])
		v = v[ledgerTargetHeader:]
		if len(v) < n*ledgerSlotBytes {
			return nil
		}
		for i := 0; i < n; i++ {
			s := ledgerSlot{
				epoch:    int64(binary.LittleEndian.Uint64(v)),
				requests: int64(binary.LittleEndian.Uint32(v[8:])),
				tokens:   int64(binary.LittleEndian.Uint64(v[12:])),
			}
			v = v[ledgerSlotBytes:]
			if s.epoch > oldest && (s.requests > 0 || s.tokens > 0) {
				e.slots = append(e.slots, s)
			}
		}
		if len(e.slots) > 0 {
			out = append(out, e)
		}
	}
	return out
}

func encodeLedger(entries []ledgerEntry) []byte {
	size := 1
	for _, e := range entries {
		size += ledgerTargetHeader + len(e.slots)*ledgerSlotBytes
	}
	out := make([]byte, 1, size)
	out[0] = ledgerFormat
	for _, e := range entries {
		live := 0
		for _, s := range e.slots {
			if s.requests > 0 || s.tokens > 0 {
				live++
			}
		}
		if live == 0 {
			continue
		}
		out = binary.LittleEndian.AppendUint64(out, e.target)
		out = append(out, byte(live))
		for _, s := range e.slots {
			if s.requests > 0 || s.tokens > 0 {
				out = binary.LittleEndian.AppendUint64(out, uint64(s.epoch))
				out = binary.LittleEndian.AppendUint32(out, uint32(s.requests))
				out = binary.LittleEndian.AppendUint64(out, uint64(s.tokens))
			}
		}
	}
	return out
}

// LoadsInto reads the ledger and adds each target's live load to dst[index(id)], for
// targets index knows (index returns -1 for others), without allocating.
func (l *LoadLedger) LoadsInto(nowMS int64, index func(uint64) int, dst []Load) error {
	v, cas, err := l.store.Get(l.key)
	if err == ErrNotFound {
		l.cached, l.cachedCAS = nil, 0
		return nil
	}
	if err != nil {
		return err
	}
	l.cached, l.cachedCAS = v, cas
	if len(v) < 1 || v[0] != ledgerFormat {
		return nil
	}
	oldest := l.oldestLiveEpoch(nowMS)
	for v = v[1:]; len(v) >= ledgerTargetHeader; {
		i := index(binary.LittleEndian.Uint64(v))
		n := int(v[8])
		v = v[ledgerTargetHeader:]
		if len(v) < n*ledgerSlotBytes {
			return nil
		}
		for ; n > 0; n-- {
			if i >= 0 && int64(binary.LittleEndian.Uint64(v)) > oldest {
				dst[i].Requests += int64(binary.LittleEndian.Uint32(v[8:]))
				dst[i].Tokens += int64(binary.LittleEndian.Uint64(v[12:]))
			}
			v = v[ledgerSlotBytes:]
		}
	}
	return nil
}

// Snapshot returns the live load of every target that has any.
func (l *LoadLedger) Snapshot(nowMS int64) (map[uint64]Load, error) {
	v, cas, err := l.store.Get(l.key)
	if err == ErrNotFound {
		l.cached, l.cachedCAS = nil, 0
		return map[uint64]Load{}, nil
	}
	if err != nil {
		return nil, err
	}
	l.cached, l.cachedCAS = v, cas
	entries := decodeLedger(v, l.oldestLiveEpoch(nowMS))
	out := make(map[uint64]Load, len(entries))
	for i := range entries {
		out[entries[i].target] = entries[i].load()
	}
	return out, nil
}

// change applies fn to one target's slots under compare-and-swap, trying the cached
// value first.
func (l *LoadLedger) change(target uint64, nowMS int64, fn func(slots []ledgerSlot) []ledgerSlot) (LoadChange, error) {
	oldest := l.oldestLiveEpoch(nowMS)
	apply := func(old []byte) ([]byte, LoadChange) {
		entries := decodeLedger(old, oldest)
		i := 0
		for i < len(entries) && entries[i].target != target {
			i++
		}
		if i == len(entries) {
			entries = append(entries, ledgerEntry{target: target})
		}
		entries[i].slots = fn(entries[i].slots)
		c := LoadChange{Target: entries[i].load()}
		for j := range entries {
			c.TotalRequests += entries[j].load().Requests
		}
		return encodeLedger(entries), c
	}
	if l.cached != nil || l.cachedCAS != 0 {
		next, c := apply(l.cached)
		err := l.store.Set(l.key, next, l.cachedCAS)
		l.cached, l.cachedCAS = nil, 0
		if err == nil {
			return c, nil
		} else if err != ErrCASMismatch {
			return LoadChange{}, err
		}
	}
	for attempt := 0; attempt <= l.retries; attempt++ {
		old, cas, err := l.store.Get(l.key)
		if err == ErrNotFound {
			old, cas = nil, 0
		} else if err != nil {
			return LoadChange{}, err
		}
		next, c := apply(old)
		err = l.store.Set(l.key, next, cas)
		if err == nil {
			return c, nil
		}
		if err != ErrCASMismatch {
			return LoadChange{}, err
		}
	}
	return LoadChange{}, ErrStateConflict
}

// Acquire adds one request of tokens to target and returns its ticket and the load
// afterwards.
func (l *LoadLedger) Acquire(target uint64, tokens int64, nowMS int64) (LoadTicket, LoadChange, error) {
	epoch := nowMS / l.slotMS
	c, err := l.change(target, nowMS, func(slots []ledgerSlot) []ledgerSlot {
		for i := range slots {
			if slots[i].epoch == epoch {
				slots[i].requests++
				slots[i].tokens += tokens
				return slots
			}
		}
		return append(slots, ledgerSlot{epoch: epoch, requests: 1, tokens: tokens})
	})
	if err != nil {
		return LoadTicket{}, LoadChange{}, err
	}
	return LoadTicket{Target: target, Epoch: epoch, Tokens: tokens, Valid: true}, c, nil
}

// Release takes a ticket's load back from the slot it was added to. A ticket whose
// slot has expired releases nothing: the lease already dropped it.
func (l *LoadLedger) Release(t LoadTicket, nowMS int64) (LoadChange, error) {
	return l.change(t.Target, nowMS, func(slots []ledgerSlot) []ledgerSlot {
		for i := range slots {
			if slots[i].epoch == t.Epoch {
				slots[i].requests = max(0, slots[i].requests-1)
				slots[i].tokens = max(0, slots[i].tokens-t.Tokens)
			}
		}
		return slots
	})
}

// Sweep rewrites the ledger without its expired slots. Reads already ignore them;
// the sweep keeps the stored value small.
func (l *LoadLedger) Sweep(nowMS int64) error {
	return update(l.store, l.key, l.retries, func(old []byte) ([]byte, bool) {
		if old == nil {
			return nil, false
		}
		next := encodeLedger(decodeLedger(old, l.oldestLiveEpoch(nowMS)))
		return next, len(next) != len(old)
	})
}
