package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/kvroute/kvroute/routing/hashx"
)

// Several gateway replicas (-replicas K): K copies of the compiled filter, each in its
// own child process (its own host emulator, VM and shared data — replicas share
// nothing, as K Envoys would), in front of one modelled fleet. Each request goes to a
// replica chosen uniformly at random (seeded by -seed and the request's index, so every
// configuration compared sees the same spread) and its completion goes back to the
// same replica. With engine_metrics on, the replicas' scrapes read the fleet model:
// per DP rank, running = in flight − waiting, waiting, and the KV use of the running
// requests — the load all the replicas put on the engines, which no single replica's
// ledger sees.

// replicaVariant is one configuration of the replicas, patched into the replay config.
type replicaVariant struct {
	Key       string // its -replica-configs name
	FirstTurn string // conversation.first_turn
	Engine    bool   // engine_metrics.enabled (interval_ms 1000, stale_ms 5000)
}

// replicaVariants in table order.
var replicaVariants = []replicaVariant{
	{"round_robin", "round_robin", false},
	{"hash", "hash", false},
	{"round_robin+metrics", "round_robin", true},
	{"hash+metrics", "hash", true},
}

// Engine metrics settings of the variants that turn them on (the config's defaults).
const (
	replicaScrapeIntervalMS = 1000
	replicaScrapeStaleMS    = 5000
)

// Label is the variant's row name for k replicas.
func (v replicaVariant) Label(k int) string {
	s := fmt.Sprintf("kvroute x%d (%s", k, v.FirstTurn)
	if v.Engine {
		s += " + engine metrics"
	}
	return s + ")"
}

// selectReplicaVariants parses -replica-configs.
func selectReplicaVariants(list string) ([]replicaVariant, error) {
	if strings.TrimSpace(list) == "all" {
		return replicaVariants, nil
	}
	var out []replicaVariant
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		found := false
		for _, v := range replicaVariants {
			if v.Key == name {
				out, found = append(out, v), true
			}
		}
		if !found {
			var keys []string
			for _, v := range replicaVariants {
				keys = append(keys, v.Key)
			}
			return nil, fmt.Errorf("unknown replica config %q in -replica-configs (%s, or all)", name, strings.Join(keys, ", "))
		}
	}
	return out, nil
}

// variantConfig patches the replay config (replayConfig's output) for v.
func variantConfig(base []byte, v replicaVariant) ([]byte, error) {
	var doc map[string]any
	if err := json.Unmarshal(base, &doc); err != nil {
		return nil, err
	}
	section := func(name string) map[string]any {
		m, _ := doc[name].(map[string]any)
		if m == nil {
			m = map[string]any{}
			doc[name] = m
		}
		return m
	}
	section("conversation")["first_turn"] = v.FirstTurn
	em := section("engine_metrics")
	em["enabled"] = v.Engine
	if v.Engine {
		em["interval_ms"] = replicaScrapeIntervalMS
		em["stale_ms"] = replicaScrapeStaleMS
	}
	return json.Marshal(doc)
}

// replicaOf is the replica request index goes to: uniform, fixed by seed and index.
func replicaOf(seed uint64, index, k int) int {
	return int(hashx.Mix64(seed^(uint64(index)+1)*0x9e3779b97f4a7c15) % uint64(k))
}

// enginePage is endpoint e's vLLM metrics page as the fleet model has it now: per DP
// rank (vLLM's engine label) the requests running (in flight and past their prefill
// queue), waiting, the KV-cache use of the running requests, and the prefix cache's
// size as vLLM's cache_config_info gives it (16-token blocks, summed over the engines).
func enginePage(f *Fleet, e int) []byte {
	dp := f.cfg.DPSize
	var b bytes.Buffer
	series := []struct{ name, help string }{
		{"vllm:num_requests_running", "Number of requests in model execution batches."},
		{"vllm:num_requests_waiting", "Number of requests waiting to be processed."},
		{"vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."},
	}
	for i, s := range series {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n", s.name, s.help, s.name)
		for r := 0; r < dp; r++ {
			t := e*dp + r
			var v string
			switch i {
			case 0:
				v = strconv.Itoa(f.InFlight(t)-f.Waiting(t)) + ".0"
			case 1:
				v = strconv.Itoa(f.Waiting(t)) + ".0"
			default:
				v = strconv.FormatFloat(f.KVUtilization(t), 'g', 6, 64)
			}
			fmt.Fprintf(&b, "%s{engine=\"%d\",model_name=\"m\"} %s\n", s.name, r, v)
		}
	}
	b.WriteString("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n")
	for r := 0; r < dp; r++ { // vLLM's num_gpu_blocks: the sum over the server's engines
		fmt.Fprintf(&b, "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"%d\",num_gpu_blocks=\"%d\"} 1.0\n", r, dp*f.cfg.CacheTokens/16)
	}
	return b.Bytes()
}

