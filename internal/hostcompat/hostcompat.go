// Package hostcompat holds what the oldest proxy-wasm host kvroute supports offers a
// module, so tests can hold the compiled filter to it: the imports it provides, and a
// wasi_snapshot_preview1 for wazero that answers as it does.
//
// That host is proxy-wasm-cpp-host at commit c4d7bb0 (2024-12-19, "add wasi hostcalls
// used by the Go SDK", #427), the host core behind the Go SDK's "Envoy >= 1.33". The
// import list and every answer below are read off its include/proxy-wasm/exports.h
// and src/exports.cc. Hosts from #533 (2026-04-06) on add path_filestat_get and answer
// poll_oneoff with success; releases built before it are what this package models.
package hostcompat

import (
	"bufio"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/binary"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

//go:embed proxy-wasm-cpp-host-c4d7bb0.imports
var importList string

// Imports returns the functions the oldest supported host provides, as
// "module.name".
func Imports() map[string]bool {
	out := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(importList))
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" && !strings.HasPrefix(line, "#") {
			out[line] = true
		}
	}
	return out
}

// ModuleImports returns every import of a compiled module as "module.name", sorted
// and without repeats. Go modules import functions only; a memory, table or global
// import is listed too, so it cannot slip past a check.
func ModuleImports(ctx context.Context, wasm []byte) ([]string, error) {
	// The interpreter only decodes the module here, which is all this needs.
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer r.Close(ctx)
	compiled, err := r.CompileModule(ctx, wasm)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, f := range compiled.ImportedFunctions() {
		mod, name, _ := f.Import()
		seen[mod+"."+name] = true
	}
	for _, m := range compiled.ImportedMemories() {
		mod, name, _ := m.Import()
		seen[mod+"."+name] = true
	}
	out := make([]string, 0, len(seen))
	for imp := range seen {
		out = append(out, imp)
	}
	sort.Strings(out)
	return out, nil
}

// ForeignImports returns the module's imports that the oldest supported host does not
// provide: a module with any fails to load there ("missing import").
func ForeignImports(ctx context.Context, wasm []byte) ([]string, error) {
	imports, err := ModuleImports(ctx, wasm)
	if err != nil {
		return nil, err
	}
	provided := Imports()
	var foreign []string
	for _, imp := range imports {
		if !provided[imp] {
			foreign = append(foreign, imp)
		}
	}
	return foreign, nil
}

// WASI errno values (WASI preview 1).
const (
	errnoSuccess = 0
	errnoBadf    = 8
	errnoFault   = 21
	errnoInval   = 28
	errnoNoent   = 44
	errnoNosys   = 52
	errnoNotsup  = 58
)

// maxRandomBytes is the host's PROXY_WASM_HOST_WASI_RANDOM_GET_MAX_SIZE_BYTES.
const maxRandomBytes = 64 * 1024

// WASI is a wasi_snapshot_preview1 that answers as the oldest supported host does.
type WASI struct {
	// Now returns the realtime and monotonic clocks in nanoseconds; nil means the
	// wall clock.
	Now func() uint64
	// Log receives what the module writes to stdout (level 2) and stderr (level 4),
	// which the host sends to its log; nil drops it.
	Log func(level int, msg string)

	pollCalls atomic.Int64 // poll_oneoff calls, every one answered ENOSYS
}

// PollCalls returns how many times the module called poll_oneoff.
func (w *WASI) PollCalls() int64 { return w.pollCalls.Load() }

func (w *WASI) now() uint64 {
	if w.Now != nil {
		return w.Now()
	}
	return uint64(time.Now().UnixNano())
}

