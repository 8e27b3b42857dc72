// Package state is what kvroute shares between VMs at its lowest level: the Store
// interface over shared data, the one compare-and-swap update every writer goes
// through, an in-memory Store, and the identities VMs write under.
package state

import (
	"errors"
	"sync"
)

// Store is the small key-value interface kvroute keeps its shared state in. The filter
// implements it over proxy-wasm shared data (one store for every VM of an Envoy);
// MemoryStore implements it for tests and tools. Semantics follow proxy-wasm: Get
// returns the value and a CAS token; Set with cas 0 writes unconditionally, otherwise
// only if the key's token still equals cas. A value returned by Get belongs to the
// store and must not be modified.
type Store interface {
	Get(key string) (value []byte, cas uint32, err error)
	Set(key string, value []byte, cas uint32) error
}

var (
	// ErrNotFound is returned by Get for a key that was never set.
	ErrNotFound = errors.New("kvroute: key not found")
	// ErrCASMismatch is returned by Set when the key changed since it was read.
	ErrCASMismatch = errors.New("kvroute: cas mismatch")
	// ErrStateConflict means an update still conflicted after the configured retries.
	ErrStateConflict = errors.New("kvroute: state update conflicted beyond max_cas_retries")
)

// casAbsent is the token Update writes a key it found absent with. Envoy creates an
// absent key whatever the token, but a token of 0 would also overwrite the key if
// another VM created it since the read, losing that VM's write; a token no live key
// holds makes that a mismatch instead, and the loop reads again.
const casAbsent = 1<<31 - 1

// Update applies fn to the value at key under compare-and-swap, retrying up to
// retries times. fn gets the current value (nil when absent) and returns the new
// value and whether to write at all. A host error other than a CAS mismatch is
// returned at once.
func Update(s Store, key string, retries int, fn func(old []byte) (next []byte, write bool)) error {
	for attempt := 0; attempt <= retries; attempt++ {
		old, cas, err := s.Get(key)
		if err == ErrNotFound {
			old, cas = nil, casAbsent
		} else if err != nil {
			return err
		}
		next, write := fn(old)
		if !write {
			return nil
		}
		err = s.Set(key, next, cas)
		if err == nil {
			return nil
		}
		if err != ErrCASMismatch {
			return err
		}
	}
	return ErrStateConflict
}

// MemoryStore is a Store in process memory, safe for concurrent use. It behaves like
// Envoy's shared data, including CAS tokens that start at 1.
type MemoryStore struct {
	mu   sync.Mutex
	data map[string]memoryEntry
}

type memoryEntry struct {
	value []byte
	cas   uint32
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{data: map[string]memoryEntry{}} }

func (m *MemoryStore) Get(key string) ([]byte, uint32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.data[key]
	if !ok {
		return nil, 0, ErrNotFound
	}
	return append([]byte(nil), e.value...), e.cas, nil
}

func (m *MemoryStore) Set(key string, value []byte, cas uint32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.data[key]
	if ok && cas != 0 && cas != e.cas {
		return ErrCASMismatch
	}
	m.data[key] = memoryEntry{value: append([]byte(nil), value...), cas: e.cas + 1}
	return nil
}

// Footprint returns the number of keys and the bytes of keys plus values held.
func (m *MemoryStore) Footprint() (keys, bytes int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, e := range m.data {
		keys++
		bytes += len(k) + len(e.value)
	}
	return keys, bytes
}

// Keys returns the keys held, in no particular order.
func (m *MemoryStore) Keys() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	keys := make([]string, 0, len(m.data))
	for k := range m.data {
		keys = append(keys, k)
	}
	return keys
}

// FailingStore is a Store that fails the way a broken host does: every Get with GetErr
// and every Set with SetErr when they are set (ErrCASMismatch as SetErr: another VM
// always wins); otherwise it passes through to Inner. Tests of every fail-open path use it.
type FailingStore struct {
	Inner          Store // the store reached when no error is set; nil only if never reached
	GetErr, SetErr error // returned by every Get / Set when non-nil
}

// Get implements Store.
func (s FailingStore) Get(key string) ([]byte, uint32, error) {
	if s.GetErr != nil {
		return nil, 0, s.GetErr
	}
	return s.Inner.Get(key)
}

// Set implements Store.
func (s FailingStore) Set(key string, value []byte, cas uint32) error {
	if s.SetErr != nil {
		return s.SetErr
	}
	return s.Inner.Set(key, value, cas)
}
