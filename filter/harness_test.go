package main

import (
	"io"
	"log"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/require"
)

// Every filter test runs twice: against the Go plugin and against the compiled
// build/kvroute.wasm in wazero. The tests of injected faults run the same module built
// with the kvroute_faults tag. Each module is compiled once per test binary.
var (
	shipped = &wasmModule{path: "../build/kvroute.wasm", make: "make build"}
	faulty  = &wasmModule{path: "../build/kvroute-faults.wasm", make: "make build/kvroute-faults.wasm"}
)

// wasmModule is one wasm module, loaded into wazero at its first use.
type wasmModule struct {
	path, make string
	once       sync.Once
	bin        []byte
	vm         proxytest.WasmVMContext
	uses       int // tests served by vm
	err        error
}

// vmUses is how many tests one loaded module serves before a new one is loaded. The
// emulator never calls proxy_on_delete, so every plugin a test starts stays in the
// module's memory, and a wasm32 module has 4 GiB: the whole suite on one module
// runs out of it.
const vmUses = 64

func (m *wasmModule) load(t testing.TB) types.VMContext {
	m.once.Do(func() {
		if m.bin, m.err = os.ReadFile(m.path); m.err == nil {
			m.vm, m.err = proxytest.NewWasmVMContext(m.bin)
		}
	})
	if m.err == nil && m.uses >= vmUses {
		m.vm.Close()
		m.vm, m.err = proxytest.NewWasmVMContext(m.bin)
		m.uses = 0
	}
	if m.err != nil {
		t.Fatalf("the compiled module is needed for wasm-mode tests (run `%s`): %v", m.make, m.err)
	}
	m.uses++
	return m.vm
}

func compiledVM(t testing.TB) types.VMContext { return shipped.load(t) }

// freshVM is the compiled wasm in a wazero runtime of its own, closed when the test
// ends. Its clock starts at wazero's fake epoch; the shared module's clock reaches a
// point that depends on the tests run before.
func freshVM(t testing.TB) types.VMContext {
	bin, err := os.ReadFile(shipped.path)
	if err != nil {
		t.Fatalf("the compiled module is needed for wasm-mode tests (run `%s`): %v", shipped.make, err)
	}
	vm, err := proxytest.NewWasmVMContext(bin)
	require.NoError(t, err)
	t.Cleanup(func() { vm.Close() })
	return vm
}

// bothVMs runs fn once with the Go plugin and once with the compiled wasm.
func bothVMs(t *testing.T, fn func(t *testing.T, vm types.VMContext)) {
	bothVMsOn(t, compiledVM, fn)
}

// bothFreshVMs is bothVMs with the wasm in a fresh runtime (freshVM): for a test whose
// outcome depends on where the clock falls in a span of absolute time, such as the
// recent work's half-life, which the recent work halves at the end of.
func bothFreshVMs(t *testing.T, fn func(t *testing.T, vm types.VMContext)) {
	bothVMsOn(t, freshVM, fn)
}

// bothVMsOn runs fn once with the Go plugin and once with the compiled wasm that wasm
// returns.
func bothVMsOn(t *testing.T, wasm func(testing.TB) types.VMContext, fn func(t *testing.T, vm types.VMContext)) {
	t.Run("go", func(t *testing.T) {
		// The Go plugin runs on a test clock that advance moves.
		saved := nowMS
		goClock = 1_700_000_000_000
		nowMS = func() int64 { return goClock }
		defer func() { nowMS = saved }()
		fn(t, &vmContext{})
	})
	t.Run("wasm", func(t *testing.T) { fn(t, wasm(t)) })
}

var goClock int64

// host wraps the emulator with the few steps every test takes.
type host struct {
	proxytest.HostEmulator
	t    testing.TB
	wasm bool

	scrapesSeen int
}

// advance moves the plugin's clock forward by at least ms milliseconds. The Go plugin
// runs on goClock. In wazero the guest's clock is wazero's fake walltime, which moves
// 1 ms at each reading, and each tick reads it once: so ms ticks move it ms or more.
func (h *host) advance(ms int) {
	if !h.wasm {
		goClock += int64(ms)
		return
	}
	for i := 0; i < ms; i++ {
		h.Tick()
	}
}

