package prefix

import (
	"encoding/binary"
	"strconv"

	"github.com/kvroute/kvroute/routing/state"
)

// prefixJournal carries prefix-index records between the VMs of one Envoy through
// shared data. Each VM claims one of journalSlots slots in a registry key and
// publishes, once a tick, what it recorded since its last tick as one chunk in its
// slot's ring of journalRing chunks (plus a head key naming the newest chunk). Every
// tick each VM reads the registry and the other slots' heads and applies the chunks
// it has not seen yet. A VM
// that falls more than a ring behind skips what it missed; its table refills from
// traffic. The footprint is fixed: journalSlots × (journalRing + 1) keys of at most
// journalMaxEntries entries each, plus the registry.
type prefixJournal struct {
	store   state.Store
	prefix  string
	retries int

	vmid         uint64
	slot         int // -1 until claimed
	seq          uint64
	lastRegister int64
	registry     []journalSlot // as last read
	peers        [journalSlots]journalPeer
	outbox       []journalRecord // queued for the next publish
}

// journalRecord is one queued record; it is encoded (hash(8) target(4)) only when
// published, as appending bytes one record at a time is slow in wasm.
type journalRecord struct {
	hash uint64
	t32  uint32
}

const (
	journalFormat      = 1
	journalSlots       = 64
	journalRing        = 16
	journalEntryBytes  = 12
	journalMaxEntries  = 8192
	journalSlotTTLms   = 30_000 // a slot whose VM has not been seen for this long is free
	journalRegisterMS  = 1_000  // how often a VM renews its slot
	journalHeaderBytes = 1 + 8 + 8
)

type journalSlot struct {
	vmid     uint64
	lastSeen int64
}

// journalPeer is how far this VM has read another slot.
type journalPeer struct {
	vmid uint64
	seq  uint64
}

func newPrefixJournal(s state.Store, namespace, pool string, retries int) *prefixJournal {
	return &prefixJournal{store: s, prefix: namespace + "/pj/" + pool + "/", retries: retries,
		vmid: state.NewVMIdentity(), slot: -1}
}

// queue adds one record for the other VMs; a full outbox drops its oldest half (those
// records stay in this VM's table, the others learn them from traffic).
func (j *prefixJournal) queue(hash uint64, t32 uint32) {
	if len(j.outbox) >= journalMaxEntries {
		j.outbox = append(j.outbox[:0], j.outbox[len(j.outbox)/2:]...)
	}
	j.outbox = append(j.outbox, journalRecord{hash, t32})
}

func (j *prefixJournal) slotKey(slot int, name string) string {
	return j.prefix + strconv.Itoa(slot) + "/" + name
}

// sync registers, publishes and pulls; apply receives the other VMs' records.
func (j *prefixJournal) sync(nowMS int64, apply func(hash uint64, t32 uint32)) error {
	if j.slot < 0 || nowMS-j.lastRegister >= journalRegisterMS || nowMS < j.lastRegister {
		if err := j.register(nowMS); err != nil {
			return err
		}
	} else if err := j.readRegistry(); err != nil {
		return err
	}
	if j.slot < 0 {
		j.outbox = j.outbox[:0] // every slot is taken: share nothing rather than grow
	} else if err := j.publish(); err != nil {
		return err
	}
	return j.pull(nowMS, apply)
}

func decodeRegistry(v []byte) []journalSlot {
	out := make([]journalSlot, journalSlots)
	if len(v) != 1+journalSlots*16 || v[0] != journalFormat {
		return out
	}
	for i := range out {
		out[i].vmid = binary.LittleEndian.Uint64(v[1+16*i:])
		out[i].lastSeen = int64(binary.LittleEndian.Uint64(v[9+16*i:]))
	}
	return out
}

func encodeRegistry(slots []journalSlot) []byte {
	out := make([]byte, 1, 1+journalSlots*16)
	out[0] = journalFormat
	for _, s := range slots {
		out = binary.LittleEndian.AppendUint64(out, s.vmid)
		out = binary.LittleEndian.AppendUint64(out, uint64(s.lastSeen))
	}
	return out
}

// readRegistry refreshes this VM's view of the other slots.
func (j *prefixJournal) readRegistry() error {
	v, _, err := j.store.Get(j.prefix + "slots")
	if err != nil && err != state.ErrNotFound {
		return err
	}
	j.registry = decodeRegistry(v)
	return nil
}

