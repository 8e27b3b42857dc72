// Package bench measures the compiled filter against a floor filter in the proxy-wasm
// SDK host emulator (wazero), as SPEC §10 asks. Run with `make bench`.
package bench

import (
	"fmt"
	"io"
	"log"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/emulatorext"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

func TestMain(m *testing.M) {
	log.SetOutput(io.Discard) // the emulator logs every host call
	os.Exit(m.Run())
}

var (
	vmsOnce sync.Once
	vms     = map[string]proxytest.WasmVMContext{}
	vmsErr  error
)

// vm returns the compiled module build/<name>.wasm, compiled once per test binary.
func vm(tb testing.TB, name string) types.VMContext {
	vmsOnce.Do(func() {
		for _, n := range []string{"kvroute", "floor"} {
			bin, err := os.ReadFile("../build/" + n + ".wasm")
			if err != nil {
				vmsErr = fmt.Errorf("%v (run `make bench`, which builds both modules)", err)
				return
			}
			v, err := proxytest.NewWasmVMContext(bin)
			if err != nil {
				vmsErr = err
				return
			}
			vms[n] = v
		}
	})
	if vmsErr != nil {
		tb.Fatal(vmsErr)
	}
	return vms[name]
}

// emulator is one started plugin; close it before starting another (the emulator
// holds a process-wide lock).
type emulator struct {
	proxytest.HostEmulator
	close    func()
	requests int
	ends     *emulatorext.StreamEnds
}

func start(tb testing.TB, name, config string) *emulator {
	return startOn(tb, vm(tb, name), config)
}

// startOn starts a plugin with config on an already compiled module.
func startOn(tb testing.TB, v types.VMContext, config string) *emulator {
	name := "the plugin"
	h, reset := proxytest.NewHostEmulator(proxytest.NewEmulatorOption().
		WithVMContext(v).WithPluginConfiguration([]byte(config)))
	if h.StartVM() != types.OnVMStartStatusOK || h.StartPlugin() != types.OnPluginStartStatusOK {
		reset()
		tb.Fatalf("%s refused its config: %v", name, h.GetCriticalLogs())
	}
	// Envoy deletes each finished stream's context; the emulator does not, which
	// would leave every request's context on the guest's heap for its GC to walk.
	ends := emulatorext.NewStreamEnds(h, v)
	if !ends.Deletes() || !ends.Forgets() {
		reset()
		tb.Fatal("cannot end streams as Envoy does (proxy_on_delete): the SDK or wazero moved a field")
	}
	return &emulator{HostEmulator: h, close: reset, ends: ends}
}

// exchange runs one request through every phase and ends it. Like Envoy, it gives
// every request an x-request-id.
func (e *emulator) exchange(path string, body []byte, extra ...[2]string) {
	id := e.InitializeHttpContext()
	e.requests++
	hs := append([][2]string{{":method", "POST"}, {":path", path}, {":authority", "gw"},
		{"content-length", strconv.Itoa(len(body))}, {"x-request-id", "req-" + strconv.Itoa(e.requests)}}, extra...)
	if e.CallOnRequestHeaders(id, hs, false) == types.ActionPause {
		e.CallOnRequestBody(id, body, true)
	}
	e.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
	e.CompleteHttpContext(id)
	if err := e.ends.End(id); err != nil {
		panic(err)
	}
}

// chatBodies returns n distinct chat bodies of about size bytes: a shared system
// prompt, a unique user turn.
func chatBodies(size, n int, seed int64) [][]byte {
	rng := rand.New(rand.NewSource(seed))
	system := words(rng, 1024)
	out := make([][]byte, n)
	for i := range out {
		user := words(rng, max(64, size-len(system)-120))
		out[i] = []byte(`{"model":"llama","stream":true,"messages":[{"role":"system","content":"` + system +
			`"},{"role":"user","content":"` + user + `"}]}`)
	}
	return out
}

func words(rng *rand.Rand, n int) string {
	var b strings.Builder
	for b.Len() < n {
		fmt.Fprintf(&b, "w%d ", rng.Intn(1<<20))
	}
	return b.String()[:n]
}

func fleetConfig(endpoints, dp int) string {
	var eps []string
	for i := 0; i < endpoints; i++ {
		eps = append(eps, fmt.Sprintf(`{"address":"10.0.%d.%d:8000","dp_size":%d}`, i/250, i%250+1, dp))
	}
	return `{"pools":{"decode":{"endpoints":[` + strings.Join(eps, ",") + `]}}}`
}

// perRequest runs n requests through e and returns the mean time per request.
func perRequest(e *emulator, n int, next func(i int)) float64 {
	startT := time.Now()
	for i := 0; i < n; i++ {
		next(i)
	}
	return float64(time.Since(startT).Nanoseconds()) / float64(n)
}
