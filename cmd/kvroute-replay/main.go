// Command kvroute-replay replays a request trace through the compiled filter
// (build/kvroute.wasm, in the proxy-wasm Go SDK host emulator) against a modelled
// fleet — targets with a per-target LRU prefix KV cache, a service time from the
// uncached prompt and the output, completions fed back in time order — and, through
// the same fleet model in the same run, the baselines: round-robin, least-loaded,
// consistent hashing, SGLang's cache-aware policy, the Gateway API Inference
// Extension's default scorers, TensorRT-LLM's ConversationRouter and NVIDIA Dynamo's KV
// router. It prints the
// prefix hit rate against the oracles, load balance, a TTFT estimate and kvroute's
// decision mix as a table, checks the routing-quality bar, and draws an SVG.
//
// Traces: Mooncake JSONL (timestamp, input_length, output_length, hash_ids),
// Azure LLM inference CSV (TIMESTAMP,ContextTokens,GeneratedTokens) and JSONL of
// OpenAI request bodies ({"timestamp_ms", "path", "headers", "body", "output_tokens"}).
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// options are the command-line flags.
type options struct {
	wasm, config, trace, format, svg, policies string
	dump                                       string
	limit                                      int
	speed                                      float64   // the first of speeds
	speeds                                     []float64 // -speed: each is replayed
	draws                                      int       // -draws: tie-break draws per speed
	fleet                                      FleetConfig
	cacheBlocks                                int
	charsPerToken                              int
	seed                                       uint64
	idSalt                                     string // -id-salt: varies kvroute's x-request-id (its tie-break seed)
	strict                                     bool
	replicas                                   int        // -replicas: gateway replicas (replicas.go), 0 = off
	replicaConfigs                             string     // -replica-configs
	scale                                      *scaleSpec // -scale: a fleet that scales (scale.go), nil = fixed
	scaleInterval                              int        // -scale-interval-ms: kvroute's discovery.interval_ms
	scaleWindowMS                              float64    // -scale-window: the span reported after a step
}

