package prefix

import (
	"testing"

	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// emulatorStore behaves like the proxy-wasm SDK's host emulator, which refuses CAS 0
// for a key that exists (Envoy takes it as unconditional).
type emulatorStore struct{ *state.MemoryStore }

func (e emulatorStore) Set(key string, value []byte, cas uint32) error {
	if _, cur, err := e.MemoryStore.Get(key); err == nil && cas != cur {
		return state.ErrCASMismatch
	}
	return e.MemoryStore.Set(key, value, cas)
}

func TestPrefixJournalPublishesUnderEitherCASZeroRule(t *testing.T) {
	for name, store := range map[string]state.Store{"envoy": state.NewMemoryStore(), "emulator": emulatorStore{state.NewMemoryStore()}} {
		t.Run(name, func(t *testing.T) {
			a := NewPrefixIndex(store, "ns", "decode", 1024, 8)
			b := NewPrefixIndex(store, "ns", "decode", 1024, 8)
			all := func(uint32) bool { return true }
			for i := 0; i < 3; i++ { // every tick publishes, not only the first
				p := []byte{byte(i), 1, 2, 3, 4, 5, 6, 7}
				cps, _ := HashCheckpoints("m", p, 8, nil)
				a.Record(cps, uint64(10+i), 0, 0)
				require.NoError(t, a.Sync(int64(1000+10*i), nil))
				require.NoError(t, b.Sync(int64(1001+10*i), nil))
				assert.Len(t, b.Match(cps, all), 1, "tick %d", i)
			}
		})
	}
}