// register claims (or renews) this VM's slot and refreshes its view of the others.
func (j *prefixJournal) register(nowMS int64) error {
	claimed := -1
	err := state.Update(j.store, j.prefix+"slots", j.retries, func(old []byte) ([]byte, bool) {
		slots := decodeRegistry(old)
		claimed = -1
		for i := range slots {
			if slots[i].vmid == j.vmid {
				claimed = i
				break
			}
		}
		if claimed < 0 {
			for i := range slots {
				if slots[i].vmid == 0 || nowMS-slots[i].lastSeen > journalSlotTTLms {
					claimed = i
					break
				}
			}
		}
		if claimed >= 0 {
			slots[claimed] = journalSlot{vmid: j.vmid, lastSeen: nowMS}
		}
		j.registry = slots
		return encodeRegistry(slots), claimed >= 0
	})
	if err != nil {
		return err
	}
	if claimed != j.slot {
		j.seq = 0 // a new slot: its ring restarts for this VM
	}
	j.slot, j.lastRegister = claimed, nowMS
	return nil
}

func (j *prefixJournal) publish() error {
	if len(j.outbox) == 0 {
		return nil
	}
	j.seq++
	chunk := make([]byte, journalHeaderBytes+len(j.outbox)*journalEntryBytes)
	chunk[0] = journalFormat
	binary.LittleEndian.PutUint64(chunk[1:], j.vmid)
	binary.LittleEndian.PutUint64(chunk[9:], j.seq)
	for i, r := range j.outbox {
		// A fixed-size window: one bounds check a record.
		e := (*[journalEntryBytes]byte)(chunk[journalHeaderBytes+i*journalEntryBytes:])
		binary.LittleEndian.PutUint64(e[:8], r.hash)
		binary.LittleEndian.PutUint32(e[8:], r.t32)
	}
	if err := j.overwrite(j.slotKey(j.slot, strconv.FormatUint(j.seq%journalRing, 10)), chunk); err != nil {
		return err
	}
	if err := j.overwrite(j.slotKey(j.slot, "head"), chunk[:journalHeaderBytes]); err != nil {
		return err
	}
	j.outbox = j.outbox[:0]
	return nil
}

// overwrite writes a key that this VM alone writes. CAS 0 means "unconditional" to
// Envoy (proxy-wasm-cpp-host's shared data), but the SDK's host emulator refuses it
// for a key that exists; then the key's current token is read and used.
func (j *prefixJournal) overwrite(key string, value []byte) error {
	err := j.store.Set(key, value, 0)
	if err != state.ErrCASMismatch {
		return err
	}
	_, cas, err := j.store.Get(key)
	if err != nil && err != state.ErrNotFound {
		return err
	}
	return j.store.Set(key, value, cas)
}

// readHeader decodes a chunk's or head's (vmid, seq), ok=false for another format.
func readHeader(v []byte) (vmid, seq uint64, ok bool) {
	if len(v) < journalHeaderBytes || v[0] != journalFormat {
		return 0, 0, false
	}
	return binary.LittleEndian.Uint64(v[1:]), binary.LittleEndian.Uint64(v[9:]), true
}

func (j *prefixJournal) pull(nowMS int64, apply func(hash uint64, t32 uint32)) error {
	for i, s := range j.registry {
		if i == j.slot || s.vmid == 0 || nowMS-s.lastSeen > journalSlotTTLms {
			continue
		}
		v, _, err := j.store.Get(j.slotKey(i, "head"))
		if err == state.ErrNotFound {
			continue
		} else if err != nil {
			return err
		}
		vmid, head, ok := readHeader(v)
		if !ok {
			continue
		}
		p := &j.peers[i]
		if p.vmid != vmid {
			// A VM we have not read yet: replay what its ring still holds.
			*p = journalPeer{vmid: vmid}
			if head > journalRing {
				p.seq = head - journalRing
			}
		}
		if head <= p.seq {
			continue
		}
		if head-p.seq > journalRing {
			p.seq = head - journalRing // fell behind: skip what the ring lost
		}
		for seq := p.seq + 1; seq <= head; seq++ {
			v, _, err := j.store.Get(j.slotKey(i, strconv.FormatUint(seq%journalRing, 10)))
			if err == state.ErrNotFound {
				continue
			} else if err != nil {
				return err
			}
			cv, cs, ok := readHeader(v)
			if !ok || cv != vmid || cs != seq {
				continue // overwritten or torn: skip it
			}
			for e := v[journalHeaderBytes:]; len(e) >= journalEntryBytes; e = e[journalEntryBytes:] {
				apply(binary.LittleEndian.Uint64(e), binary.LittleEndian.Uint32(e[8:]))
			}
		}
		p.seq = head
	}
	return nil
}