// Instantiate adds the module "wasi_snapshot_preview1" to r. It provides exactly the
// WASI functions of the host's import list, so a module that imports another one
// (path_filestat_get, say) fails to instantiate, as it fails to load in Envoy.
func (w *WASI) Instantiate(ctx context.Context, r wazero.Runtime) error {
	b := r.NewHostModuleBuilder("wasi_snapshot_preview1")
	fn := func(name string, f any) { b.NewFunctionBuilder().WithFunc(f).Export(name) }

	fn("fd_write", func(_ context.Context, m api.Module, fd, iovs, iovsLen, nwrittenPtr uint32) uint32 {
		level := 0
		switch fd {
		case 1:
			level = 2
		case 2:
			level = 4
		default:
			return errnoBadf
		}
		var s []byte
		for i := uint32(0); i < iovsLen; i++ {
			vec, ok := m.Memory().Read(iovs+i*8, 8)
			if !ok {
				return errnoFault
			}
			buf, n := binary.LittleEndian.Uint32(vec), binary.LittleEndian.Uint32(vec[4:])
			if n == 0 {
				continue
			}
			data, ok := m.Memory().Read(buf, n)
			if !ok {
				return errnoFault
			}
			s = append(s, data...)
		}
		if len(s) > 0 && w.Log != nil {
			w.Log(level, strings.TrimSuffix(string(s), "\n"))
		}
		if !m.Memory().WriteUint32Le(nwrittenPtr, uint32(len(s))) {
			return errnoFault
		}
		return errnoSuccess
	})
	fn("fd_read", func(_ context.Context, _, _, _, _ uint32) uint32 { return errnoNosys })
	fn("fd_seek", func(_ context.Context, _ uint32, _ int64, _, _ uint32) uint32 { return errnoSuccess })
	fn("fd_close", func(_ context.Context, _ uint32) uint32 { return errnoSuccess })
	fn("fd_fdstat_get", func(_ context.Context, m api.Module, fd, statPtr uint32) uint32 {
		if fd != 1 && fd != 2 {
			return errnoBadf
		}
		var stat [24]byte
		binary.LittleEndian.PutUint64(stat[8:], 64) // fs_rights_base: FD_WRITE
		m.Memory().Write(statPtr, stat[:])
		return errnoSuccess
	})
	fn("fd_fdstat_set_flags", func(_ context.Context, _, _ uint32) uint32 { return errnoNosys })
	// Envoy configures no environment for a VM unless asked; none here.
	fn("environ_get", func(_ context.Context, _, _ uint32) uint32 { return errnoSuccess })
	fn("environ_sizes_get", func(_ context.Context, m api.Module, countPtr, sizePtr uint32) uint32 {
		if !m.Memory().WriteUint32Le(countPtr, 0) || !m.Memory().WriteUint32Le(sizePtr, 0) {
			return errnoFault
		}
		return errnoSuccess
	})
	fn("args_get", func(_ context.Context, _, _ uint32) uint32 { return errnoSuccess })
	fn("args_sizes_get", func(_ context.Context, m api.Module, argcPtr, sizePtr uint32) uint32 {
		if !m.Memory().WriteUint32Le(argcPtr, 0) || !m.Memory().WriteUint32Le(sizePtr, 0) {
			return errnoFault
		}
		return errnoSuccess
	})
	fn("clock_time_get", func(_ context.Context, m api.Module, id uint32, _ uint64, resultPtr uint32) uint32 {
		if id > 1 { // only realtime and monotonic
			return errnoNotsup
		}
		if !m.Memory().WriteUint64Le(resultPtr, w.now()) {
			return errnoFault
		}
		return errnoSuccess
	})
	fn("random_get", func(_ context.Context, m api.Module, buf, n uint32) uint32 {
		if n > maxRandomBytes {
			return errnoInval
		}
		if n == 0 {
			return errnoSuccess
		}
		data := make([]byte, n)
		_, _ = rand.Read(data)
		if !m.Memory().Write(buf, data) {
			return errnoFault
		}
		return errnoSuccess
	})
	fn("sched_yield", func(_ context.Context) uint32 { return errnoSuccess })
	fn("poll_oneoff", func(_ context.Context, _, _, _, _ uint32) uint32 {
		w.pollCalls.Add(1)
		return errnoNosys // writes nothing, not even nevents
	})
	fn("proc_exit", func(_ context.Context, _ uint32) {
		if w.Log != nil {
			w.Log(4, "wasi_unstable proc_exit")
		}
	})
	fn("path_open", func(_ context.Context, _, _, _, _, _ uint32, _, _ uint64, _, _ uint32) uint32 {
		return errnoNoent
	})
	fn("fd_prestat_get", func(_ context.Context, _, _ uint32) uint32 { return errnoBadf })
	fn("fd_prestat_dir_name", func(_ context.Context, _, _, _ uint32) uint32 { return errnoNosys })
	_, err := b.Instantiate(ctx)
	return err
}