// replicaChild is one replica process.
type replicaChild struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	conn   *replicaConn
	stderr *tailBuffer
}

// replicaPolicy is the K replicas as one Policy.
type replicaPolicy struct {
	name      string
	cfg       FleetConfig
	seed      uint64
	kids      []*replicaChild
	fleet     *Fleet         // the replay's fleet, for the clock and the metrics pages
	home      map[int]int    // request index → replica, until its completion
	endpoints map[string]int // address → endpoint index
	kinds     []string       // decision header per request index
	perKid    []int          // requests per replica
	pages     int            // metrics pages served
	err       error          // the first failure; the replay's caller reports it
}

// startReplicas starts k children of exe (this program, or the test binary) with the
// config file configPath.
func startReplicas(name string, k int, exe, wasmPath, configPath string, cfg FleetConfig, seed uint64, idSalt string) (*replicaPolicy, error) {
	p := &replicaPolicy{name: name, cfg: cfg, seed: seed, home: map[int]int{}, endpoints: map[string]int{}, perKid: make([]int, k)}
	for e := 0; e < cfg.Endpoints; e++ {
		p.endpoints[cfg.Address(e)] = e
	}
	for i := 0; i < k; i++ {
		cmd := exec.Command(exe, "-replica", "-wasm", wasmPath, "-config", configPath,
			"-endpoints", strconv.Itoa(cfg.Endpoints), "-dp", strconv.Itoa(cfg.DPSize), "-id-salt", idSalt)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			p.Close()
			return nil, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			p.Close()
			return nil, err
		}
		kid := &replicaChild{cmd: cmd, stdin: stdin, conn: newReplicaConn(stdout, stdin), stderr: &tailBuffer{max: 4096}}
		cmd.Stderr = kid.stderr
		if err := cmd.Start(); err != nil {
			p.Close()
			return nil, fmt.Errorf("starting replica %d: %v", i, err)
		}
		p.kids = append(p.kids, kid)
	}
	// Every child answers S once its filter has started: a refused config shows here.
	for i := range p.kids {
		if _, err := p.stats(i); err != nil {
			p.Close()
			return nil, err
		}
	}
	return p, nil
}

func (p *replicaPolicy) Name() string { return p.name }

func (p *replicaPolicy) fail(i int, err error) {
	if p.err == nil {
		msg := strings.TrimSpace(p.kids[i].stderr.String())
		if msg != "" {
			err = fmt.Errorf("%v (replica stderr: %s)", err, msg)
		}
		p.err = fmt.Errorf("%s, replica %d: %v", p.name, i, err)
	}
}

// await reads replica i's messages up to one of kind want, serving metrics pages.
func (p *replicaPolicy) await(i int, want string) (*replicaMsg, error) {
	c := p.kids[i].conn
	for {
		m, err := c.Receive()
		if err != nil {
			return nil, err
		}
		switch m.Kind {
		case want:
			return m, nil
		case "E":
			return nil, fmt.Errorf("%s", m.Text)
		case "M":
			e, ok := p.endpoints[m.Text]
			if !ok || p.fleet == nil {
				return nil, fmt.Errorf("a scrape of %q, not a fleet endpoint", m.Text)
			}
			p.pages++
			if err := c.Send(&replicaMsg{Kind: "P", Body: enginePage(p.fleet, e)}); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("unexpected message %q (waiting for %q)", m.Kind, want)
		}
	}
}

func (p *replicaPolicy) Choose(r *Request, f *Fleet) int {
	p.fleet = f
	if p.err != nil {
		return 0
	}
	i := replicaOf(p.seed, r.Index, len(p.kids))
	p.home[r.Index] = i
	p.perKid[i]++
	err := p.kids[i].conn.Send(&replicaMsg{Kind: "C", Index: r.Index, TimeMS: f.Now(), Path: r.Path, Headers: r.Headers, Body: r.Body()})
	if err != nil {
		p.fail(i, err)
		return 0
	}
	m, err := p.await(i, "T")
	if err != nil {
		p.fail(i, err)
		return 0
	}
	for len(p.kinds) <= r.Index {
		p.kinds = append(p.kinds, "")
	}
	p.kinds[r.Index] = m.Text
	return m.Target
}

