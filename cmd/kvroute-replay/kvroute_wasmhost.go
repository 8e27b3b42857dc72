package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/kvroute/kvroute/internal/emulatorext"
	"github.com/kvroute/kvroute/internal/hostcompat"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

// Header names kvroute writes by default (docs/behaviour.md, Headers). The replay config
// must keep them.
const (
	headerDestination = "x-gateway-destination-endpoint"
	headerDPRank      = "x-data-parallel-rank"
	headerDecision    = "x-kvroute-decision"
)

// decisionKinds are kvroute's decision counters (docs/metrics.md), in report order.
var decisionKinds = []string{"sticky", "overflow", "new_conversation", "continuation", "prefix", "load", "fallback"}

// kvrouteWasm drives the compiled filter in the proxy-wasm SDK host emulator as one
// more policy: a request goes in as headers and a body, the choice comes out as the
// destination and rank headers; a completion is a 200 response and the end of the
// stream. Only one host emulator may exist in a process at a time: Close it.
type kvrouteWasm struct {
	vm      proxytest.WasmVMContext
	host    proxytest.HostEmulator
	reset   func()
	targets map[string]int // "address#rank" → target index
	context map[int]uint32 // request index → http context id
	err     error          // the first routing failure, reported by Replay's caller
	kinds   []string       // decision header per request index

	fleet    *Fleet         // the replay's clock
	nextTick float64        // replay time of the next timer tick, ms
	ticks    int            // ticks delivered
	onTick   func()         // if set, called after every tick (a replica answers scrapes there)
	disc     *discoveryHost // if set, answers discovery polls (a scaled replay: scale.go)

	// idSalt, when set, makes request n's x-request-id replay-<idSalt>-<n> instead
	// of replay-<n>. The filter seeds its tie-break shuffle with that id,
	// so a different salt replays the same trace with other tie-breaks.
	idSalt string
}

// maxIdleTicks is how many ticks are delivered back to back across a quiet stretch:
// a tick with nothing new to share or sweep does nothing, so a long gap between
// requests need not cost thousands of calls.
const maxIdleTicks = 2

// tickTo delivers Envoy's timer: OnTick every tick period (as the filter asked with
// SetTickPeriodMilliSeconds) of replay time up to now, before the request or
// completion at now. (The guest's clock is the replay's too: clockNS.)
func (p *kvrouteWasm) tickTo(now float64) {
	period := float64(p.host.GetTickPeriod())
	if period <= 0 {
		return
	}
	if p.nextTick == 0 {
		p.nextTick = period
	}
	for n := 0; p.nextTick <= now; n++ {
		if n < maxIdleTicks {
			p.host.Tick()
			p.ticks++
			if p.onTick != nil {
				p.onTick()
			}
		}
		p.nextTick += period
	}
	if p.disc != nil {
		p.disc.at(now)
	}
}

// replayEpochNS is the wall-clock time the replay starts at (2025-01-01 UTC), in ns.
const replayEpochNS = 1735689600 * 1e9

// clockNS is the guest's clock: the replay's time since replayEpochNS.
func (p *kvrouteWasm) clockNS() uint64 {
	if p.fleet == nil {
		return replayEpochNS
	}
	return replayEpochNS + uint64(p.fleet.Now()*1e6)
}

// guestLog, when not nil, receives what the module writes to stdout and stderr, a
// line at a time (-guest-log): the println of a debug build shows inside a decision.
var guestLog io.Writer

// guestLogMu keeps the lines of modules replayed at once whole.
var guestLogMu sync.Mutex

// guestLines joins one module's writes into lines for w. The Go runtime writes each
// of println's arguments, and its newline, apart, and the host hands each write over
// without a trailing newline: a write of nothing but one ends a line.
func guestLines(w io.Writer) func(level int, msg string) {
	var line []byte
	return func(_ int, msg string) {
		if msg != "" {
			line = append(line, msg...)
			return
		}
		line = append(line, '\n')
		guestLogMu.Lock()
		_, _ = w.Write(line)
		guestLogMu.Unlock()
		line = line[:0]
	}
}

