package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/deploy/tools/validate"
)

// envoyVersion runs `envoy --version` and returns major and minor.
func envoyVersion(t *testing.T, bin string) (int, int, string) {
	t.Helper()
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", bin, err, out)
	}
	m := regexp.MustCompile(`/(\d+)\.(\d+)\.(\d+)/`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("cannot read the version in %q", out)
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	return major, minor, m[1] + "." + m[2] + "." + m[3]
}

func atLeast(major, minor, wantMajor, wantMinor int) bool {
	return major > wantMajor || (major == wantMajor && minor >= wantMinor)
}

// TestEnvoy starts a real Envoy with each shipped bootstrap, the compiled filter and
// two mock workers, and checks from the outside: conversation stickiness, DP rank
// headers, prefill/decode routing, that headers a client spoofs are never honoured,
// and the Prometheus output.
func TestEnvoy(t *testing.T) {
	envoyBin, err := exec.LookPath("envoy")
	if err != nil {
		t.Skip("no envoy binary on PATH; install Envoy >= 1.35 (>= 1.33 for original-dst.yaml) to run the end-to-end test")
	}
	major, minor, version := envoyVersion(t, envoyBin)
	if !atLeast(major, minor, 1, 33) {
		t.Skipf("envoy %s on PATH is older than 1.33, the oldest Envoy the proxy-wasm Go SDK runs in", version)
	}
	root := repoRoot(t)
	dir := t.TempDir()
	wasm := buildModule(t, root)
	mock := buildMockWorker(t, root, dir)

	for _, c := range []struct {
		file         string
		minor        int // lowest Envoy 1.x minor release the file needs
		roleA, roleB string
		dpA, dpB     int
		check        func(t *testing.T, e *envoyRun)
	}{
		{"override-host.yaml", 35, "both", "both", 2, 1, checkRouting},
		{"original-dst.yaml", 33, "both", "both", 2, 1, checkRouting},
		{"pd.yaml", 35, "prefill", "decode", 1, 1, checkPD},
	} {
		t.Run(strings.TrimSuffix(c.file, ".yaml"), func(t *testing.T) {
			if !atLeast(major, minor, 1, c.minor) {
				t.Skipf("%s needs Envoy >= 1.%d, envoy on PATH is %s", c.file, c.minor, version)
			}
			a := startWorker(t, mock, "worker-a", c.roleA, c.dpA)
			b := startWorker(t, mock, "worker-b", c.roleB, c.dpB)
			p := ports{Listener: freePort(t), Admin: freePort(t), A: a.Addr, B: b.Addr, Wasm: wasm}
			cfg := filepath.Join(t.TempDir(), c.file+".json")
			if err := os.WriteFile(cfg, rewriteBootstrap(t, filepath.Join(root, "deploy", "envoy", c.file), p), 0o644); err != nil {
				t.Fatal(err)
			}
			e := startEnvoy(t, envoyBin, root, cfg, p)
			e.a, e.b = a, b
			c.check(t, e)
		})
	}
}

type envoyRun struct {
	base, admin string // http://127.0.0.1:port
	log         string
	a, b        worker
}