// FirstToken tells the replica that routed r of its first response chunk.
func (p *replicaPolicy) FirstToken(r *Request, _ int) {
	i, ok := p.home[r.Index]
	if !ok || p.err != nil {
		return
	}
	if err := p.kids[i].conn.Send(&replicaMsg{Kind: "F", Index: r.Index, TimeMS: p.fleet.Now()}); err != nil {
		p.fail(i, err)
		return
	}
	if _, err := p.await(i, "ok"); err != nil {
		p.fail(i, err)
	}
}

func (p *replicaPolicy) Done(r *Request, _ int) {
	i, ok := p.home[r.Index]
	if !ok || p.err != nil {
		return
	}
	delete(p.home, r.Index)
	if err := p.kids[i].conn.Send(&replicaMsg{Kind: "D", Index: r.Index, TimeMS: p.fleet.Now()}); err != nil {
		p.fail(i, err)
		return
	}
	if _, err := p.await(i, "ok"); err != nil {
		p.fail(i, err)
	}
}

// stats asks replica i for its counters.
func (p *replicaPolicy) stats(i int) (replicaStats, error) {
	var st replicaStats
	if err := p.kids[i].conn.Send(&replicaMsg{Kind: "S"}); err != nil {
		p.fail(i, err)
		return st, p.err
	}
	m, err := p.await(i, "S")
	if err != nil {
		p.fail(i, err)
		return st, p.err
	}
	if m.Stats == nil {
		p.fail(i, fmt.Errorf("replica protocol: an S reply without stats"))
		return st, p.err
	}
	return *m.Stats, nil
}

// Close ends the children: each exits when its stdin closes.
func (p *replicaPolicy) Close() {
	for _, k := range p.kids {
		_ = k.stdin.Close()
	}
	for _, k := range p.kids {
		_ = k.cmd.Wait()
	}
	p.kids = nil
}

// replicaRun is one variant's replay.
type replicaRun struct {
	Variant replicaVariant
	Result  *Result
	Stats   []replicaStats // per replica
	PerKid  []int          // requests per replica
	Pages   int            // metrics pages served
}

