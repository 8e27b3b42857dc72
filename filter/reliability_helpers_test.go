package main

import (
	"github.com/kvroute/kvroute/internal/emulatorext"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

// Helpers of the reliability and security tests that look inside the SDK host
// emulator and the wazero runtime (through internal/emulatorext, which reads their
// unexported fields). Each reports ok=false rather than panic when a field is not
// where it was, so a version bump degrades to a skip.

// allSharedData returns a copy of every shared-data key and value the host holds.
func (h *host) allSharedData() (map[string][]byte, bool) {
	return emulatorext.SharedData(h.HostEmulator)
}

// allLogs returns every line the plugin logged, at every level.
func (h *host) allLogs() []string {
	var out []string
	for _, get := range []func() []string{h.GetTraceLogs, h.GetDebugLogs, h.GetInfoLogs,
		h.GetWarnLogs, h.GetErrorLogs, h.GetCriticalLogs} {
		out = append(out, get()...)
	}
	return out
}

// guestMemoryBytes returns the size of the compiled module's linear memory, for a
// VMContext made by proxytest.NewWasmVMContext.
func guestMemoryBytes(vm types.VMContext) (uint64, bool) {
	mod, ok := emulatorext.GuestModule(vm)
	return emulatorext.GuestMemory(mod), ok
}
