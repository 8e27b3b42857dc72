package main

import (
	"reflect"
	"unsafe"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// Helpers of the reliability and security tests that look inside the SDK host
// emulator and the wazero runtime. The emulator has no API to list shared data or to
// read the guest's memory size, so these read unexported fields by reflection (the
// SDK and wazero versions are pinned in go.mod). Each reports ok=false rather than
// panic when a field is not where it was, so a version bump degrades to a skip.

// unexported returns the field name of struct value v, readable even if unexported.
func unexported(v reflect.Value, name string) (reflect.Value, bool) {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return reflect.Value{}, false
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct || !v.CanAddr() {
		return reflect.Value{}, false
	}
	f := v.FieldByName(name)
	if !f.IsValid() {
		return reflect.Value{}, false
	}
	return reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem(), true
}

// allSharedData returns a copy of every shared-data key and value the host holds.
func (h *host) allSharedData() (map[string][]byte, bool) {
	root, ok := unexported(reflect.ValueOf(h.HostEmulator), "rootHostEmulator")
	if !ok {
		return nil, false
	}
	kvs, ok := unexported(root, "sharedDataKVS")
	if !ok || kvs.Kind() != reflect.Map {
		return nil, false
	}
	out := map[string][]byte{}
	iter := kvs.MapRange()
	for iter.Next() {
		data, ok := unexported(iter.Value(), "data")
		if !ok || data.Kind() != reflect.Slice {
			return nil, false
		}
		out[iter.Key().String()] = append([]byte(nil), data.Bytes()...)
	}
	return out, true
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
	rtField, ok := unexported(reflect.ValueOf(vm), "runtime")
	if !ok {
		return 0, false
	}
	if _, isRuntime := rtField.Interface().(wazero.Runtime); !isRuntime {
		return 0, false
	}
	store, ok := unexported(rtField, "store")
	if !ok {
		return 0, false
	}
	m, ok := unexported(store, "moduleList")
	for ok && m.Kind() == reflect.Pointer && !m.IsNil() {
		if mod, isModule := m.Interface().(api.Module); isModule && mod.Memory() != nil {
			if name, _ := unexported(m, "ModuleName"); name.IsValid() && name.String() == "" {
				return uint64(mod.Memory().Size()), true
			}
		}
		m, ok = unexported(m, "next")
	}
	return 0, false
}
