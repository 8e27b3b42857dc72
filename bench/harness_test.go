// Package bench measures the compiled filter against a floor filter in the proxy-wasm SDK
// host emulator (wazero), against the cost bars of docs/development.md. Run with `make
// bench`.
package bench

import (
	"fmt"
	"io"
	"log"
	"math/rand"
	"os"
	"runtime"
	"strconv"
	"strings"
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

// emulator is one started plugin; close it before starting another (the emulator
// holds a process-wide lock).
type emulator struct {
	proxytest.HostEmulator
	close    func()
	requests int
	ends     *emulatorext.StreamEnds
}

// startOn starts a plugin with config on an already compiled module.
func startOn(tb testing.TB, v types.VMContext, config string) *emulator {
	h, reset := proxytest.NewHostEmulator(proxytest.NewEmulatorOption().
		WithVMContext(v).WithPluginConfiguration([]byte(config)))
	if h.StartVM() != types.OnVMStartStatusOK || h.StartPlugin() != types.OnPluginStartStatusOK {
		reset()
		tb.Fatalf("the plugin refused its config: %v", h.GetCriticalLogs())
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
// every request an x-request-id, and passes the response as a stream: its headers,
// the first event (for kvroute the end of the request's prefill, which its ledger
// times and learns the target's rate and cache from), the last event.
func (e *emulator) exchange(path string, body []byte, extra ...[2]string) {
	id := e.InitializeHttpContext()
	e.requests++
	hs := append([][2]string{{":method", "POST"}, {":path", path}, {":authority", "gw"},
		{"content-length", strconv.Itoa(len(body))}, {"x-request-id", "req-" + strconv.Itoa(e.requests)}}, extra...)
	if e.CallOnRequestHeaders(id, hs, false) == types.ActionPause {
		e.CallOnRequestBody(id, body, true)
	}
	e.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
	e.CallOnResponseBody(id, []byte("data: {}\n\n"), false)
	e.CallOnResponseBody(id, []byte("data: [DONE]\n\n"), true)
	e.CompleteHttpContext(id)
	if err := e.ends.End(id); err != nil {
		panic(err)
	}
}

// conversationTurns returns a stream of chat bodies of about size bytes: request i is
// the next turn of conversation i%convs — a system prompt all share, the
// conversation's history, and a new user message — so each request brings a prefix
// the router has seen and a suffix it has not. At most unique bodies are made; the
// stream repeats after them.
func conversationTurns(size, convs, unique int) [][]byte {
	rng := rand.New(rand.NewSource(int64(size)))
	system := words(rng, 1024)
	const turn = 512
	history := make([]string, convs)
	for c := range history {
		history[c] = words(rng, max(64, size-len(system)-turn-200))
	}
	out := make([][]byte, unique)
	for i := range out {
		out[i] = []byte(`{"model":"llama","stream":true,"messages":[{"role":"system","content":"` + system +
			`"},{"role":"user","content":"` + history[i%convs] + `"},{"role":"assistant","content":"ok"},` +
			`{"role":"user","content":"` + words(rng, turn) + `"}]}`)
	}
	return out
}

// warmThenTime runs one turn of each of convs conversations from position start of
// bodies through a freshly started plugin, untimed, then times batch more and
// returns the mean time per request. A plugin start's one-off costs (its first reads
// of shared state, the guest's collection of the plugin it replaced) are not costs of
// a request; without the warm-up they would fall on the first requests of a batch,
// weighing more the smaller b.N is. ticks charges kvroute's tick every ticksEvery
// requests.
func (e *emulator) warmThenTime(bodies [][]byte, convs, start, batch int, ticks bool) float64 {
	at := func(i int) []byte { return bodies[(start+i)%len(bodies)] }
	for i := 0; i < convs; i++ {
		e.exchange("/v1/chat/completions", at(i))
	}
	// The host's collector starts each batch clean: neither filter pays for the
	// garbage the other's batch left in the emulator.
	runtime.GC()
	return perRequest(e, batch, func(i int) {
		e.exchange("/v1/chat/completions", at(convs+i))
		if ticks && i%ticksEvery == ticksEvery-1 {
			e.Tick() // its share of the housekeeping, as at 1000 requests/s a VM
		}
	})
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
