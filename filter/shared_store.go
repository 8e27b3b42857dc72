package main

import (
	"github.com/kvroute/kvroute/routing"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

// sharedStore is routing.Store over proxy-wasm shared data: one store for every VM
// of the same vm_id in an Envoy.
type sharedStore struct{}

func (sharedStore) Get(key string) ([]byte, uint32, error) {
	v, cas, err := proxywasm.GetSharedData(key)
	switch err {
	case nil:
		return v, cas, nil
	case types.ErrorStatusNotFound:
		return nil, 0, routing.ErrNotFound
	}
	return nil, 0, err
}

func (sharedStore) Set(key string, value []byte, cas uint32) error {
	err := proxywasm.SetSharedData(key, value, cas)
	if err == types.ErrorStatusCasMismatch {
		return routing.ErrCASMismatch
	}
	return err
}