// startHost starts the plugin with config and requires it to accept the config.
func startHost(t testing.TB, vm types.VMContext, config string) *host {
	h, status := tryStart(t, vm, config)
	require.Equal(t, types.OnPluginStartStatusOK, status, "plugin refused config: %v", h.GetCriticalLogs())
	return h
}

// tryStart starts the plugin with config and returns what the start said.
func tryStart(t testing.TB, vm types.VMContext, config string) (*host, types.OnPluginStartStatus) {
	opt := proxytest.NewEmulatorOption().WithVMContext(vm).WithPluginConfiguration([]byte(config))
	emu, reset := proxytest.NewHostEmulator(opt)
	t.Cleanup(reset)
	require.Equal(t, types.OnVMStartStatusOK, emu.StartVM())
	_, isGo := vm.(*vmContext)
	return &host{HostEmulator: emu, t: t, wasm: !isGo}, emu.StartPlugin()
}

// request is one client request.
type request struct {
	method  string
	path    string
	headers [][2]string
	body    []byte // nil: no body
}

func post(path, body string, headers ...[2]string) request {
	return request{method: "POST", path: path, headers: headers, body: []byte(body)}
}

// send runs the request phases and returns the context id and the final action.
func (h *host) send(r request) (uint32, types.Action) {
	id := h.InitializeHttpContext()
	hs := [][2]string{{":method", r.method}, {":path", r.path}, {":authority", "gateway"}}
	if r.body != nil {
		hs = append(hs, [2]string{"content-length", strconv.Itoa(len(r.body))})
	}
	hs = append(hs, r.headers...)
	action := h.CallOnRequestHeaders(id, hs, r.body == nil)
	if r.body != nil && action == types.ActionPause {
		action = h.CallOnRequestBody(id, r.body, true)
	}
	return id, action
}

// respond completes the exchange with status.
func (h *host) respond(id uint32, status int) {
	h.CallOnResponseHeaders(id, [][2]string{{":status", strconv.Itoa(status)}}, false)
	h.CallOnResponseBody(id, []byte("{}"), true)
	h.CompleteHttpContext(id)
}

// stream sends the response headers an OpenAI-compatible server sends as it opens an
// event stream, before the first token.
func (h *host) stream(id uint32) {
	h.CallOnResponseHeaders(id, [][2]string{{":status", "200"}, {"content-type", "text/event-stream"}}, false)
}

// firstChunk passes the stream's first event: the first token.
func (h *host) firstChunk(id uint32) { h.CallOnResponseBody(id, []byte("data: {}\n\n"), false) }

// endStream passes the stream's last event and ends the exchange.
func (h *host) endStream(id uint32) {
	h.CallOnResponseBody(id, []byte("data: [DONE]\n\n"), true)
	h.CompleteHttpContext(id)
}

// header returns the value of a request header as the upstream would see it, and
// whether it is there.
func (h *host) header(id uint32, name string) (string, bool) {
	for _, kv := range h.GetCurrentRequestHeaders(id) {
		if kv[0] == name {
			return kv[1], true
		}
	}
	return "", false
}

// route sends r, completes it with 200 and returns destination, rank and decision.
func (h *host) route(r request) (dest, rank, decision string) {
	id, action := h.send(r)
	require.Equal(h.t, types.ActionContinue, action)
	dest, _ = h.header(id, "x-gateway-destination-endpoint")
	rank, _ = h.header(id, "x-data-parallel-rank")
	decision, _ = h.header(id, "x-kvroute-decision")
	h.respond(id, 200)
	return dest, rank, decision
}

// counter reads a counter after a tick: the tick hands over the per-request counts.
func (h *host) counter(name string) uint64 {
	h.Tick()
	v, err := h.GetCounterMetric(name)
	require.NoError(h.t, err)
	return v
}

// gauge reads a gauge after a tick: the tick sets the gauges from the ledger.
func (h *host) gauge(name string) int64 {
	h.Tick()
	v, err := h.GetGaugeMetric(name)
	require.NoError(h.t, err)
	return int64(v)
}

func chat(content string) string {
	return `{"model":"m","messages":[{"role":"user","content":` + strconv.Quote(content) + `}]}`
}

// TestMain silences the emulator's log of every host call; failures still print.
func TestMain(m *testing.M) {
	log.SetOutput(io.Discard)
	os.Exit(m.Run())
}
