// Package e2e runs the shipped Envoy configurations in a real Envoy with the compiled
// filter in front of two mock workers (cmd/kvroute-mockworker). The Envoy test needs an
// envoy binary (>= 1.33; >= 1.35 for the override_host configurations) on PATH and
// skips otherwise; the harness it relies on (building and starting the workers,
// rewriting the shipped configurations onto free ports) is tested on every run.
package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/deploy/tools/validate"
)

// The shipped configurations use these addresses; the tests move them to free ports.
const (
	shippedWorkerA = "127.0.0.1:8001"
	shippedWorkerB = "127.0.0.1:8002"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := validate.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// goBuild builds a package of the kvroute module (run in the repository root) into dir.
func goBuild(t *testing.T, root, dir, out, pkg string) string {
	t.Helper()
	dst := filepath.Join(dir, out)
	cmd := exec.Command("go", "build", "-trimpath", "-o", dst, pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return dst
}

// buildModule builds the filter as operators get it, with `make build` (which patches
// Go's wasip1 runtime for older Envoy releases), and returns its path.
func buildModule(t *testing.T, root string) string {
	t.Helper()
	cmd := exec.Command("make", "build")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, b)
	}
	return filepath.Join(root, "build", "kvroute.wasm")
}

// buildMockWorker builds cmd/kvroute-mockworker.
func buildMockWorker(t *testing.T, root, dir string) string {
	t.Helper()
	if _, err := os.Stat(filepath.Join(root, "cmd", "kvroute-mockworker")); err != nil {
		t.Fatalf("cmd/kvroute-mockworker is missing from the repository: %v", err)
	}
	return goBuild(t, root, dir, "kvroute-mockworker", "./cmd/kvroute-mockworker")
}

// worker is a running mock worker.
type worker struct {
	Addr string // host:port it listens on
	Name string
}

// startWorker starts a mock worker on a free loopback port and waits for its
// announcement ("kvroute-mockworker listening on ADDR ...").
func startWorker(t *testing.T, bin, name, role string, dpSize int) worker {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "-listen", "127.0.0.1:0", "-role", role, "-name", name, "-dp-size", strconv.Itoa(dpSize))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	select {
	case l := <-lines:
		const prefix = "kvroute-mockworker listening on "
		if !strings.HasPrefix(l, prefix) {
			t.Fatalf("mock worker %s: unexpected first line %q", name, l)
		}
		addr := strings.Fields(strings.TrimPrefix(l, prefix))[0]
		return worker{Addr: addr, Name: name}
	case <-time.After(20 * time.Second):
		t.Fatalf("mock worker %s did not announce its address", name)
	}
	return worker{}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) uint32 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint32(l.Addr().(*net.TCPAddr).Port)
}

// ports of one Envoy run.
type ports struct {
	Listener, Admin uint32
	A, B            string // the workers standing in for 127.0.0.1:8001 and :8002
	Wasm            string // the compiled filter
}

// rewriteBootstrap loads a shipped bootstrap and moves it onto the test's ports:
// listener and admin on free loopback ports, the two shipped worker addresses onto the
// mock workers (in the clusters and in the plugin configuration alike), the filter
// loaded from the freshly built wasm. Nothing else changes. It returns Envoy JSON.
func rewriteBootstrap(t *testing.T, path string, p ports) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSONStrict(raw)
	if err != nil {
		t.Fatal(err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := validate.UnmarshalEnvoy(js, b, 0); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	workerPort := map[uint32]string{8001: p.A, 8002: p.B}
	moveSocket := func(sa *corev3.SocketAddress) {
		if sa == nil || sa.GetAddress() != "127.0.0.1" {
			return
		}
		if to, ok := workerPort[sa.GetPortValue()]; ok {
			host, port, _ := net.SplitHostPort(to)
			n, _ := strconv.Atoi(port)
			sa.Address = host
			sa.PortSpecifier = &corev3.SocketAddress_PortValue{PortValue: uint32(n)}
		}
	}
	b.GetAdmin().GetAddress().GetSocketAddress().PortSpecifier = &corev3.SocketAddress_PortValue{PortValue: p.Admin}
	replacer := strings.NewReplacer(`"`+shippedWorkerA+`"`, `"`+p.A+`"`, `"`+shippedWorkerB+`"`, `"`+p.B+`"`)
	for _, l := range b.GetStaticResources().GetListeners() {
		sa := l.GetAddress().GetSocketAddress()
		sa.Address = "127.0.0.1"
		sa.PortSpecifier = &corev3.SocketAddress_PortValue{PortValue: p.Listener}
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig().MessageIs(hcm) {
					mustUnpack(t, f.GetTypedConfig(), hcm)
					for _, hf := range hcm.GetHttpFilters() {
						w := &wasmfilterv3.Wasm{}
						if !hf.GetTypedConfig().MessageIs(w) {
							continue
						}
						mustUnpack(t, hf.GetTypedConfig(), w)
						w.GetConfig().GetVmConfig().GetCode().GetLocal().Specifier = &corev3.DataSource_Filename{Filename: p.Wasm}
						sv := &wrapperspb.StringValue{}
						mustUnpack(t, w.GetConfig().GetConfiguration(), sv)
						sv.Value = replacer.Replace(sv.GetValue())
						w.GetConfig().Configuration = mustAny(t, sv)
						hf.ConfigType = &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, w)}
					}
					f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, hcm)}
				}
			}
		}
	}
	for _, c := range b.GetStaticResources().GetClusters() {
		for _, lle := range c.GetLoadAssignment().GetEndpoints() {
			for _, le := range lle.GetLbEndpoints() {
				moveSocket(le.GetEndpoint().GetAddress().GetSocketAddress())
			}
		}
	}
	out, err := protojson.MarshalOptions{Resolver: protoregistry.GlobalTypes, Indent: "  "}.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	// The moved configuration must still pass every check the shipped one passes.
	if _, err := validate.CheckBootstrap(path+" (moved)", out); err != nil {
		t.Fatal(err)
	}
	return out
}

