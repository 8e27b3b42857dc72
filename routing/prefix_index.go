package routing

import (
	"encoding/binary"
	"math/bits"
	"strconv"
)

// PrefixIndex remembers which targets recently served which prompt prefixes, in
// shared data, so that a request meets the target that holds its prefix's KV cache.
//
// Design. A prompt is hashed as one chain of blocks (HashCheckpoints) and only its
// checkpoints are stored: every block count up to 16, then 8 per octave, plus the
// prompt's last full block — 16 + 8·log2(n/16) + 1 entries for n blocks. Each entry
// (a checkpoint hash and its 4 most recent targets) lives in the bucket its own hash
// picks. Recording a prompt refreshes all its checkpoints, so within one lineage an
// earlier checkpoint is never older than a later one: "some target holds checkpoint
// i" is monotone in i, and a lookup binary-searches the checkpoints, one bucket read
// a probe — O(log log n) reads; a few more rounds find targets that hold shorter
// prefixes. Recording costs one read per checkpoint and a write only where the entry
// changes: O(log n) operations. Because checkpoints are chain hashes, a reported match
// is never longer than the true longest common prefix with a recorded prompt;
// because the grid has 8 points per octave, it is never shorter than 7/8 of it.
//
// Targets are kept as the low 32 bits of their id. Buckets are a fixed set of
// capacity_blocks/8 keys of at most 8 entries in most-recently-used order, so the
// index holds at most capacity_blocks entries and evicts approximately
// least-recently-used.
type PrefixIndex struct {
	store   Store
	prefix  string
	buckets uint64
	retries int
}

const (
	prefixFormat          = 1
	prefixBucketEntries   = 8
	prefixTargetsPerEntry = 4
	prefixEntryBytes      = 8 + 4*prefixTargetsPerEntry
)

// NewPrefixIndex returns the index of one pool.
func NewPrefixIndex(s Store, namespace, pool string, capacityBlocks, retries int) *PrefixIndex {
	n := capacityBlocks / prefixBucketEntries
	if n < 1 {
		n = 1
	}
	return &PrefixIndex{store: s, prefix: namespace + "/prefix/" + pool + "/", buckets: uint64(n), retries: retries}
}

func (x *PrefixIndex) key(hash uint64) string {
	hi, _ := bits.Mul64(hash, x.buckets)
	return x.prefix + strconv.FormatUint(hi, 36)
}

// bucket is a decoded bucket value: entries of prefixEntryBytes, most recent first.
type bucket []byte

func decodeBucket(v []byte) bucket {
	if len(v) < 1 || v[0] != prefixFormat || (len(v)-1)%prefixEntryBytes != 0 {
		return nil
	}
	return bucket(v[1:])
}

func (b bucket) len() int { return len(b) / prefixEntryBytes }

func (b bucket) entry(i int) []byte { return b[i*prefixEntryBytes : (i+1)*prefixEntryBytes] }

// find returns the index of the entry for hash, or -1.
func (b bucket) find(hash uint64) int {
	for i := 0; i < b.len(); i++ {
		if binary.LittleEndian.Uint64(b.entry(i)) == hash {
			return i
		}
	}
	return -1
}

// target returns target slot s of entry i (0 means empty).
func (b bucket) target(i, s int) uint32 {
	return binary.LittleEndian.Uint32(b.entry(i)[8+4*s:])
}

// PrefixMatch says how many leading blocks of a prompt a target holds.
type PrefixMatch struct {
	Target uint32 // low 32 bits of the target id
	Blocks int
}

// maxMatchRounds bounds the binary searches of one lookup: the first finds the
// deepest match of any target, each further one the deepest of targets not found yet.
const maxMatchRounds = 4