// Fleet defaults (shown by -help):
//   - 4 endpoints × dp 2 = 8 targets;
//   - 1024 blocks of 512 tokens (524,288 tokens) of prefix cache per target: the KV
//     memory of a Llama-3-8B-class model (128 KiB a token in fp16) on an 80 GB H100
//     after the weights, ~64 GiB; 8192 blocks over the fleet, 19% of the Mooncake
//     trace's 43,924 distinct blocks, where one shared LRU reaches 0.378 against the
//     0.64 of an infinite cache: placement decides what is reused;
//   - prefill 0.08 ms per uncached token (12.5k tokens/s, an H100 on an 8B model
//     with long prompts), decode 15 ms per output token (inter-token latency in a
//     moderately full batch), 32 running requests per target (the KV memory holds
//     about 34 Mooncake prompts of 15k tokens).
const (
	defaultEndpoints   = 4
	defaultDPSize      = 2
	defaultCacheBlocks = 1024
	defaultPrefillMS   = 0.08
	defaultDecodeMS    = 15
	defaultMaxRunning  = 32
)

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("kvroute-replay", flag.ContinueOnError)
	fs.StringVar(&o.wasm, "wasm", "build/kvroute.wasm", "compiled filter (make build)")
	fs.StringVar(&o.config, "config", "testdata/replay/kvroute.json", "kvroute config; its decode pool is replaced by the fleet")
	fs.StringVar(&o.trace, "trace", "testdata/traces/mooncake_synthetic_trace.jsonl", "trace file")
	fs.StringVar(&o.format, "format", "auto", "trace format: mooncake, azure, openai or auto (by content)")
	fs.StringVar(&o.svg, "svg", "build/replay.svg", "write the chart here (\"\" for none)")
	fs.StringVar(&o.dump, "dump", "", "write a per-request CSV (targets, hits, kvroute's decisions) here")
	fs.StringVar(&o.policies, "policies", "all", "comma-separated: kvroute, round-robin, least-loaded, consistent-hash, sglang, gie, trtllm, dynamo, or all")
	fs.IntVar(&o.limit, "n", 0, "replay only the first n requests (0: all)")
	speedList := fs.String("speed", "1", "time compression: arrivals come speed times faster; a comma-separated list (1,2) replays each")
	fs.IntVar(&o.draws, "draws", 1, "replay every policy this many times with other tie-breaks (kvroute: request-id salts; baselines: their seeds) and report the mean and spread")
	fs.IntVar(&o.fleet.Endpoints, "endpoints", defaultEndpoints, "inference servers (10.0.0.1:8000, 10.0.0.2:8000, …)")
	fs.IntVar(&o.fleet.DPSize, "dp", defaultDPSize, "data-parallel ranks per server; each rank is a target")
	fs.IntVar(&o.cacheBlocks, "cache-blocks", defaultCacheBlocks, "prefix KV cache per target, in 512-token blocks")
	fs.Float64Var(&o.fleet.PrefillMSPerToken, "prefill-ms", defaultPrefillMS, "prefill time per uncached prompt token, ms")
	fs.Float64Var(&o.fleet.DecodeMSPerToken, "decode-ms", defaultDecodeMS, "decode time per output token, ms")
	fs.IntVar(&o.fleet.MaxRunning, "max-running", defaultMaxRunning, "requests a target runs at once; more queue")
	fs.IntVar(&o.fleet.SlowEndpoints, "slow-endpoints", 0, "a mixed fleet: the first this many servers prefill and decode -slow-factor times slower")
	fs.Float64Var(&o.fleet.SlowFactor, "slow-factor", 2, "with -slow-endpoints, how many times slower those servers are")
	fs.IntVar(&o.charsPerToken, "chars-per-token", 4, "characters of prompt text per token (keep chars_per_token in -config equal)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the baselines' random tie-breaks and of the spread over -replicas")
	fs.StringVar(&o.idSalt, "id-salt", "", "put this into the x-request-id kvroute sees (replay-<salt>-<n> instead of replay-<n>): it seeds kvroute's tie-break shuffle, so other values show how much one run owes to ties")
	fs.BoolVar(&o.strict, "strict", false, "exit 1 when kvroute misses a line of the routing-quality bar")
	guestLogs := fs.Bool("guest-log", false, "copy what the module writes to stdout and stderr (a debug build's println) to stderr, a line at a time")
	fs.IntVar(&o.replicas, "replicas", 0, "also replay kvroute as this many gateway replicas, each request to one at random (0: off)")
	fs.StringVar(&o.replicaConfigs, "replica-configs", "all", "with -replicas, comma-separated: round_robin, hash, round_robin+metrics, hash+metrics (first_turn, engine metrics), or all")
	scale := fs.String("scale", "", "replay a fleet that scales instead, e.g. \"start=4,at=50%:+4\" (at= a share of the replay, 600s or ms; :+M joins M endpoints, :-M removes the newest M): kvroute discovers it, compared with kvroute told at once, kvroute static and the baselines; -endpoints is ignored")
	fs.IntVar(&o.scaleInterval, "scale-interval-ms", 1000, "with -scale, kvroute's pools.decode.discovery.interval_ms")
	scaleWindow := fs.Float64("scale-window", 60, "with -scale, the span after the first step reported apart, seconds of replay time")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if *guestLogs {
		guestLog = os.Stderr
	}
	if *scale != "" {
		sp, err := parseScale(*scale)
		if err != nil {
			return nil, err
		}
		if *scaleWindow <= 0 || o.scaleInterval < 100 {
			return nil, fmt.Errorf("-scale-window must be > 0 and -scale-interval-ms >= 100")
		}
		o.scale, o.scaleWindowMS = sp, *scaleWindow*1000
	}
	for _, f := range strings.Split(*speedList, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(v > 0) {
			return nil, fmt.Errorf("-speed: %q is not a number > 0", f)
		}
		o.speeds = append(o.speeds, v)
	}
	o.speed = o.speeds[0]
	switch {
	case o.draws < 1:
		return nil, fmt.Errorf("-draws must be >= 1")
	case o.fleet.Endpoints < 1 || o.fleet.DPSize < 1:
		return nil, fmt.Errorf("-endpoints and -dp must be >= 1")
	case o.cacheBlocks < 1 || o.fleet.MaxRunning < 1 || o.charsPerToken < 1:
		return nil, fmt.Errorf("-cache-blocks, -max-running and -chars-per-token must be >= 1")
	case !(o.speed > 0) || o.fleet.PrefillMSPerToken < 0 || o.fleet.DecodeMSPerToken < 0:
		return nil, fmt.Errorf("-speed must be > 0 and the service times >= 0")
	case o.replicas < 0:
		return nil, fmt.Errorf("-replicas must be >= 0")
	case o.fleet.SlowEndpoints < 0 || !(o.fleet.SlowFactor > 0):
		return nil, fmt.Errorf("-slow-endpoints must be >= 0 and -slow-factor > 0")
	}
	if o.replicas > 0 {
		if _, err := selectReplicaVariants(o.replicaConfigs); err != nil {
			return nil, err
		}
	}
	o.fleet.CacheTokens = o.cacheBlocks * MooncakeBlockTokens
	return o, nil
}

