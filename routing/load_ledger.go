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
type LoadLedger struct {
	store   Store
	key     string
	retries int
	slotMS  int64
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

// ledgerRecord is the decoded ledger: per target id, its live slots.
type ledgerRecord map[uint64][]ledgerSlot

func (l *LoadLedger) oldestLiveEpoch(nowMS int64) int64 { return nowMS/l.slotMS - ledgerSlots }

func decodeLedger(v []byte, oldest int64) ledgerRecord {
	rec := ledgerRecord{}
	if len(v) < 1 || v[0] != ledgerFormat {
		return rec
	}
	v = v[1:]
	for len(v) >= ledgerTargetHeader {
		id := binary.LittleEndian.Uint64(v)
		n := int(v[8])
		v = v[ledgerTargetHeader:]
		if len(v) < n*ledgerSlotBytes {
			return ledgerRecord{} // torn or foreign value: start afresh
		}
		var slots []ledgerSlot
		for i := 0; i < n; i++ {
			s := ledgerSlot{
				epoch:    int64(binary.LittleEndian.Uint64(v)),
				requests: int64(binary.LittleEndian.Uint32(v[8:])),
				tokens:   int64(binary.LittleEndian.Uint64(v[12:])),
			}
			v = v[ledgerSlotBytes:]
			if s.epoch > oldest && (s.requests > 0 || s.tokens > 0) {
				slots = append(slots, s)
			}
		}
		if len(slots) > 0 {
			rec[id] = slots
		}
	}
	return rec
}

func encodeLedger(rec ledgerRecord) []byte {
	size := 1
	for _, slots := range rec {
		size += ledgerTargetHeader + len(slots)*ledgerSlotBytes
	}
	out := make([]byte, 1, size)
	out[0] = ledgerFormat
	for id, slots := range rec {
		if len(slots) == 0 {
			continue
		}
		out = binary.LittleEndian.AppendUint64(out, id)
		out = append(out, byte(len(slots)))
		for _, s := range slots {
			out = binary.LittleEndian.AppendUint64(out, uint64(s.epoch))
			out = binary.LittleEndian.AppendUint32(out, uint32(s.requests))
			out = binary.LittleEndian.AppendUint64(out, uint64(s.tokens))
		}
	}
	return out
}

// Snapshot returns the live load of every target that has any.
func (l *LoadLedger) Snapshot(nowMS int64) (map[uint64]Load, error) {
	v, _, err := l.store.Get(l.key)
	if err == ErrNotFound {
		return map[uint64]Load{}, nil
	}
	if err != nil {
		return nil, err
	}
	return sumLedger(decodeLedger(v, l.oldestLiveEpoch(nowMS))), nil
}

func sumLedger(rec ledgerRecord) map[uint64]Load {
	out := make(map[uint64]Load, len(rec))
	for id, slots := range rec {
		var ld Load
		for _, s := range slots {
			ld.Requests += s.requests
			ld.Tokens += s.tokens
		}
		out[id] = ld
	}
	return out
}

// LoadChange is what a ledger change leaves behind: the target's load and the pool's
// active requests, for gauges.
type LoadChange struct {
	Target        Load
	TotalRequests int64
}

func changeOf(rec ledgerRecord, target uint64) LoadChange {
	c := LoadChange{Target: sumSlots(rec[target])}
	for _, slots := range rec {
		c.TotalRequests += sumSlots(slots).Requests
	}
	return c
}

// Acquire adds one request of tokens to target and returns its ticket and the load
// afterwards.
func (l *LoadLedger) Acquire(target uint64, tokens int64, nowMS int64) (LoadTicket, LoadChange, error) {
	epoch := nowMS / l.slotMS
	var after LoadChange
	err := update(l.store, l.key, l.retries, func(old []byte) ([]byte, bool) {
		rec := decodeLedger(old, l.oldestLiveEpoch(nowMS))
		slots := rec[target]
		found := false
		for i := range slots {
			if slots[i].epoch == epoch {
				slots[i].requests++
				slots[i].tokens += tokens
				found = true
			}
		}
		if !found {
			slots = append(slots, ledgerSlot{epoch: epoch, requests: 1, tokens: tokens})
		}
		rec[target] = slots
		after = changeOf(rec, target)
		return encodeLedger(rec), true
	})
	if err != nil {
		return LoadTicket{}, LoadChange{}, err
	}
	return LoadTicket{Target: target, Epoch: epoch, Tokens: tokens, Valid: true}, after, nil
}

func sumSlots(slots []ledgerSlot) Load {
	var ld Load
	for _, s := range slots {
		ld.Requests += s.requests
		ld.Tokens += s.tokens
	}
	return ld
}

// Release takes a ticket's load back from the slot it was added to. A ticket whose
// slot has expired releases nothing: the sweep already dropped it.
func (l *LoadLedger) Release(t LoadTicket, nowMS int64) (LoadChange, error) {
	var after LoadChange
	err := update(l.store, l.key, l.retries, func(old []byte) ([]byte, bool) {
		rec := decodeLedger(old, l.oldestLiveEpoch(nowMS))
		slots := rec[t.Target]
		for i := range slots {
			if slots[i].epoch == t.Epoch {
				slots[i].requests = max(0, slots[i].requests-1)
				slots[i].tokens = max(0, slots[i].tokens-t.Tokens)
			}
		}
		rec[t.Target] = slots
		after = changeOf(rec, t.Target)
		return encodeLedger(rec), true
	})
	return after, err
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