func mustUnpack(t *testing.T, a *anypb.Any, m proto.Message) {
	t.Helper()
	if err := a.UnmarshalTo(m); err != nil {
		t.Fatal(err)
	}
}

func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// reply is what a request through Envoy (or straight to a worker) returned.
type reply struct {
	Status int
	Header http.Header
	Body   string
}

// saw is the value of a request header as the worker received it ("" when absent).
func (r reply) saw(h string) string { return r.Header.Get("x-mock-saw-" + h) }

// sawPresent says whether the worker received header h at all.
func (r reply) sawPresent(h string) bool { return len(r.Header.Values("x-mock-saw-"+h)) > 0 }

var client = &http.Client{Timeout: 60 * time.Second}

func do(t *testing.T, method, url, body string, headers map[string]string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}
}

func chatBody(text string) string {
	return fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"max_tokens":8}`, text)
}

// TestHarness checks what the Envoy test stands on, without Envoy: the mock worker
// builds and answers as the test expects, and every shipped bootstrap moves onto free
// ports and still passes validation.
func TestHarness(t *testing.T) {
	root := repoRoot(t)
	bin := buildMockWorker(t, root, t.TempDir())
	var wg sync.WaitGroup
	var a, b worker
	wg.Add(2)
	go func() { defer wg.Done(); a = startWorker(t, bin, "wa", "both", 2) }()
	go func() { defer wg.Done(); b = startWorker(t, bin, "wb", "both", 1) }()
	wg.Wait()
	if t.Failed() {
		return
	}
	r := do(t, http.MethodPost, "http://"+a.Addr+"/v1/chat/completions", chatBody("hi"),
		map[string]string{"x-data-parallel-rank": "1", "x-gateway-destination-endpoint": a.Addr, "x-kvroute-decision": "sticky"})
	if r.Status != 200 || r.Header.Get("x-mock-served-by") != "wa" || r.Header.Get("x-mock-dp-rank") != "1" ||
		r.saw("x-gateway-destination-endpoint") != a.Addr || r.saw("x-kvroute-decision") != "sticky" || r.Header.Get("x-mock-leg") != "direct" {
		t.Fatalf("mock worker reply: %d %v %s", r.Status, r.Header, r.Body)
	}
	if r := do(t, http.MethodGet, "http://"+b.Addr+"/health", "", nil); r.Header.Get("x-mock-served-by") != "wb" {
		t.Fatalf("mock worker /health: %d %v", r.Status, r.Header)
	}
	p := ports{Listener: freePort(t), Admin: freePort(t), A: a.Addr, B: b.Addr, Wasm: "/nonexistent/kvroute.wasm"}
	for _, f := range []string{"override-host.yaml", "original-dst.yaml", "pd.yaml"} {
		out := string(rewriteBootstrap(t, filepath.Join(root, "deploy", "envoy", f), p))
		for _, gone := range []string{`"portValue": 8001`, `"portValue": 8002`, shippedWorkerA, shippedWorkerB, `"portValue": 10000`, `"portValue": 9901`, "build/kvroute.wasm"} {
			if strings.Contains(out, gone) {
				t.Errorf("%s: %q is still in the moved configuration", f, gone)
			}
		}
		for _, want := range []string{a.Addr, b.Addr, p.Wasm, strconv.Itoa(int(p.Admin)), strconv.Itoa(int(p.Listener))} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: %q is missing from the moved configuration", f, want)
			}
		}
	}
}