// Match looks the prompt's checkpoints up and returns the matched block count of each
// target found. known says whether a 32-bit target id is one the pool still has;
// others are ignored.
func (x *PrefixIndex) Match(cps []Checkpoint, known func(uint32) bool) ([]PrefixMatch, error) {
	if len(cps) == 0 {
		return nil, nil
	}
	var found []PrefixMatch
	isFound := func(t uint32) bool {
		for _, m := range found {
			if m.Target == t {
				return true
			}
		}
		return false
	}
	// Reads are remembered by checkpoint index: later rounds probe some again.
	var cache [8]struct {
		i int
		b bucket
	}
	cached := 0
	read := func(i int) (bucket, int, error) {
		for c := 0; c < cached; c++ {
			if cache[c].i == i {
				return cache[c].b, cache[c].b.find(cps[i].Hash), nil
			}
		}
		v, _, err := x.store.Get(x.key(cps[i].Hash))
		if err != nil && err != ErrNotFound {
			return nil, -1, err
		}
		b := decodeBucket(v)
		cache[cached%len(cache)].i, cache[cached%len(cache)].b = i, b
		if cached < len(cache) {
			cached++
		}
		return b, b.find(cps[i].Hash), nil
	}
	hi := len(cps) // search checkpoints [0, hi)
	for round := 0; round < maxMatchRounds && hi > 0; round++ {
		lo, top := 0, -1
		var topBucket bucket
		topEntry := -1
		for lo < hi {
			mid := (lo + hi) / 2
			b, e, err := read(mid)
			if err != nil {
				return nil, err
			}
			fresh := false
			for s := 0; e >= 0 && s < prefixTargetsPerEntry; s++ {
				if t := b.target(e, s); t != 0 && known(t) && !isFound(t) {
					fresh = true
					break
				}
			}
			if fresh {
				top, topBucket, topEntry, lo = mid, b, e, mid+1
			} else {
				hi = mid
			}
		}
		if top < 0 {
			break
		}
		for s := 0; s < prefixTargetsPerEntry; s++ {
			if t := topBucket.target(topEntry, s); t != 0 && known(t) && !isFound(t) {
				found = append(found, PrefixMatch{Target: t, Blocks: cps[top].Pos})
			}
		}
		hi = top // targets not found yet hold less: look below
	}
	return found, nil
}

// Record stores the prompt's checkpoints against target: a read per checkpoint, and
// a write where the entry is missing, names another target first, or has drifted
// into the older half of its bucket.
func (x *PrefixIndex) Record(cps []Checkpoint, target uint64) error {
	t32 := uint32(target)
	if t32 == 0 {
		t32 = 1 // 0 marks an empty slot
	}
	for _, cp := range cps {
		err := update(x.store, x.key(cp.Hash), x.retries, func(old []byte) ([]byte, bool) {
			b := decodeBucket(old)
			if i := b.find(cp.Hash); i >= 0 && i < prefixBucketEntries/2 && b.target(i, 0) == t32 {
				return nil, false
			}
			return recordEntry(b, cp.Hash, t32), true
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// recordEntry returns a new bucket value with hash at the front, t32 its most recent
// target, followed by the other entries that still fit.
func recordEntry(old bucket, hash uint64, t32 uint32) []byte {
	out := make([]byte, 1, 1+prefixBucketEntries*prefixEntryBytes)
	out[0] = prefixFormat
	out = binary.LittleEndian.AppendUint64(out, hash)
	out = binary.LittleEndian.AppendUint32(out, t32)
	slots := 1
	prev := old.find(hash)
	if prev >= 0 {
		for s := 0; s < prefixTargetsPerEntry && slots < prefixTargetsPerEntry; s++ {
			if t := old.target(prev, s); t != 0 && t != t32 {
				out = binary.LittleEndian.AppendUint32(out, t)
				slots++
			}
		}
	}
	for ; slots < prefixTargetsPerEntry; slots++ {
		out = binary.LittleEndian.AppendUint32(out, 0)
	}
	kept := 1
	for i := 0; i < old.len() && kept < prefixBucketEntries; i++ {
		if i != prev {
			out = append(out, old.entry(i)...)
			kept++
		}
	}
	return out
}
