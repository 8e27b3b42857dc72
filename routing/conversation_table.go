package routing

import (
	"encoding/binary"
	"math/bits"
	"strconv"

	"github.com/kvroute/kvroute/routing/state"
)

// ConversationTable maps conversation fingerprints to targets in shared data. It is a
// fixed set of buckets (keys), each holding up to conversationBucketSize entries in
// most-recently-used order; a full bucket drops its last entry. That is an
// approximate LRU whose footprint is fixed by max_sessions: 16 bytes per entry plus
// one key per 16 entries, and nothing grows with the number of distinct ids seen.
type ConversationTable struct {
	store   state.Store
	prefix  string
	buckets uint64
	retries int
}

const (
	conversationBucketSize = 16
	conversationEntryBytes = 16 // fingerprint, target id
	// A hit in the oldest quarter of its bucket is moved to the front; hits above it
	// are recent enough, which saves a write on most turns (and on three in four of
	// the hits of conversations all equally active: a write costs as much as the
	// rest of a sticky decision in wasm). The entry has four more new conversations'
	// worth of room before it could be dropped.
	conversationPromoteDepth = 12
	conversationFormat       = 1
)

// NewConversationTable sizes the table of one pool for maxSessions entries under
// namespace.
func NewConversationTable(s state.Store, namespace, pool string, maxSessions, retries int) *ConversationTable {
	n := (maxSessions + conversationBucketSize - 1) / conversationBucketSize
	if n < 1 {
		n = 1
	}
	return &ConversationTable{store: s, prefix: namespace + "/conv/" + pool + "/", buckets: uint64(n), retries: retries}
}

func (c *ConversationTable) key(fp uint64) string {
	hi, _ := bits.Mul64(fp, c.buckets)
	return c.prefix + strconv.FormatUint(hi, 36)
}

// bucketEntries returns the entries of a stored bucket, or nil for an absent or
// unknown-format value (which is then rebuilt from scratch).
func bucketEntries(v []byte) []byte {
	if len(v) < 1 || v[0] != conversationFormat || (len(v)-1)%conversationEntryBytes != 0 {
		return nil
	}
	return v[1:]
}

// Lookup returns the target mapped to fp. It refreshes the entry's recency when it has
// drifted deep into its bucket.
func (c *ConversationTable) Lookup(fp uint64) (target uint64, found bool, err error) {
	key := c.key(fp)
	v, cas, err := c.store.Get(key)
	if err == state.ErrNotFound {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	entries := bucketEntries(v)
	for i := 0; i*conversationEntryBytes < len(entries); i++ {
		e := entries[i*conversationEntryBytes:]
		if binary.LittleEndian.Uint64(e) != fp {
			continue
		}
		target = binary.LittleEndian.Uint64(e[8:])
		if i >= conversationPromoteDepth {
			// Best effort: a lost race only leaves the entry where it was.
			_ = c.store.Set(key, promote(v, i), cas)
		}
		return target, true, nil
	}
	return 0, false, nil
}

// promote returns a copy of bucket value v with entry i moved to the front.
func promote(v []byte, i int) []byte {
	out := make([]byte, len(v))
	out[0] = v[0]
	body, src := out[1:], v[1:]
	e := i * conversationEntryBytes
	copy(body, src[e:e+conversationEntryBytes])
	copy(body[conversationEntryBytes:], src[:e])
	copy(body[e+conversationEntryBytes:], src[e+conversationEntryBytes:])
	return out
}

// Record maps fp to target, as the bucket's most recent entry.
func (c *ConversationTable) Record(fp, target uint64) error {
	return state.Update(c.store, c.key(fp), c.retries, func(old []byte) ([]byte, bool) {
		entries := bucketEntries(old)
		next := make([]byte, 1, 1+conversationEntryBytes+len(entries))
		next[0] = conversationFormat
		next = binary.LittleEndian.AppendUint64(next, fp)
		next = binary.LittleEndian.AppendUint64(next, target)
		kept := 1
		for i := 0; i*conversationEntryBytes < len(entries) && kept < conversationBucketSize; i++ {
			e := entries[i*conversationEntryBytes : (i+1)*conversationEntryBytes]
			if binary.LittleEndian.Uint64(e) == fp {
				continue
			}
			next = append(next, e...)
			kept++
		}
		return next, true
	})
}