// runReplicas replays reqs through every selected variant with o.replicas replicas,
// the variants side by side (each is one busy process at a time).
func runReplicas(o *options, reqs []*Request) ([]*replicaRun, error) {
	variants, err := selectReplicaVariants(o.replicaConfigs)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(o.wasm); err != nil {
		return nil, fmt.Errorf("%v (run `make build` first)", err)
	}
	base, err := replayConfig(o.config, o.fleet)
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	runs := make([]*replicaRun, len(variants))
	errs := make([]error, len(variants))
	sem := make(chan struct{}, max(1, runtime.GOMAXPROCS(0)))
	var wg sync.WaitGroup
	for i, v := range variants {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			runs[i], errs[i] = replayReplicas(reqs, o, exe, base, v)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return runs, nil
}

func replayReplicas(reqs []*Request, o *options, exe string, base []byte, v replicaVariant) (*replicaRun, error) {
	config, err := variantConfig(base, v)
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp("", "kvroute-replica-*.json")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(config); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	name := v.Label(o.replicas)
	p, err := startReplicas(name, o.replicas, exe, o.wasm, f.Name(), o.fleet, o.seed, o.idSalt)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	defer p.Close()
	res, err := Replay(reqs, o.fleet, p)
	if err == nil {
		err = p.err
	}
	if err != nil {
		return nil, err
	}
	run := &replicaRun{Variant: v, Result: res, PerKid: p.perKid, Pages: p.pages}
	var routed uint64
	sum := map[string]uint64{}
	for i := range p.kids {
		st, err := p.stats(i)
		if err != nil {
			return nil, err
		}
		run.Stats = append(run.Stats, st)
		routed += st.Routed
		for _, c := range st.Decisions {
			sum[c.Name] += c.N
		}
		res.Ticks += st.Ticks
		if st.ParseErrors > 0 {
			return nil, fmt.Errorf("%s: replica %d failed to parse %d request bodies", name, i, st.ParseErrors)
		}
		if st.ActiveRequests != 0 {
			res.Notes = append(res.Notes, fmt.Sprintf("%s: replica %d: kvroute_active_requests is %d after every request completed", name, i, st.ActiveRequests))
		}
		if st.FailOpen+st.StateConflicts != 0 {
			res.Notes = append(res.Notes, fmt.Sprintf("%s: replica %d: kvroute_fail_open %d, kvroute_state_conflicts %d", name, i, st.FailOpen, st.StateConflicts))
		}
		if st.LateScrapes != 0 {
			res.Notes = append(res.Notes, fmt.Sprintf("%s: replica %d: %d scrape intervals without a scrape", name, i, st.LateScrapes))
		}
	}
	if routed != uint64(len(reqs)) {
		return nil, fmt.Errorf("%s: the replicas routed %d of %d requests", name, routed, len(reqs))
	}
	for _, k := range decisionKinds {
		k = strings.ReplaceAll(k, "_", "-")
		res.Decisions = append(res.Decisions, Count{k, sum[k]})
	}
	res.Kinds = p.kinds
	return run, nil
}

// writeReplicaTable prints the replica runs next to the single-replica kvroute row.
func writeReplicaTable(w io.Writer, rep *Report, o *options, runs []*replicaRun) {
	fmt.Fprintf(w, "\nSeveral gateway replicas: %d replicas (separate VMs and shared data), each request to one at random (seed %d), its completion to the same\n",
		o.replicas, o.seed)
	if rep.TraceKind == "mooncake" || rep.TraceKind == "azure" {
		fmt.Fprintf(w, "  (a %s trace has no conversation ids: conversation.first_turn plays no part)\n", rep.TraceKind)
	}
	fmt.Fprintf(w, "  engine metrics: every replica scrapes every endpoint every %d ms of replay time (stale after %d ms)\n\n",
		replicaScrapeIntervalMS, replicaScrapeStaleMS)
	const rowFormat = "%-44s %8s %7s %9s %9s %9s %9s %9s %8s %8s\n"
	fmt.Fprintf(w, rowFormat, "policy", "hit rate", "/oracle", "/infinite", "work", "in-flight", "in-flight", "TTFT mean", "TTFT p50", "TTFT p99")
	fmt.Fprintf(w, rowFormat, "", "", "", "", "max/mean", "max/mean", "mean", "ms", "ms", "ms")
	fmt.Fprintln(w, strings.Repeat("-", 125))
	rows := []*Result{}
	if rep.KVRoute != nil {
		rows = append(rows, rep.KVRoute)
	}
	for _, r := range runs {
		rows = append(rows, r.Result)
	}
	for _, r := range rows {
		name := r.Policy
		if r == rep.KVRoute {
			name = "kvroute (1 replica, -config as given)"
		}
		fmt.Fprintf(w, rowFormat, name, f4(r.HitRate()), f3(ratio(r.HitRate(), rep.OracleLRU)), f3(ratio(r.HitRate(), rep.OracleInfinite)),
			f3(r.WorkImbalance()), f3(r.LoadImbalance()), f3(mean(r.MeanInFlight)),
			f0(r.TTFTMean()), f0(r.TTFTQuantile(0.5)), f0(r.TTFTQuantile(0.99)))
	}
	for _, run := range runs {
		r := run.Result
		fmt.Fprintf(w, "\n%s decisions:", r.Policy)
		writeDecisionMix(w, r.Decisions)
		fmt.Fprintf(w, "\n  requests per replica:")
		for _, n := range run.PerKid {
			fmt.Fprintf(w, " %d", n)
		}
		fmt.Fprintf(w, "; per target:")
		for _, n := range r.Assigned {
			fmt.Fprintf(w, " %d", n)
		}
		if run.Variant.Engine {
			scrapes, extra := 0, 0
			for _, st := range run.Stats {
				scrapes += st.Scrapes
				extra += st.ExtraTicks
			}
			fmt.Fprintf(w, "\n  scrapes answered %d (%d pages); %d timer ticks, %d more to bring the scrapes on", scrapes, run.Pages, r.Ticks, extra)
		}
		fmt.Fprintln(w)
		for _, n := range r.Notes {
			fmt.Fprintf(w, "NOTE: %s\n", n)
		}
	}
}

// tailBuffer keeps the last max bytes written to it (a child's stderr).
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