func main() {
	// Hidden modes: a gateway replica child (replica_child.go), the chat-trace
	// generator (chattrace.go) and the workload-shape generator (shapes.go).
	if len(os.Args) > 1 && os.Args[1] == "-replica" {
		os.Exit(replicaMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "-gen-chat" {
		os.Exit(chatTraceMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "-gen-shape" {
		os.Exit(shapeMain(os.Args[2:]))
	}
	start := time.Now()
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		if err.Error() == "flag: help requested" {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "kvroute-replay:", err)
		os.Exit(2)
	}
	if o.scale != nil {
		if err := runScale(o, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "kvroute-replay:", err)
			os.Exit(1)
		}
		fmt.Printf("runtime: %.1f s\n", time.Since(start).Seconds())
		return
	}
	rep, reqs, err := run(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvroute-replay:", err)
		os.Exit(1)
	}
	rep.WriteText(os.Stdout)
	if o.replicas > 0 {
		runs, err := runReplicas(o, reqs)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kvroute-replay:", err)
			os.Exit(1)
		}
		writeReplicaTable(os.Stdout, rep, o, runs)
	}
	if o.svg != "" {
		if err := writeFile(o.svg, rep.WriteSVG); err != nil {
			fmt.Fprintln(os.Stderr, "kvroute-replay:", err)
			os.Exit(1)
		}
		fmt.Printf("\nchart: %s\n", o.svg)
	}
	if o.dump != "" {
		if err := writeFile(o.dump, func(w io.Writer) error { return rep.WriteCSV(w, reqs) }); err != nil {
			fmt.Fprintln(os.Stderr, "kvroute-replay:", err)
			os.Exit(1)
		}
		fmt.Printf("per-request CSV: %s\n", o.dump)
	}
	fmt.Printf("runtime: %.1f s\n", time.Since(start).Seconds())
	if o.strict {
		for _, b := range rep.Bars() {
			if !b.Pass && !b.NA {
				os.Exit(1)
			}
		}
	}
}

func writeFile(path string, write func(io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// loadTrace reads a trace of any supported format into requests in arrival order.
func loadTrace(path, format string, limit, charsPerToken int, speed float64) ([]*Request, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	if format == "auto" {
		format, err = sniffFormat(f)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %v", path, err)
		}
	}
	var reqs []*Request
	switch format {
	case "mooncake":
		recs, err := ReadMooncake(f, limit)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %v", path, err)
		}
		reqs = MooncakeRequests(recs, charsPerToken, speed)
	case "azure":
		recs, err := ReadAzure(f, limit)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %v", path, err)
		}
		reqs = AzureRequests(recs, charsPerToken, speed)
	case "openai":
		recs, err := ReadOpenAI(f, limit)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %v", path, err)
		}
		reqs = OpenAIRequests(recs, charsPerToken, speed)
	default:
		return nil, "", fmt.Errorf("unknown -format %q (mooncake, azure, openai, auto)", format)
	}
	if len(reqs) == 0 {
		return nil, "", fmt.Errorf("%s: no requests", path)
	}
	for i := 1; i < len(reqs); i++ {
		if reqs[i].ArrivalMS < reqs[i-1].ArrivalMS {
			return nil, "", fmt.Errorf("%s: request %d arrives before request %d: the trace must be in time order", path, i, i-1)
		}
	}
	prepare(reqs, MooncakeBlockTokens*charsPerToken)
	if format == "openai" {
		useChainAsBlocks(reqs)
	}
	return reqs, format, nil
}