func startEnvoy(t *testing.T, bin, root, cfg string, p ports) *envoyRun {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "envoy.log")
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "-c", cfg, "--use-dynamic-base-id", "--concurrency", "2",
		"--log-level", "info", "--log-path", logPath)
	cmd.Dir = root
	out, err := os.Create(filepath.Join(t.TempDir(), "envoy.stdout"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	e := &envoyRun{
		base:  fmt.Sprintf("http://127.0.0.1:%d", p.Listener),
		admin: fmt.Sprintf("http://127.0.0.1:%d", p.Admin),
		log:   logPath,
	}
	t.Cleanup(func() {
		cancel()
		<-exited
		out.Close()
		if t.Failed() {
			for _, f := range []string{logPath, out.Name()} {
				if b, err := os.ReadFile(f); err == nil {
					t.Logf("%s:\n%s", filepath.Base(f), tail(string(b), 80))
				}
			}
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-exited:
			exited <- err
			b, _ := os.ReadFile(logPath)
			t.Fatalf("envoy exited while starting (%v):\n%s", err, tail(string(b), 80))
		default:
		}
		r, err := client.Get(e.admin + "/stats?filter=" + url.QueryEscape(`^wasmcustom\.kvroute_requests_routed$`))
		if err == nil {
			body := readAll(r)
			if r.StatusCode == 200 && strings.Contains(body, "wasmcustom.kvroute_requests_routed") {
				if rr, err := client.Get(e.admin + "/ready"); err == nil && rr.StatusCode == 200 {
					rr.Body.Close()
					return e
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("envoy did not become ready with the kvroute filter loaded within 60s")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func readAll(r *http.Response) string {
	defer r.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			return sb.String()
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stat reads one counter or gauge from the admin /stats (0 when absent).
func (e *envoyRun) stat(t *testing.T, name string) int {
	t.Helper()
	r, err := client.Get(e.admin + "/stats?filter=" + url.QueryEscape("^"+regexp.QuoteMeta(name)+"$"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(readAll(r), "\n") {
		if k, v, ok := strings.Cut(l, ": "); ok && k == name {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

func (e *envoyRun) chat(t *testing.T, text string, headers map[string]string) reply {
	t.Helper()
	r := do(t, http.MethodPost, e.base+"/v1/chat/completions", chatBody(text), headers)
	if r.Status != 200 {
		t.Fatalf("POST /v1/chat/completions: %d %v %s", r.Status, r.Header, r.Body)
	}
	return r
}

type target struct {
	worker, rank string
}

func (r reply) target() target {
	return target{r.Header.Get("x-mock-served-by"), r.Header.Get("x-mock-dp-rank")}
}

// checkRouting runs against override-host.yaml and original-dst.yaml: worker A has two
// DP ranks, worker B one.
func checkRouting(t *testing.T, e *envoyRun) {
	addrOf := map[string]string{e.a.Name: e.a.Addr, e.b.Name: e.b.Addr}

	// Six new conversations, four turns each, one at a time.
	first := map[string]target{}
	covered := map[target]bool{}
	for i := 0; i < 6; i++ {
		conv := fmt.Sprintf("conv-%d", i)
		for turn := 0; turn < 4; turn++ {
			r := e.chat(t, fmt.Sprintf("%s turn %d", conv, turn), map[string]string{"x-session-id": conv})
			tg := r.target()
			wantDecision := "sticky"
			if turn == 0 {
				wantDecision = "new-conversation"
				first[conv] = tg
				covered[tg] = true
			} else if tg != first[conv] {
				t.Fatalf("%s turn %d went to %v, its first turn to %v: not sticky", conv, turn, tg, first[conv])
			}
			if got := r.saw("x-kvroute-decision"); got != wantDecision {
				t.Errorf("%s turn %d: decision %q, want %q", conv, turn, got, wantDecision)
			}
			if got := r.Header.Get("x-kvroute-decision"); got != wantDecision {
				t.Errorf("%s turn %d: the response's x-kvroute-decision is %q, want %q", conv, turn, got, wantDecision)
			}
			if got := r.saw("x-gateway-destination-endpoint"); got != addrOf[tg.worker] {
				t.Errorf("%s turn %d: served by %s (%s) but the destination header said %q", conv, turn, tg.worker, addrOf[tg.worker], got)
			}
			switch tg.worker {
			case e.a.Name: // dp_size 2: the rank header names the rank that served
				if got := r.saw("x-data-parallel-rank"); got != tg.rank {
					t.Errorf("%s turn %d: worker A (dp_size 2) served rank %s, rank header %q", conv, turn, tg.rank, got)
				}
			case e.b.Name: // dp_size 1: no rank header at all
				if r.sawPresent("x-data-parallel-rank") {
					t.Errorf("%s turn %d: worker B (dp_size 1) received x-data-parallel-rank %q", conv, turn, r.saw("x-data-parallel-rank"))
				}
			default:
				t.Fatalf("%s turn %d: served by %q", conv, turn, tg.worker)
			}
		}
	}
	for _, want := range []target{{e.a.Name, "0"}, {e.a.Name, "1"}, {e.b.Name, "0"}} {
		if !covered[want] {
			t.Errorf("new conversations never started on %v (round robin over the three targets): %v", want, covered)
		}
	}

	// Spoofed headers on a routed request: ignored, the conversation stays put.
	var pinned string
	for conv, tg := range first {
		if tg.worker == e.a.Name && tg.rank == "1" {
			pinned = conv
		}
	}
	if pinned != "" {
		r := e.chat(t, pinned+" spoofed", map[string]string{
			"x-session-id":                   pinned,
			"x-gateway-destination-endpoint": e.b.Addr,
			"x-data-parallel-rank":           "0",
			"x-kvroute-decision":             "spoofed",
			"x-prefiller-host-port":          "192.0.2.1:9",
			"x-prefiller-data-parallel-rank": "3",
		})
		if r.target() != first[pinned] || r.saw("x-gateway-destination-endpoint") != e.a.Addr ||
			r.saw("x-data-parallel-rank") != "1" || r.saw("x-kvroute-decision") != "sticky" ||
			r.sawPresent("x-prefiller-host-port") || r.sawPresent("x-prefiller-data-parallel-rank") {
			t.Errorf("spoofed routed request: served by %v, worker saw %v", r.target(), r.Header)
		}
	}

	// Spoofed headers on requests kvroute does not route (GET): they must not reach a
	// worker, and a destination naming Envoy's own admin port must not be followed.
	adminAddr := strings.TrimPrefix(e.admin, "http://")
	for i := 0; i < 6; i++ {
		r := do(t, http.MethodGet, e.base+"/v1/chat/completions", "", map[string]string{
			"x-gateway-destination-endpoint": adminAddr,
			"x-data-parallel-rank":           "1",
			"x-kvroute-decision":             "spoofed",
			"x-prefiller-host-port":          adminAddr,
		})
		if r.Header.Get("x-mock-served-by") == "" {
			t.Fatalf("GET with a spoofed destination was not served by a worker: %d %v %q", r.Status, r.Header, tail(r.Body, 5))
		}
		for _, h := range []string{"x-gateway-destination-endpoint", "x-data-parallel-rank", "x-kvroute-decision", "x-prefiller-host-port"} {
			if r.sawPresent(h) {
				t.Errorf("unrouted GET: the worker received the client's %s: %q", h, r.saw(h))
			}
		}
		if r.Header.Get("x-mock-dp-rank") != "0" {
			t.Errorf("unrouted GET: the worker saw DP rank %q", r.Header.Get("x-mock-dp-rank"))
		}
	}

	// Metrics: counters, and the per-target gauges with endpoint and rank as labels.
	if n := e.stat(t, "wasmcustom.kvroute_requests_routed"); n < 25 {
		t.Errorf("wasmcustom.kvroute_requests_routed = %d, want >= 25", n)
	}
	if n := e.stat(t, "wasmcustom.kvroute_decision_sticky"); n < 18 {
		t.Errorf("wasmcustom.kvroute_decision_sticky = %d, want >= 18", n)
	}
	prom := readAll(mustGet(t, e.admin+"/stats/prometheus"))
	for _, tg := range []target{{e.a.Addr, "0"}, {e.a.Addr, "1"}, {e.b.Addr, "0"}} {
		ep := strings.NewReplacer(".", "_", ":", "_").Replace(tg.worker)
		for _, family := range validate.TargetGaugeFamilies {
			found := false
			for _, l := range strings.Split(prom, "\n") {
				if strings.HasPrefix(l, family+"{") &&
					strings.Contains(l, `kvroute_endpoint="`+ep+`"`) && strings.Contains(l, `kvroute_rank="`+tg.rank+`"`) {
					found = true
				}
			}
			if !found {
				t.Errorf("/stats/prometheus has no %s{kvroute_endpoint=%q,kvroute_rank=%q}:\n%s", family, ep, tg.rank, grep(prom, "kvroute"))
			}
		}
	}
	if !regexp.MustCompile(`(?m)^kvroute_requests_routed(\{\})? \d+`).MatchString(prom) {
		t.Errorf("/stats/prometheus has no kvroute_requests_routed:\n%s", grep(prom, "kvroute"))
	}
}

// checkPD runs against pd.yaml: worker A is the prefill worker, worker B the decode one.
func checkPD(t *testing.T, e *envoyRun) {
	before := e.stat(t, "cluster.kvroute_prefill.upstream_rq_completed")
	short := e.chat(t, "a short question", map[string]string{"x-session-id": "pd-short"})
	d := short.saw("x-kvroute-decision")
	if !strings.Contains(d, ";pd=") {
		// pd.yaml turns disaggregation on, so every decision must say direct or
		// disaggregated: without the suffix the filter ran without its P/D config.
		t.Fatalf("short prompt: decision %q has no ;pd= suffix, want %q with disaggregation on", d, ";pd=direct")
	}
	if short.Header.Get("x-mock-served-by") != e.b.Name || !strings.HasSuffix(d, ";pd=direct") || short.Header.Get("x-mock-leg") != "direct" {
		t.Errorf("short prompt: served by %s, leg %s, decision %q; want the decode worker, direct",
			short.Header.Get("x-mock-served-by"), short.Header.Get("x-mock-leg"), d)
	}
	if n := e.stat(t, "cluster.kvroute_prefill.upstream_rq_completed"); n != before {
		t.Errorf("short prompt: %d prefill calls, want none", n-before)
	}

	long := e.chat(t, strings.Repeat("a long shared document. ", 400), map[string]string{"x-session-id": "pd-long"})
	d = long.saw("x-kvroute-decision")
	if long.Header.Get("x-mock-served-by") != e.b.Name || !strings.HasSuffix(d, ";pd=disaggregated") ||
		long.Header.Get("x-mock-leg") != "vllm-decode" || long.saw("x-gateway-destination-endpoint") != e.b.Addr {
		t.Errorf("long prompt: served by %s, leg %s, decision %q, destination %q; want the decode worker's vllm-decode leg (kv_transfer_params from the prefill)",
			long.Header.Get("x-mock-served-by"), long.Header.Get("x-mock-leg"), d, long.saw("x-gateway-destination-endpoint"))
	}
	if n := e.stat(t, "cluster.kvroute_prefill.upstream_rq_completed"); n != before+1 {
		t.Errorf("long prompt: %d prefill calls through kvroute_prefill, want 1", n-before)
	}
	// The prefill went to the prefill worker: its host in kvroute_prefill served it.
	clusters := readAll(mustGet(t, e.admin+"/clusters"))
	if !strings.Contains(clusters, "kvroute_prefill::"+e.a.Addr+"::rq_total::1") {
		t.Errorf("/clusters does not show one request to the prefill worker %s:\n%s", e.a.Addr, grep(clusters, "kvroute_prefill::"))
	}

	// Engine metrics (enabled in pd.yaml): both workers' /metrics are scraped through
	// the ORIGINAL_DST cluster kvroute_metrics, each at the address the filter named.
	deadline := time.Now().Add(10 * time.Second)
	for {
		clusters = readAll(mustGet(t, e.admin+"/clusters"))
		if scraped(clusters, e.a.Addr) && scraped(clusters, e.b.Addr) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("kvroute_metrics did not scrape both workers within 10s:\n%s", grep(clusters, "kvroute_metrics::"))
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if n := e.stat(t, "cluster.kvroute_metrics.upstream_rq_2xx"); n < 2 {
		t.Errorf("cluster.kvroute_metrics.upstream_rq_2xx = %d, want >= 2", n)
	}
}

// scraped says whether /clusters shows a completed request to addr in kvroute_metrics.
func scraped(clusters, addr string) bool {
	for _, l := range strings.Split(clusters, "\n") {
		if rest, ok := strings.CutPrefix(l, "kvroute_metrics::"+addr+"::rq_success::"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(rest))
			return n > 0
		}
	}
	return false
}

func mustGet(t *testing.T, url string) *http.Response {
	t.Helper()
	r, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
