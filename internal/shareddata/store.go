// Package shareddata is routing.Store over proxy-wasm shared data: one store for
// every VM of the same vm_id in an Envoy. The filter keeps its state in it; the soak
// and the filter tests read the emulator's shared data through it.
package shareddata

import (
	"github.com/kvroute/kvroute/routing/state"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

// Store is routing.Store over the host's shared data.
type Store struct{}

func (Store) Get(key string) ([]byte, uint32, error) {
	v, cas, err := proxywasm.GetSharedData(key)
	switch err {
	case nil:
		return v, cas, nil
	case types.ErrorStatusNotFound:
		return nil, 0, state.ErrNotFound
	}
	return nil, 0, err
}

func (Store) Set(key string, value []byte, cas uint32) error {
	err := proxywasm.SetSharedData(key, value, cas)
	if err == types.ErrorStatusCasMismatch {
		return state.ErrCASMismatch
	}
	return err
}