// sniffFormat looks at the first bytes: a CSV header, a Mooncake line or an OpenAI line.
func sniffFormat(f *os.File) (string, error) {
	buf := make([]byte, 4096)
	n, _ := f.Read(buf)
	if _, err := f.Seek(0, 0); err != nil {
		return "", err
	}
	head := strings.TrimPrefix(string(buf[:n]), "\ufeff")
	switch {
	case strings.HasPrefix(strings.TrimSpace(head), "TIMESTAMP"):
		return "azure", nil
	case strings.Contains(head, `"hash_ids"`):
		return "mooncake", nil
	case strings.Contains(head, `"body"`):
		return "openai", nil
	}
	return "", fmt.Errorf("cannot tell the trace format; pass -format")
}

// baselineNames in table order.
var baselineNames = []string{"round-robin", "least-loaded", "consistent-hash", "sglang", "gie", "trtllm", "dynamo"}

// newBaseline builds a baseline for one draw: draw 0 is each policy's own start, and
// a later draw moves what the policy leaves to chance or to its starting state — the
// round-robin counters' start, the random seed, the hash ring's salt, the first of
// equally small trees — as kvroute's draws move its request-id salt.
func newBaseline(name string, cfg FleetConfig, seed uint64, draw int) Policy {
	switch name {
	case "round-robin":
		p := newRoundRobin()
		p.next = draw
		return p
	case "least-loaded":
		p := newLeastLoaded()
		p.rr = draw
		return p
	case "consistent-hash":
		return newConsistentHashSalted(cfg, uint64(draw))
	case "sglang":
		p := newSGLangCacheAware(cfg.Targets())
		p.tieStart = draw
		return p
	case "gie":
		return newGIEDefaultScorers(cfg.Targets(), seed+uint64(draw))
	case "trtllm":
		p := newTRTLLMConversation(cfg.Targets())
		p.rr = draw
		return p
	case "dynamo":
		return newDynamoKV(cfg.Targets(), seed+uint64(draw))
	}
	return nil
}

// drawSalt is kvroute's request-id salt in draw d: -id-salt itself in draw 0.
func drawSalt(base string, d int) string {
	if d == 0 {
		return base
	}
	return base + "d" + strconv.Itoa(d)
}

// atSpeed returns the requests with their arrivals compressed by speed (the
// requests of reqs are at speed 1); the rest is shared.
func atSpeed(reqs []*Request, speed float64) []*Request {
	if speed == 1 {
		return reqs
	}
	out := make([]*Request, len(reqs))
	for i, r := range reqs {
		c := *r
		c.ArrivalMS = r.ArrivalMS / speed
		out[i] = &c
	}
	return out
}

