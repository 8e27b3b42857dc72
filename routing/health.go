package routing

import (
	"encoding/binary"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/state"
)

// HealthBoard keeps passive health per endpoint of a pool in one shared-data key:
// consecutive failures and, once they reach the threshold, the time the endpoint's
// ejection ends. A success clears the count.
//
// Health changes rarely, so each VM reads the key at most once per healthCacheMS and
// otherwise answers from its last read (and its own reports): an ejection made by
// another VM is seen within that time, one made by this VM at once. A success on an
// endpoint the VM knows to be clean writes nothing.
type HealthBoard struct {
	store     state.Store
	key       string
	retries   int
	threshold int
	cooldown  int64

	cached   []healthEntry
	cachedAt int64
	fresh    bool
}

// healthCacheMS bounds how stale a VM's view of other VMs' health reports may be.
const healthCacheMS = 250

const (
	healthFormat     = 1
	healthEntryBytes = 20 // endpoint fingerprint(8) failures(4) ejected-until ms(8)
)

// NewHealthBoard returns the health board of one pool.
func NewHealthBoard(s state.Store, namespace, pool string, cfg config.HealthConfig, retries int) *HealthBoard {
	return &HealthBoard{store: s, key: namespace + "/health/" + pool, retries: retries,
		threshold: cfg.FailureThreshold, cooldown: cfg.CooldownMS}
}

type healthEntry struct {
	endpoint     uint64
	failures     uint32
	ejectedUntil int64
}

func decodeHealth(v []byte) []healthEntry {
	if len(v) < 1 || v[0] != healthFormat || (len(v)-1)%healthEntryBytes != 0 {
		return nil
	}
	v = v[1:]
	out := make([]healthEntry, 0, len(v)/healthEntryBytes)
	for ; len(v) >= healthEntryBytes; v = v[healthEntryBytes:] {
		out = append(out, healthEntry{
			endpoint:     binary.LittleEndian.Uint64(v),
			failures:     binary.LittleEndian.Uint32(v[8:]),
			ejectedUntil: int64(binary.LittleEndian.Uint64(v[12:])),
		})
	}
	return out
}

func encodeHealth(entries []healthEntry) []byte {
	out := make([]byte, 1, 1+len(entries)*healthEntryBytes)
	out[0] = healthFormat
	for _, e := range entries {
		if e.failures == 0 && e.ejectedUntil == 0 {
			continue
		}
		out = binary.LittleEndian.AppendUint64(out, e.endpoint)
		out = binary.LittleEndian.AppendUint32(out, e.failures)
		out = binary.LittleEndian.AppendUint64(out, uint64(e.ejectedUntil))
	}
	return out
}

// entries returns the board as this VM knows it, reading it when the copy is old.
func (h *HealthBoard) entries(nowMS int64) ([]healthEntry, error) {
	if h.cacheFresh(nowMS) {
		return h.cached, nil
	}
	v, _, err := h.store.Get(h.key)
	if err != nil && err != state.ErrNotFound {
		h.fresh = false
		return nil, err
	}
	h.cached, h.cachedAt, h.fresh = decodeHealth(v), nowMS, true
	return h.cached, nil
}

// cleanNow says the VM's copy of the board is recent and empty (no endpoint has a
// record): Ejected would answer nil, and a success would write nothing. It is the
// usual case, asked inline where a call is costly in wasm.
func (h *HealthBoard) cleanNow(nowMS int64) bool {
	return len(h.cached) == 0 && h.cacheFresh(nowMS)
}

// cacheFresh says the VM's copy of the board is recent enough to answer from.
func (h *HealthBoard) cacheFresh(nowMS int64) bool {
	return h.fresh && nowMS-h.cachedAt < healthCacheMS && nowMS >= h.cachedAt
}

// Ejected returns the fingerprints of endpoints ejected at nowMS.
func (h *HealthBoard) Ejected(nowMS int64) (map[uint64]bool, error) {
	entries, err := h.entries(nowMS)
	if err != nil {
		return nil, err
	}
	var out map[uint64]bool
	for _, e := range entries {
		if e.ejectedUntil > nowMS {
			if out == nil {
				out = map[uint64]bool{}
			}
			out[e.endpoint] = true
		}
	}
	return out, nil
}

// knownClean says this VM's recent copy of the board has no record of endpoint.
func (h *HealthBoard) knownClean(endpoint uint64, nowMS int64) bool {
	entries, err := h.entries(nowMS)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if e.endpoint == endpoint {
			return false
		}
	}
	return true
}

// Report records one response of endpoint. It returns true when this failure ejected
// the endpoint (so the caller counts one ejection, once).
func (h *HealthBoard) Report(endpoint uint64, failed bool, nowMS int64) (ejected bool, err error) {
	if !failed && h.knownClean(endpoint, nowMS) {
		return false, nil
	}
	var written []healthEntry
	err = state.Update(h.store, h.key, h.retries, func(old []byte) ([]byte, bool) {
		ejected, written = false, nil
		entries := decodeHealth(old)
		i := 0
		for ; i < len(entries) && entries[i].endpoint != endpoint; i++ {
		}
		if i == len(entries) {
			if !failed {
				return nil, false // healthy and unknown: nothing to write
			}
			entries = append(entries, healthEntry{endpoint: endpoint})
		}
		e := &entries[i]
		if !failed {
			if e.failures == 0 && e.ejectedUntil <= nowMS {
				return nil, false
			}
			e.failures = 0
			if e.ejectedUntil <= nowMS {
				e.ejectedUntil = 0
			}
		} else {
			if e.ejectedUntil > nowMS {
				return nil, false // already out; late failures of in-flight requests don't extend it
			}
			e.failures++
			if int(e.failures) >= h.threshold {
				e.failures = 0
				e.ejectedUntil = nowMS + h.cooldown
				ejected = true
			}
		}
		next := encodeHealth(entries)
		written = decodeHealth(next)
		return next, true
	})
	if err == nil && written != nil {
		h.cached, h.cachedAt, h.fresh = written, nowMS, true
	} else {
		h.fresh = false // read it again next time
	}
	return ejected, err
}