// newKVRouteWasm loads the compiled filter and starts it with config.
func newKVRouteWasm(wasm []byte, config []byte, cfg FleetConfig) (*kvrouteWasm, error) {
	p := &kvrouteWasm{targets: map[string]int{}, context: map[int]uint32{}}
	// The guest reads the replay's clock, as a filter in Envoy reads the wall clock:
	// what it times (prefills, leases, scrape and poll intervals) runs in replay time.
	wasi := &hostcompat.WASI{Now: p.clockNS}
	if guestLog != nil {
		wasi.Log = guestLines(guestLog)
	}
	vm, err := emulatorext.NewWasmVMContextWithWASI(wasm, wasi.Instantiate)
	if err != nil {
		return nil, fmt.Errorf("loading the wasm module: %v", err)
	}
	// The emulator logs every host call through the std logger.
	log.SetOutput(io.Discard)
	host, reset := proxytest.NewHostEmulator(proxytest.NewEmulatorOption().
		WithVMContext(vm).WithPluginConfiguration(config))
	p.vm, p.host, p.reset = vm, host, reset
	if host.StartVM() != types.OnVMStartStatusOK || host.StartPlugin() != types.OnPluginStartStatusOK {
		crit := host.GetCriticalLogs()
		p.Close()
		return nil, fmt.Errorf("the plugin refused the config: %s", strings.Join(crit, "; "))
	}
	for t := 0; t < cfg.Targets(); t++ {
		p.targets[cfg.TargetName(t)] = t
	}
	return p, nil
}

// Close releases the emulator (and its global lock) and the VM.
func (p *kvrouteWasm) Close() {
	if p.reset != nil {
		p.reset()
		p.reset = nil
	}
	if p.vm != nil {
		_ = p.vm.Close()
		p.vm = nil
	}
	log.SetOutput(os.Stderr)
}

func (p *kvrouteWasm) Name() string { return "kvroute (wasm)" }

func (p *kvrouteWasm) Choose(r *Request, f *Fleet) int {
	p.fleet = f
	p.tickTo(f.Now())
	body := r.Body()
	headers := [][2]string{
		{":method", "POST"}, {":path", r.Path}, {":authority", "replay"},
		{"content-type", "application/json"}, {"content-length", strconv.Itoa(len(body))},
		{"x-request-id", p.requestID(r.Index)},
	}
	headers = append(headers, r.Headers...)
	id := p.host.InitializeHttpContext()
	p.context[r.Index] = id
	if p.host.CallOnRequestHeaders(id, headers, false) == types.ActionPause {
		p.host.CallOnRequestBody(id, body, true)
	}
	var dest, rank, kind string
	for _, kv := range p.host.GetCurrentRequestHeaders(id) {
		switch kv[0] {
		case headerDestination:
			dest = kv[1]
		case headerDPRank:
			rank = kv[1]
		case headerDecision:
			kind = kv[1]
		}
	}
	for len(p.kinds) <= r.Index {
		p.kinds = append(p.kinds, "")
	}
	p.kinds[r.Index] = kind
	if rank == "" {
		rank = "0"
	}
	t, ok := p.targets[dest+"#"+rank]
	if !ok {
		if p.err == nil {
			p.err = fmt.Errorf("request %d: kvroute chose %q rank %q, not a fleet target", r.Index, dest, rank)
		}
		return 0
	}
	// A streamed response's headers come back at once, before the prefill is over
	// (an OpenAI-compatible server sends them as it starts the event stream), so
	// they say nothing about the first token.
	p.host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}, {"content-type", "text/event-stream"}}, false)
	return t
}

// firstChunk and lastChunks are the streamed response body: the first event at the
// first token, the rest at the completion.
var (
	firstChunk = []byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
	lastChunks = []byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"…\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
)

