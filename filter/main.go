// Command kvroute is the proxy-wasm shell around package routing: it reads requests
// from Envoy, asks the Router for a target and writes the answer into headers.
package main

import (
	"crypto/rand"
	"encoding/binary"

	"github.com/kvroute/kvroute/routing"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

func main() {}

func init() { proxywasm.SetVMContext(&vmContext{}) }

type vmContext struct{ types.DefaultVMContext }

// OnVMStart seeds the VM's identity in the prefix journal from the host's randomness.
func (*vmContext) OnVMStart(int) types.OnVMStartStatus {
	var b [8]byte
	if _, err := rand.Read(b[:]); err == nil {
		seed := binary.LittleEndian.Uint64(b[:])
		routing.SetVMIdentitySeed(seed)
		vmID = seed | 1
	}
	return types.OnVMStartStatusOK
}

func (*vmContext) NewPluginContext(contextID uint32) types.PluginContext {
	return &pluginContext{}
}
