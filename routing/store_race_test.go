package routing

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// racingStore lets another writer create key between an update's read, which finds
// it absent, and its write.
type racingStore struct {
	*memoryStore
	key   string
	first []byte // what the other writer creates; nil once written
}

func (r *racingStore) Set(key string, value []byte, cas uint32) error {
	if key == r.key && r.first != nil {
		first := r.first
		r.first = nil
		if err := r.memoryStore.Set(key, first, 0); err != nil {
			return err
		}
	}
	return r.memoryStore.Set(key, value, cas)
}

// Two VMs that both find a key absent must not overwrite each other's first write.
func TestUpdateDoesNotOverwriteAKeyCreatedSinceItsRead(t *testing.T) {
	s := &racingStore{memoryStore: newMemoryStore(), key: "k", first: []byte("a")}
	err := update(s, "k", 8, func(old []byte) ([]byte, bool) {
		return append(append([]byte(nil), old...), 'b'), true
	})
	require.NoError(t, err)
	v, _, err := s.Get("k")
	require.NoError(t, err)
	require.Equal(t, "ab", string(v), "the other VM's write is kept and this one applied on top")
}