// FirstToken is the response's first body chunk: the prefill is over.
func (p *kvrouteWasm) FirstToken(r *Request, _ int) {
	id, ok := p.context[r.Index]
	if !ok {
		return
	}
	p.tickTo(p.fleet.Now())
	p.host.CallOnResponseBody(id, firstChunk, false)
}

// requestID is the x-request-id of request n.
func (p *kvrouteWasm) requestID(n int) string {
	if p.idSalt == "" {
		return "replay-" + strconv.Itoa(n)
	}
	return "replay-" + p.idSalt + "-" + strconv.Itoa(n)
}

// Done is the rest of the streamed response, then the end of the stream, which
// releases the request's load in the filter's ledger.
func (p *kvrouteWasm) Done(r *Request, _ int) {
	id, ok := p.context[r.Index]
	if !ok {
		return
	}
	delete(p.context, r.Index)
	p.tickTo(p.fleet.Now())
	p.host.CallOnResponseBody(id, lastChunks, true)
	p.host.CompleteHttpContext(id)
}

// Decisions reads the filter's decision counters.
func (p *kvrouteWasm) Decisions() []Count {
	p.host.Tick() // the tick hands over the per-request counts (not counted in the report)
	var out []Count
	for _, k := range decisionKinds {
		n, _ := p.host.GetCounterMetric("kvroute_decision_" + k)
		out = append(out, Count{strings.ReplaceAll(k, "_", "-"), n})
	}
	return out
}

// Counter reads one of the filter's counters (0 if it is not defined).
// The filter hands its per-request counts to Envoy on the tick, so one more tick runs
// first (not counted in the report).
func (p *kvrouteWasm) Counter(name string) uint64 {
	p.host.Tick()
	n, _ := p.host.GetCounterMetric(name)
	return n
}

// Gauge reads one of the filter's gauges (0 if it is not defined). The filter sets
// its gauges on the tick, so one more tick runs first (not counted in the report).
func (p *kvrouteWasm) Gauge(name string) uint64 {
	p.host.Tick()
	n, _ := p.host.GetGaugeMetric(name)
	return n
}

// PDSplit is the P/D classification the filter counted.
func (p *kvrouteWasm) PDSplit() string {
	dis, dir := p.Counter("kvroute_pd_disaggregated"), p.Counter("kvroute_pd_direct")
	if dis+dir == 0 {
		return "off"
	}
	return fmt.Sprintf("%d disagg / %d direct", dis, dir)
}

// replayConfig reads the kvroute config for the replay and sets its decode pool to
// the fleet: endpoints 10.0.0.1:8000 … with dp_size ranks each, and, unless the file
// sets it, prefix.target_cache_tokens to the fleet's cache per target. Everything
// else in the file is kept as written.
func replayConfig(path string, cfg FleetConfig) ([]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	pools, _ := doc["pools"].(map[string]any)
	if pools == nil {
		pools = map[string]any{}
		doc["pools"] = pools
	}
	var eps []any
	for e := 0; e < cfg.Endpoints; e++ {
		eps = append(eps, map[string]any{"address": cfg.Address(e), "dp_size": cfg.DPSize})
	}
	pools["decode"] = map[string]any{"endpoints": eps}
	// An operator states each engine's KV cache (vLLM: num_gpu_blocks × block_size);
	// unless the file does, the replay states the fleet's.
	prefix, _ := doc["prefix"].(map[string]any)
	if prefix == nil {
		prefix = map[string]any{}
		doc["prefix"] = prefix
	}
	if _, ok := prefix["target_cache_tokens"]; !ok {
		prefix["target_cache_tokens"] = cfg.CacheTokens
	}
	if h, ok := doc["headers"].(map[string]any); ok {
		for key, want := range map[string]string{"destination": headerDestination, "dp_rank": headerDPRank, "decision": headerDecision} {
			if v, ok := h[key]; ok && v != want {
				return nil, fmt.Errorf("%s: headers.%s must stay %q for the replay", path, key, want)
			}
		}
	}
	return json.Marshal(doc)
}
