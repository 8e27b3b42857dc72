package state

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// racingStore lets another writer create key between an update's read, which finds
// it absent, and its write.
type racingStore struct {
	*MemoryStore
	key   string
	first []byte // what the other writer creates; nil once written
}

func (r *racingStore) Set(key string, value []byte, cas uint32) error {
	if key == r.key && r.first != nil {
		first := r.first
		r.first = nil
		if err := r.MemoryStore.Set(key, first, 0); err != nil {
			return err
		}
	}
	return r.MemoryStore.Set(key, value, cas)
}

// Two VMs that both find a key absent must not overwrite each other's first write.
func TestUpdateDoesNotOverwriteAKeyCreatedSinceItsRead(t *testing.T) {
	s := &racingStore{MemoryStore: NewMemoryStore(), key: "k", first: []byte("a")}
	err := Update(s, "k", 8, func(old []byte) ([]byte, bool) {
		return append(append([]byte(nil), old...), 'b'), true
	})
	require.NoError(t, err)
	v, _, err := s.Get("k")
	require.NoError(t, err)
	require.Equal(t, "ab", string(v), "the other VM's write is kept and this one applied on top")
}
