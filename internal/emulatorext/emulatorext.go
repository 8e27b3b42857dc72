// Package emulatorext reaches into the proxy-wasm SDK's host emulator for what Envoy
// does and the emulator's API lacks: it never calls a guest's proxy_on_delete when a
// stream ends, keeps every finished stream, and cannot list shared data or report
// the guest's memory. The benchmarks and the soak use it so that a long run
// measures the filter, not the emulator's leftovers.
//
// It reads unexported fields by reflection (the SDK and wazero versions are pinned
// in go.mod); every accessor reports ok=false if a field moved.
package emulatorext

import (
	"context"
	"errors"
	"reflect"
	"unsafe"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

func field(v reflect.Value, name string) (reflect.Value, bool) {
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

// SharedData returns a copy of every shared-data key and value the host holds.
func SharedData(emu proxytest.HostEmulator) (map[string][]byte, bool) {
	kvs, ok := field(reflect.ValueOf(emu), "rootHostEmulator")
	if ok {
		kvs, ok = field(kvs, "sharedDataKVS")
	}
	if !ok || kvs.Kind() != reflect.Map {
		return nil, false
	}
	out := map[string][]byte{}
	for it := kvs.MapRange(); it.Next(); {
		data, ok := field(it.Value(), "data")
		if !ok || data.Kind() != reflect.Slice {
			return nil, false
		}
		out[it.Key().String()] = append([]byte(nil), data.Bytes()...)
	}
	return out, true
}

// StreamEnds finishes streams the way Envoy does after CompleteHttpContext: the
// guest's proxy_on_delete frees its context (a compiled module only: the Go plugin
// has no such export), and the emulator forgets the stream, whose headers and body
// it would otherwise keep for the whole run.
type StreamEnds struct {
	streams  reflect.Value // the emulator's streams by id; invalid if unreachable
	onDelete api.Function  // nil if unreachable
}

// NewStreamEnds finds what it needs in emu and vm. Deletes and Forgets say what it
// found.
func NewStreamEnds(emu proxytest.HostEmulator, vm types.VMContext) *StreamEnds {
	e := &StreamEnds{}
	if s, ok := field(reflect.ValueOf(emu), "httpHostEmulator"); ok {
		if s, ok = field(s, "httpStreams"); ok && s.Kind() == reflect.Map {
			e.streams = s
		}
	}
	if mod, ok := GuestModule(vm); ok {
		e.onDelete = mod.ExportedFunction("proxy_on_delete")
	}
	return e
}

// Deletes reports whether End calls the guest's proxy_on_delete.
func (e *StreamEnds) Deletes() bool { return e.onDelete != nil }

// Forgets reports whether End drops the emulator's record of the stream.
func (e *StreamEnds) Forgets() bool { return e.streams.IsValid() }

// End finishes stream id, after CompleteHttpContext.
func (e *StreamEnds) End(id uint32) error {
	if e.streams.IsValid() {
		e.streams.SetMapIndex(reflect.ValueOf(id), reflect.Value{})
	}
	if e.onDelete != nil {
		_, err := e.onDelete.Call(context.Background(), uint64(id))
		return err
	}
	return nil
}

// GuestModule returns the compiled filter's module instance in the emulator's wazero
// runtime (the one anonymous module with a memory).
func GuestModule(vm types.VMContext) (api.Module, bool) {
	rt, ok := field(reflect.ValueOf(vm), "runtime")
	if !ok {
		return nil, false
	}
	if _, isRuntime := rt.Interface().(wazero.Runtime); !isRuntime {
		return nil, false
	}
	store, ok := field(rt, "store")
	if !ok {
		return nil, false
	}
	for m, ok := field(store, "moduleList"); ok && m.Kind() == reflect.Pointer && !m.IsNil(); m, ok = field(m, "next") {
		if mod, isModule := m.Interface().(api.Module); isModule && mod.Memory() != nil {
			if name, _ := field(m, "ModuleName"); name.IsValid() && name.String() == "" {
				return mod, true
			}
		}
	}
	return nil, false
}

// GuestMemory returns the size of the compiled module's linear memory.
func GuestMemory(mod api.Module) uint64 {
	if mod == nil {
		return 0
	}
	return uint64(mod.Memory().Size())
}

// guestExports names the guest export behind each field of the emulator's guestABI.
var guestExports = map[string]string{
	"proxyOnVMStart":          "proxy_on_vm_start",
	"proxyOnContextCreate":    "proxy_on_context_create",
	"proxyOnConfigure":        "proxy_on_configure",
	"proxyOnDone":             "proxy_on_done",
	"proxyOnQueueReady":       "proxy_on_queue_ready",
	"proxyOnTick":             "proxy_on_tick",
	"proxyOnRequestHeaders":   "proxy_on_request_headers",
	"proxyOnRequestBody":      "proxy_on_request_body",
	"proxyOnRequestTrailers":  "proxy_on_request_trailers",
	"proxyOnResponseHeaders":  "proxy_on_response_headers",
	"proxyOnResponseBody":     "proxy_on_response_body",
	"proxyOnResponseTrailers": "proxy_on_response_trailers",
	"proxyOnLog":              "proxy_on_log",
}

// emptyModule is the smallest valid wasm binary: a module with nothing in it.
var emptyModule = []byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00}

// NewWasmVMContextWithWASI is proxytest.NewWasmVMContext with the guest's
// wasi_snapshot_preview1 supplied by instantiateWASI instead of wazero's, which answers
// every call fully: it lets a test run the module against the WASI of a particular
// host. The emulator's own proxy-wasm ABI ("env") serves the guest as usual.
func NewWasmVMContextWithWASI(wasm []byte, instantiateWASI func(context.Context, wazero.Runtime) error) (proxytest.WasmVMContext, error) {
	vm, err := proxytest.NewWasmVMContext(emptyModule)
	if err != nil {
		return nil, err
	}
	rv, ok := field(reflect.ValueOf(vm), "runtime")
	if !ok {
		return nil, errors.New("emulatorext: the emulator's runtime field moved")
	}
	r, ok := rv.Interface().(wazero.Runtime)
	if !ok {
		return nil, errors.New("emulatorext: the emulator's runtime is not a wazero.Runtime")
	}
	cv, ok := field(reflect.ValueOf(vm), "ctx")
	if !ok {
		return nil, errors.New("emulatorext: the emulator's ctx field moved")
	}
	ctx, _ := cv.Interface().(context.Context)
	if ctx == nil {
		ctx = context.Background()
	}
	if wasi := r.Module("wasi_snapshot_preview1"); wasi != nil {
		if err := wasi.Close(ctx); err != nil {
			return nil, err
		}
	}
	if err := instantiateWASI(ctx, r); err != nil {
		return nil, err
	}
	compiled, err := r.CompileModule(ctx, wasm)
	if err != nil {
		return nil, err
	}
	mod, err := r.InstantiateModule(ctx, compiled, wazero.NewModuleConfig().
		WithStartFunctions("_initialize", "_start", "main"))
	if err != nil {
		return nil, err
	}
	abi, ok := field(reflect.ValueOf(vm), "abi")
	if !ok || abi.Kind() != reflect.Struct || abi.NumField() != len(guestExports) {
		return nil, errors.New("emulatorext: the emulator's guest ABI changed")
	}
	for fieldName, export := range guestExports {
		f, ok := field(abi, fieldName)
		if !ok {
			return nil, errors.New("emulatorext: the emulator's guest ABI has no " + fieldName)
		}
		if fn := mod.ExportedFunction(export); fn != nil {
			f.Set(reflect.ValueOf(fn))
		}
	}
	return vm, nil
}
