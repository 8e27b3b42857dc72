// Command kvroute is the proxy-wasm shell around package routing: it reads requests
// from Envoy, asks the Router for a target and writes the answer into headers.
package main

import (
	"crypto/rand"
	"encoding/binary"

	"github.com/kvroute/kvroute/routing/state"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

func main() {}

func init() { proxywasm.SetVMContext(&vmContext{}) }

type vmContext struct{ types.DefaultVMContext }

// OnVMStart seeds the VM's identities in shared state from the host's randomness, so
// that the VMs of one Envoy tell themselves apart, and takes the VM's lease identity.
func (*vmContext) OnVMStart(int) types.OnVMStartStatus {
	var b [8]byte
	if _, err := rand.Read(b[:]); err == nil {
		state.SetVMIdentitySeed(binary.LittleEndian.Uint64(b[:]))
	}
	vmID = state.NewVMIdentity()
	return types.OnVMStartStatusOK
}

func (*vmContext) NewPluginContext(contextID uint32) types.PluginContext {
	return &pluginContext{}
}