// run loads the trace and replays every selected policy at every speed and draw. The
// report's own results are the first speed's first draw; Cells has them all.
func run(o *options) (*Report, []*Request, error) {
	wantKV, baselines, err := selectPolicies(o.policies)
	if err != nil {
		return nil, nil, err
	}
	var wasm, config []byte
	if wantKV {
		if wasm, err = os.ReadFile(o.wasm); err != nil {
			return nil, nil, fmt.Errorf("%v (run `make build` first)", err)
		}
		if config, err = replayConfig(o.config, o.fleet); err != nil {
			return nil, nil, err
		}
	}
	base, kind, err := loadTrace(o.trace, o.format, o.limit, o.charsPerToken, 1)
	if err != nil {
		return nil, nil, err
	}
	if wantKV && (o.draws > 1 || len(o.speeds) > 1) {
		keepBodies(base) // each kvroute replay sends every body again
	}
	rep := &Report{TraceKind: kind, TracePath: o.trace, Requests: len(base), Fleet: o.fleet, Speed: o.speed,
		BlockTokens: base[0].BlockTokens, Draws: o.draws}
	distinct := map[uint64]struct{}{}
	for _, r := range base {
		rep.Blocks += int64(len(r.Blocks))
		for _, b := range r.Blocks {
			distinct[b] = struct{}{}
		}
	}
	rep.Distinct = len(distinct)
	capBlocks := o.fleet.CacheTokens / rep.BlockTokens
	rep.OracleLRU = OracleHitRate(base, capBlocks*o.fleet.Targets())
	rep.OracleInfinite = OracleHitRate(base, 0)

	for _, speed := range o.speeds {
		reqs := atSpeed(base, speed)
		for d := 0; d < o.draws; d++ {
			rep.Cells = append(rep.Cells, &Cell{Speed: speed, Draw: d, reqs: reqs,
				DurationMS: reqs[len(reqs)-1].ArrivalMS, Baselines: make([]*Result, len(baselines))})
		}
	}
	// kvroute in one goroutine (it holds the one host emulator), cell after cell; the
	// baselines alongside on the remaining cores.
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	if wantKV {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, c := range rep.Cells {
				res, err := replayKVRoute(c.reqs, o.fleet, wasm, config, drawSalt(o.idSalt, c.Draw))
				if err != nil {
					fail(err)
					return
				}
				c.KVRoute = res
			}
		}()
	}
	sem := make(chan struct{}, max(1, runtime.GOMAXPROCS(0)-1))
	for _, c := range rep.Cells {
		for i, name := range baselines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				res, err := Replay(c.reqs, o.fleet, newBaseline(name, o.fleet, o.seed, c.Draw))
				if err != nil {
					fail(err)
					return
				}
				c.Baselines[i] = res
			}()
		}
	}
	wg.Wait()
	if firstErr != nil {
		return nil, nil, firstErr
	}
	first := rep.Cells[0]
	rep.KVRoute, rep.Baselines, rep.DurationMS = first.KVRoute, first.Baselines, first.DurationMS
	for _, c := range rep.Cells {
		if c.KVRoute != nil {
			for _, n := range c.KVRoute.Notes {
				rep.Notes = append(rep.Notes, fmt.Sprintf("speed x%g draw %d: %s", c.Speed, c.Draw, n))
			}
		}
	}
	return rep, first.reqs, nil
}

// replayKVRoute replays reqs through the compiled filter; idSalt goes into the
// request ids (see kvrouteWasm.idSalt).
func replayKVRoute(reqs []*Request, fleet FleetConfig, wasm, config []byte, idSalt string) (res *Result, err error) {
	p, err := newKVRouteWasm(wasm, config, fleet)
	if err != nil {
		return nil, err
	}
	p.idSalt = idSalt
	defer p.Close()
	defer func() {
		// A trap in the guest (its runtime aborting) surfaces as a panic of the emulator.
		if r := recover(); r != nil {
			res, err = nil, fmt.Errorf("the compiled filter crashed in the host emulator after %d requests: %v", len(p.kinds), r)
		}
	}()
	res, err = Replay(reqs, fleet, p)
	if err != nil {
		return nil, err
	}
	if p.err != nil {
		return nil, p.err
	}
	res.Decisions = p.Decisions()
	res.Kinds = p.kinds
	res.Ticks = p.ticks
	res.PD = p.PDSplit()
	if routed := p.Counter("kvroute_requests_routed"); routed != uint64(len(reqs)) {
		return nil, fmt.Errorf("kvroute routed %d of %d requests", routed, len(reqs))
	}
	if n := p.Counter("kvroute_parse_errors"); n > 0 {
		return nil, fmt.Errorf("kvroute failed to parse %d request bodies", n)
	}
	// Every request has completed: the filter's ledger must be back to zero (load is
	// released exactly once) and nothing may have failed over.
	if n := p.Gauge("kvroute_active_requests"); n != 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("kvroute_active_requests is %d after every request completed: load was not released", n))
	}
	for _, c := range []string{"kvroute_state_conflicts", "kvroute_fail_open"} {
		if n := p.Counter(c); n != 0 {
			res.Notes = append(res.Notes, fmt.Sprintf("%s = %d during the replay", c, n))
		}
	}
	return res, nil
}

func selectPolicies(list string) (kvroute bool, baselines []string, err error) {
	if list == "all" {
		return true, baselineNames, nil
	}
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		switch {
		case name == "kvroute":
			kvroute = true
		case newBaseline(name, FleetConfig{Endpoints: 1, DPSize: 1}, 0, 0) != nil:
			baselines = append(baselines, name)
		default:
			return false, nil, fmt.Errorf("unknown policy %q in -policies", name)
		}
	}
	return kvroute, baselines, nil
}
