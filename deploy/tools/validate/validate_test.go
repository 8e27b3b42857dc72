package validate

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"

	"github.com/kvroute/kvroute/routing/config"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// TestShippedFiles validates every YAML file under deploy/ and istio/: Envoy bootstraps
// against Envoy's API and kvroute's needs, Istio/Kubernetes/Gateway API objects against
// their APIs, every kustomization rendered and checked as a set, every embedded plugin
// configuration through routing.ParseConfig.
func TestShippedFiles(t *testing.T) {
	root := repoRoot(t)
	res, err := CheckTree(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d files, %d documents, %d bootstraps, %d kustomizations", len(res.Files), res.Docs, len(res.Bootstraps), len(res.Kustomizations))

	// The shipped set is what the README promises: five bootstraps, the Istio base and
	// three examples.
	for _, f := range []string{"deploy/envoy/override-host.yaml", "deploy/envoy/original-dst.yaml", "deploy/envoy/pd.yaml", "deploy/envoy/discovery.yaml", "deploy/envoy/models.yaml"} {
		if len(res.Bootstraps[filepath.Join(root, f)]) != 1 {
			t.Errorf("%s: want one kvroute plugin configuration, got %d", f, len(res.Bootstraps[filepath.Join(root, f)]))
		}
	}
	for _, d := range []string{"istio/base", "istio/examples/vllm-dp", "istio/examples/pd", "istio/examples/models"} {
		if len(res.Kustomizations[filepath.Join(root, d)]) != 1 {
			t.Errorf("%s: want one rendered WasmPlugin, got %d", d, len(res.Kustomizations[filepath.Join(root, d)]))
		}
	}
	pd := res.Bootstraps[filepath.Join(root, "deploy/envoy/pd.yaml")]
	if len(pd) == 1 && (pd[0].Disaggregation.Mode != config.ModeVLLM || !pd[0].EngineMetrics.Enabled ||
		pd[0].Disaggregation.PrefillCluster != "kvroute_prefill" || pd[0].EngineMetrics.Cluster != "kvroute_metrics") {
		t.Errorf("pd.yaml: want inline vllm P/D through kvroute_prefill and engine metrics through kvroute_metrics, got %+v %+v",
			pd[0].Disaggregation, pd[0].EngineMetrics)
	}
	disc := res.Bootstraps[filepath.Join(root, "deploy/envoy/discovery.yaml")]
	if len(disc) == 1 && (disc[0].Pools.Decode.Discovery == nil || len(disc[0].Pools.Decode.Endpoints) != 0 ||
		disc[0].Pools.Decode.Discovery.Cluster != "kvroute_admin" || disc[0].Pools.Decode.Discovery.ServiceCluster != "kvroute_workers") {
		t.Errorf("discovery.yaml: want the decode pool discovered from kvroute_workers through kvroute_admin, no static endpoint, got %+v", disc[0].Pools.Decode)
	}
	models := res.Bootstraps[filepath.Join(root, "deploy/envoy/models.yaml")]
	if len(models) == 1 && (len(models[0].Models) != 2 || models[0].Headers.Model != "x-gateway-model-name") {
		t.Errorf("models.yaml: want two models and the model header, got %+v %q", models[0].Models, models[0].Headers.Model)
	}
	// No pod IP in any Istio set: every pool is discovered from the gateway's Envoy.
	for dir, cfgs := range res.Kustomizations {
		for _, c := range cfgs {
			for _, problem := range istioPoolProblems(c) {
				t.Errorf("%s: %s", dir, problem)
			}
		}
	}
	dp := res.Kustomizations[filepath.Join(root, "istio/examples/vllm-dp")]
	if len(dp) == 1 && (dp[0].Pools.Decode.Discovery == nil || dp[0].Pools.Decode.Discovery.DPSize != 2) {
		t.Errorf("vllm-dp: the patch must give the discovered pods dp_size 2, got %+v", dp[0].Pools.Decode)
	}
	ipd := res.Kustomizations[filepath.Join(root, "istio/examples/pd")]
	if len(ipd) == 1 && (ipd[0].Disaggregation.Mode != config.ModeVLLM || ipd[0].Pools.Prefill.Discovery == nil ||
		ipd[0].Pools.Prefill.Discovery.ServiceCluster != ipd[0].Disaggregation.PrefillCluster) {
		t.Errorf("istio pd: want inline vllm P/D with a prefill pool discovered from the prefill cluster, got %+v %+v",
			ipd[0].Disaggregation, ipd[0].Pools.Prefill)
	}

	im := res.Kustomizations[filepath.Join(root, "istio/examples/models")]
	if len(im) == 1 {
		c := im[0]
		if len(c.Models) != 2 || c.Headers.Model != "x-gateway-model-name" || !slices.Contains(c.Routes, "/v1/models") {
			t.Errorf("istio models: want two fleets, the model header and /v1/models in routes, got %+v %q %v", c.Models, c.Headers.Model, c.Routes)
		}
		if c.Pools.Decode.Discovery != nil {
			t.Errorf("istio models: the top-level pools must be empty (unknown models get a 404), got %+v", c.Pools.Decode)
		}
		if len(c.Models) == 2 {
			a, b := c.Models[0].Pools.Decode.Discovery, c.Models[1].Pools.Decode.Discovery
			if a != nil && b != nil && a.ServiceCluster == b.ServiceCluster {
				t.Errorf("istio models: both fleets discover %s: each needs its own service", a.ServiceCluster)
			}
		}
	}
}

// istioPoolProblems is the rule for the pools of a shipped Istio set: no static
// endpoint (pods come and go, their IPs with them), and every fleet's decode pool
// discovered through the proxy's own admin (prometheus_stats). The one pool that may
// be empty is the top-level decode pool of a configuration with models: a model no
// fleet names then gets kvroute's 404.
func istioPoolProblems(c config.Config) []string {
	var out []string
	for _, fv := range fleetViews(c) {
		for _, p := range []struct {
			name string
			pool config.Pool
		}{{"pools.decode", fv.cfg.Pools.Decode}, {"pools.prefill", fv.cfg.Pools.Prefill}} {
			if len(p.pool.Endpoints) != 0 {
				out = append(out, fmt.Sprintf("%s%s: static endpoints %+v: discover them", fv.field, p.name, p.pool.Endpoints))
			}
		}
		d := fv.cfg.Pools.Decode.Discovery
		if fv.field == "" && len(c.Models) > 0 && d == nil && len(c.Pools.Decode.Endpoints) == 0 {
			continue
		}
		if d == nil || d.Source != config.DiscoveryEnvoyAdmin || d.Cluster != "prometheus_stats" {
			out = append(out, fmt.Sprintf("%spools.decode: want it discovered through prometheus_stats, got %+v", fv.field, d))
		}
	}
	return out
}

// TestIstioPoolRule checks the rule TestShippedFiles holds the Istio sets to: it
// accepts a models configuration whose fleets are discovered and whose top-level
// pools are empty, and refuses a static endpoint anywhere and a fleet discovered
// other than through the proxy's admin.
func TestIstioPoolRule(t *testing.T) {
	disc := func(svc string) string {
		return `{"discovery": {"source": "envoy_admin", "cluster": "prometheus_stats", "service_cluster": "outbound|8000||` + svc + `.llm.svc.cluster.local"}}`
	}
	for _, tc := range []struct {
		name, js string
		want     []string // prefixes, one per problem, in order
	}{
		{"one discovered fleet", `{"pools": {"decode": ` + disc("vllm") + `}}`, nil},
		{"models, empty top level", `{"models": [{"names": ["a"], "pools": {"decode": ` + disc("a") + `}},
			{"names": ["b"], "pools": {"decode": ` + disc("b") + `}}]}`, nil},
		{"models and a discovered top level", `{"pools": {"decode": ` + disc("vllm") + `},
			"models": [{"names": ["a"], "pools": {"decode": ` + disc("a") + `}}]}`, nil},
		{"a fleet with a pod IP", `{"models": [{"names": ["a"], "pools": {"decode": ` + disc("a") + `}},
			{"names": ["b"], "pools": {"decode": {"endpoints": [{"address": "10.0.0.1:8000"}]}}}]}`,
			[]string{"models[1].pools.decode: static endpoints", "models[1].pools.decode: want it discovered"}},
		{"a static top level beside models", `{"pools": {"decode": {"endpoints": [{"address": "10.0.0.1:8000"}]}},
			"models": [{"names": ["a"], "pools": {"decode": ` + disc("a") + `}}]}`,
			[]string{"pools.decode: static endpoints", "pools.decode: want it discovered"}},
		{"a discovered top level with a static prefill", `{"pools": {"decode": ` + disc("vllm") + `,
			"prefill": {"endpoints": [{"address": "10.0.0.2:8000"}]}}}`,
			[]string{"pools.prefill: static endpoints"}},
		{"a fleet discovered over http", `{"models": [{"names": ["a"], "pools": {"decode":
			{"discovery": {"source": "http", "cluster": "outbound|8080||lister.llm.svc.cluster.local", "path": "/endpoints"}}}}]}`,
			[]string{"models[0].pools.decode: want it discovered through prometheus_stats"}},
	} {
		cfg, err := config.ParseConfig([]byte(tc.js))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := istioPoolProblems(cfg)
		if len(got) != len(tc.want) {
			t.Errorf("%s: got %q, want %d problems %q", tc.name, got, len(tc.want), tc.want)
			continue
		}
		for i, w := range tc.want {
			if !strings.HasPrefix(got[i], w) {
				t.Errorf("%s: problem %d is %q, want it to start with %q", tc.name, i, got[i], w)
			}
		}
	}
}

// mutated checks a shipped file after a textual change, which must make the check fail
// with an error containing want.
func mutated(t *testing.T, rel, old, new, want string) {
	t.Helper()
	root := repoRoot(t)
	data, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), old) {
		t.Fatalf("%s does not contain %q", rel, old)
	}
	dir := t.TempDir()
	p := filepath.Join(dir, filepath.Base(rel))
	if err := os.WriteFile(p, []byte(strings.Replace(string(data), old, new, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = CheckFile(p)
	if err == nil {
		t.Fatalf("%s with %q → %q: accepted, want an error containing %q", rel, old, new, want)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("%s with %q → %q: error %q does not contain %q", rel, old, new, err, want)
	}
}

// An endpoint that numbers its DP ranks from a start rank (a vLLM hybrid DP node) passes
// the check, and the start rank reaches the configuration.
func TestDPRankStartAccepted(t *testing.T) {
	root := repoRoot(t)
	const rel = "deploy/envoy/override-host.yaml"
	data, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	const old = `{"address": "127.0.0.1:8001", "dp_size": 2}`
	if !strings.Contains(string(data), old) {
		t.Fatalf("%s does not contain %q", rel, old)
	}
	p := filepath.Join(t.TempDir(), filepath.Base(rel))
	changed := strings.Replace(string(data), old, `{"address": "127.0.0.1:8001", "dp_size": 2, "dp_rank_start": 4}`, 1)
	if err := os.WriteFile(p, []byte(changed), 0o644); err != nil {
		t.Fatal(err)
	}
	cfgs, _, err := CheckFile(p)
	if err != nil {
		t.Fatalf("dp_rank_start 4 refused: %v", err)
	}
	if len(cfgs) != 1 || cfgs[0].Pools.Decode.Endpoints[0].DPRankStart != 4 {
		t.Fatalf("want one configuration whose first decode endpoint starts at rank 4, got %+v", cfgs)
	}
}

// The validation refuses what Envoy, Istio or kvroute would refuse, and what would
// make the deployment unsafe. Each case changes one thing in a shipped file.
func TestBootstrapRefusals(t *testing.T) {
	const oh = "deploy/envoy/override-host.yaml"
	const od = "deploy/envoy/original-dst.yaml"
	const pd = "deploy/envoy/pd.yaml"
	const dy = "deploy/envoy/discovery.yaml"
	const mo = "deploy/envoy/models.yaml"
	cases := []struct{ name, file, old, new, want string }{
		{"unknown top-level field", oh, "static_resources:", "stats_flush_interval_typo: 5s\nstatic_resources:", "unknown field"},
		{"unknown field inside an Any", oh, "override_host_sources:", "override_host_source:", "unknown field"},
		{"unregistered Any type", oh, "least_request.v3.LeastRequest", "least_request.v3.LeastRequestTypo", "LeastRequestTypo"},
		{"ValidateAll inside an Any", oh, "            override_host_sources:\n            - header: x-gateway-destination-endpoint\n",
			"            override_host_sources: []\n", "OverrideHostSources"},
		{"wrong type", oh, "connect_timeout: 5s", "connect_timeout: five", "Duration"},
		{"duplicate key", oh, "    type: STATIC\n", "    type: STATIC\n    type: STRICT_DNS\n", "already set"},
		{"plugin config unknown field", oh, `"max_body_bytes": 8388608,`, `"max_body_byte": 8388608,`, "max_body_byte"},
		{"plugin config out of range", oh, `"dp_size": 2`, `"dp_size": 0`, "dp_size"},
		{"trusted rank header stripped early", oh, `"max_body_bytes": 8388608,`, `"max_body_bytes": 8388608, "trust_client_dp_rank": true,`, "trust_client_dp_rank is true, but an early header mutation removes \"x-data-parallel-rank\""},
		{"negative dp_rank_start", oh, `"dp_size": 2`, `"dp_size": 2, "dp_rank_start": -1`, "pools.decode.endpoints[0].dp_rank_start: must be >= 0"},
		{"dp_rank_start not a number", oh, `"dp_size": 2`, `"dp_size": 2, "dp_rank_start": "4"`, "pools.decode.endpoints[0].dp_rank_start: must be an integer"},
		{"fail closed", oh, "fail_open: true", "fail_open: false", "fail open"},
		{"owned header not stripped early", oh, "              - remove: x-data-parallel-rank\n", "", `"x-data-parallel-rank"`},
		{"override_host reads another header", oh, "- header: x-gateway-destination-endpoint", "- header: x-other", "override_host reads"},
		{"endpoint not in the cluster", oh, "port_value: 8002}", "port_value: 8003}", "127.0.0.1:8002 is not one of its hosts"},
		{"buffer below max_body_bytes", oh, "    per_connection_buffer_limit_bytes: 16777216\n    filter_chains:", "    per_connection_buffer_limit_bytes: 1048576\n    filter_chains:", "must exceed max_body_bytes"},
		{"no buffer limit (Envoy's 1 MiB)", oh, "    per_connection_buffer_limit_bytes: 16777216\n    filter_chains:", "    filter_chains:", "must exceed max_body_bytes"},
		{"default route timeout", oh, "                  timeout: 0s\n", "", "route timeout"},
		{"stats tag regex that misses", oh, `regex: '^wasmcustom\.kvroute_target_[a-z_]+\.[^.]+(\.rank_([0-9]+))$'`, `regex: '^kvroute_target_[a-z_]+\.[^.]+(\.rank_([0-9]+))$'`, "want wasmcustom.kvroute_target_active_requests"},
		{"stats tags for one gauge only", oh, `regex: '^wasmcustom\.kvroute_target_[a-z_]+(\.([^.]+))\.rank_[0-9]+$'`, `regex: '^wasmcustom\.kvroute_target_active_requests(\.([^.]+))\.rank_[0-9]+$'`, "want wasmcustom.kvroute_target_cache_tokens"},
		{"DNS name endpoint", oh, `{"address": "127.0.0.1:8002", "dp_size": 1}`, `{"address": "worker-2.local:8002", "dp_size": 1}`, "only IP:port"},
		{"router not last", oh, "          - name: envoy.filters.http.wasm\n", "          - name: envoy.filters.http.router\n            typed_config:\n              \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\n          - name: envoy.filters.http.wasm\n", "router must be the last"},
		{"admin exposed", oh, "socket_address: {address: 127.0.0.1, port_value: 9901}", "socket_address: {address: 0.0.0.0, port_value: 9901}", "admin listens"},
		{"ORIGINAL_DST reachable without the header", od, "                  - name: x-gateway-destination-endpoint\n                    present_match: true\n", "                  - name: x-anything\n                    present_match: true\n", "must require the x-gateway-destination-endpoint header"},
		{"ORIGINAL_DST reads another header", od, "      http_header_name: x-gateway-destination-endpoint", "      http_header_name: x-envoy-original-dst-host", "ORIGINAL_DST reads header"},
		{"prefill cluster missing", pd, `"prefill_cluster": "kvroute_prefill"`, `"prefill_cluster": "kvroute_prefill2"`, `prefill_cluster "kvroute_prefill2" does not exist`},
		{"metrics cluster missing", pd, `"cluster": "kvroute_metrics"`, `"cluster": "metrics"`, `engine_metrics.cluster "metrics" does not exist`},
		{"metrics cluster routed", pd, "                  cluster: kvroute_decode\n", "                  cluster: kvroute_metrics\n", "reachable from a route"},
		{"discovery admin cluster missing", dy, `"cluster": "kvroute_admin"`, `"cluster": "kvroute_admin2"`, `pools.decode.discovery.cluster "kvroute_admin2" does not exist`},
		{"discovery admin cluster is not the admin", dy, "              socket_address: {address: 127.0.0.1, port_value: 9901}\n", "              socket_address: {address: 127.0.0.1, port_value: 9902}\n", "must have exactly one host, the admin address 127.0.0.1:9901"},
		{"discovery admin cluster routed", dy, "                  cluster: kvroute_workers\n", "                  cluster: kvroute_admin\n", `discovery cluster "kvroute_admin" reaches Envoy's admin and a route reaches it`},
		{"discovery service cluster missing", dy, `"service_cluster": "kvroute_workers"`, `"service_cluster": "workers"`, `service_cluster "workers" does not exist`},
		{"discovery service cluster without override_host", dy, "- header: x-gateway-destination-endpoint", "- header: x-other", "must honour the destination header with override_host"},
		{"discovery block refused", dy, `"dp_size": 1,`, `"dp_size": 1, "path": "/x",`, "pools.decode.discovery.path: only for source"},
		{"prefill endpoint not in the prefill cluster", pd, `"prefill": {"endpoints": [{"address": "127.0.0.1:8001"`, `"prefill": {"endpoints": [{"address": "127.0.0.1:8009"`, "127.0.0.1:8009 is not one of its hosts"},
		{"model header not stripped early", mo, "              - remove: x-gateway-model-name\n", "", `"x-gateway-model-name"`},
		{"model endpoint in no routed cluster", mo, `{"address": "127.0.0.1:8002", "dp_size": 1}`, `{"address": "127.0.0.1:8003", "dp_size": 1}`,
			"models[1].pools.decode.endpoints[0] 127.0.0.1:8003 is a host of no routed override_host cluster"},
		{"model DNS endpoint", mo, `{"address": "127.0.0.1:8002", "dp_size": 1}`, `{"address": "llama.local:8002", "dp_size": 1}`,
			"models[1].pools.decode.endpoints[0].address \"llama.local:8002\": Envoy honours only IP:port"},
		{"model stats tag missing", mo, `  - tag_name: kvroute_model
    regex: '^wasmcustom\.kvroute_model_[a-z_]+(\.([^.]+))$'
`, "", "models[0]: wasmcustom.kvroute_model_requests_routed.qwen3-32b becomes"},
		{"model name given twice", mo, `{"names": ["llama-3.1-8b"]`, `{"names": ["llama-3.1-8b", "qwen3-32b"]`, `models[1].names[1]: "qwen3-32b" is already named by models[0].names[0]`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { mutated(t, c.file, c.old, c.new, c.want) })
	}
}

func TestIstioRefusals(t *testing.T) {
	const wp = "istio/base/wasmplugin.yaml"
	const ef = "istio/base/envoyfilter.yaml"
	cases := []struct{ name, file, old, new, want string }{
		{"unknown spec field", wp, "  imagePullPolicy: IfNotPresent", "  imagePullPolicy: IfNotPresent\n  pullPolicy: Always", "unknown field"},
		{"snake_case field name", wp, "  failStrategy: FAIL_OPEN", "  fail_strategy: FAIL_OPEN", `write it "failStrategy"`},
		{"bad enum", wp, "  phase: STATS", "  phase: LATE", "phase"},
		{"unknown metadata field", wp, "  namespace: llm", "  namespace: llm\n  labelz: {}", "labelz"},
		{"unknown top-level field", wp, "spec:", "status: {}\nspec:", `unknown top-level field "status"`},
		{"envoy field typo in a patch", ef, "        per_connection_buffer_limit_bytes: 16777216\n        load_balancing_policy:", "        per_connection_buffer_limit_byte: 16777216\n        load_balancing_policy:", "unknown field"},
		{"unregistered Any in a patch", ef, "header_mutation.v3.HeaderMutation", "header_mutation.v3.HeaderMutations", "HeaderMutations"},
		{"unknown field in a nested Any of a MERGE", ef, "                - header: x-gateway-destination-endpoint\n                fallback_policy:", "                - header: x-gateway-destination-endpoint\n                fallback_policy_x:", "unknown field"},
		{"required field in an Any of a CLUSTER MERGE", ef, "                - header: x-gateway-destination-endpoint\n                fallback_policy:\n                  policies:\n                  - typed_extension_config:\n                      name: envoy.load_balancing_policies.least_request\n                      typed_config:\n                        \"@type\": type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest\n", "                - header: x-gateway-destination-endpoint\n", "FallbackPolicy"},
		{"invalid value in an Any two levels into a NETWORK_FILTER MERGE", ef, "              - remove: x-kvroute-decision", "              - remove: \"x-kvroute\\ndecision\"", "HeaderMutation"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { mutated(t, c.file, c.old, c.new, c.want) })
	}
}

// renderMutated copies the istio/ tree, changes one file and renders a kustomization
// of the copy, which must fail with want.
func renderMutated(t *testing.T, kdir, rel, old, new, want string) {
	t.Helper()
	root := repoRoot(t)
	dst := filepath.Join(t.TempDir(), "istio")
	if err := os.CopyFS(dst, os.DirFS(filepath.Join(root, "istio"))); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dst, rel)
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), old) {
		t.Fatalf("%s does not contain %q", rel, old)
	}
	if err := os.WriteFile(p, []byte(strings.Replace(string(data), old, new, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = Render(filepath.Join(dst, kdir))
	if err == nil {
		t.Fatalf("%s with %q → %q: accepted, want an error containing %q", rel, old, new, want)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("%s with %q → %q: error %q does not contain %q", rel, old, new, err, want)
	}
}

func TestIstioSetRefusals(t *testing.T) {
	cases := []struct{ name, kdir, file, old, new, want string }{
		{"fail closed", "base", "base/wasmplugin.yaml", "failStrategy: FAIL_OPEN", "failStrategy: FAIL_CLOSE", "failStrategy must be FAIL_OPEN"},
		{"plugin config refused", "base", "base/wasmplugin.yaml", "first_turn: round_robin", "first_turn: sticky", "conversation.first_turn"},
		{"trusted rank header stripped early", "base", "base/wasmplugin.yaml", "    max_body_bytes: 8388608", "    max_body_bytes: 8388608\n    trust_client_dp_rank: true", "trust_client_dp_rank is true, but an early header mutation removes \"x-data-parallel-rank\""},
		{"pod DNS name", "examples/vllm-dp", "examples/vllm-dp/wasmplugin-patch.yaml", "          dp_size: 2\n", "          dp_size: 2\n        endpoints:\n        - address: \"vllm-0.vllm:8000\"\n", "only IP:port"},
		{"discovery through another cluster than the admin's", "base", "base/wasmplugin.yaml", "cluster: prometheus_stats", "cluster: kvroute_admin", `use "prometheus_stats"`},
		{"discovery service cluster not an Istio cluster", "base", "base/wasmplugin.yaml", `service_cluster: "outbound|8000||vllm.llm.svc.cluster.local"`, `service_cluster: "vllm"`, "service_cluster \"vllm\": in Istio name the service's cluster"},
		{"discovered service without override_host", "base", "base/wasmplugin.yaml", `service_cluster: "outbound|8000||vllm.llm.svc.cluster.local"`, `service_cluster: "outbound|8000||other.llm.svc.cluster.local"`, "pools.decode.discovery.service_cluster: no EnvoyFilter sets override_host on the cluster of other.llm.svc.cluster.local:8000"},
		{"discovered prefill service missing", "examples/pd", "examples/pd/wasmplugin-patch.yaml", `service_cluster: "outbound|8000||vllm-prefill.llm.svc.cluster.local"`, `service_cluster: "outbound|8001||vllm-prefill.llm.svc.cluster.local"`, "no Service vllm-prefill.llm with port 8001"},
		{"routed service without override_host", "examples/vllm-dp", "base/envoyfilter.yaml", "service: vllm.llm.svc.cluster.local", "service: other.llm.svc.cluster.local", "no EnvoyFilter sets override_host on the cluster of vllm.llm.svc.cluster.local:8000"},
		{"owned header not stripped", "base", "base/envoyfilter.yaml", "              - remove: x-kvroute-decision\n", "", `"x-kvroute-decision"`},
		{"listener buffer", "base", "base/envoyfilter.yaml", "      value:\n        per_connection_buffer_limit_bytes: 16777216\n  - applyTo: NETWORK_FILTER", "      value:\n        per_connection_buffer_limit_bytes: 1048576\n  - applyTo: NETWORK_FILTER", "listeners' per_connection_buffer_limit_bytes"},
		{"prefill cluster not an Istio cluster", "examples/pd", "examples/pd/wasmplugin-patch.yaml", `prefill_cluster: "outbound|8000||vllm-prefill.llm.svc.cluster.local"`, `prefill_cluster: kvroute_prefill`, "outbound|<port>||<host>"},
		{"prefill cluster without override_host", "examples/pd", "examples/pd/envoyfilter-prefill.yaml", "service: vllm-prefill.llm.svc.cluster.local", "service: vllm-x.llm.svc.cluster.local", "cluster of vllm-prefill.llm.svc.cluster.local:8000"},
		{"prefill service missing", "examples/pd", "examples/pd/vllm-pd.yaml", "  name: vllm-prefill\n  namespace: llm\n  labels:\n    app: vllm-prefill\nspec:\n  selector:", "  name: vllm-prefill-svc\n  namespace: llm\n  labels:\n    app: vllm-prefill\nspec:\n  selector:", "no Service vllm-prefill.llm with port 8000"},
		{"plugin on a different gateway than the EnvoyFilter", "base", "base/wasmplugin.yaml", "    name: kvroute-gateway", "    name: other-gateway", "no EnvoyFilter"},
		{"model header not stripped", "examples/models", "examples/models/envoyfilter-patch.yaml", "              - remove: x-gateway-model-name\n", "", `removes "x-gateway-model-name"`},
		{"second model's service without override_host", "examples/models", "examples/models/envoyfilter-patch.yaml", "service: qwen-large.llm.svc.cluster.local", "service: qwen-other.llm.svc.cluster.local", "models[1].pools.decode.discovery.service_cluster: no EnvoyFilter sets override_host on the cluster of qwen-large.llm.svc.cluster.local:8000"},
		{"second model's service missing", "examples/models", "examples/models/wasmplugin-patch.yaml", `service_cluster: "outbound|8000||qwen-large.llm.svc.cluster.local"`, `service_cluster: "outbound|8001||qwen-large.llm.svc.cluster.local"`, "models[1].pools.decode.discovery.service_cluster: no Service qwen-large.llm with port 8001"},
		{"k8s unknown field", "examples/vllm-dp", "examples/vllm-dp/vllm.yaml", "  replicas: 2", "  replicas: 2\n  replica: 2", "unknown field"},
		{"gateway api unknown field", "examples/vllm-dp", "examples/vllm-dp/gateway.yaml", "    timeouts:\n      request: \"0s\"", "    timeouts:\n      requests: \"0s\"", "unknown field"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { renderMutated(t, c.kdir, c.file, c.old, c.new, c.want) })
	}
}

func TestExtractTags(t *testing.T) {
	root := repoRoot(t)
	data, err := os.ReadFile(filepath.Join(root, "deploy/envoy/override-host.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs, err := SplitDocs("override-host.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	cfgs, err := CheckBootstrap(docs[0].Source, docs[0].JSON)
	if err != nil || len(cfgs) != 1 {
		t.Fatal(err)
	}
	// A wider fleet than the shipped one: IPv6, DNS-like names, two-digit ranks.
	cfg := cfgs[0]
	cfg.Pools.Decode.Endpoints = []config.Endpoint{{Address: "[2001:db8::1]:8000", DPSize: 12}, {Address: "10.1.2.3:65535", DPSize: 1}}
	b := loadBootstrap(t, docs[0].JSON)
	if err := CheckStatsTags(b.GetStatsConfig().GetStatsTags(), cfg); err != nil {
		t.Fatal(err)
	}
	name, tags, err := ExtractTags("wasmcustom.kvroute_target_prefill_tokens_per_second.10_1_2_3_65535.rank_0", b.GetStatsConfig().GetStatsTags())
	if err != nil || name != "wasmcustom.kvroute_target_prefill_tokens_per_second" || tags["kvroute_endpoint"] != "10_1_2_3_65535" || tags["kvroute_rank"] != "0" {
		t.Fatalf("got %q %v %v", name, tags, err)
	}
}

func loadBootstrap(t *testing.T, js []byte) *bootstrapv3.Bootstrap {
	t.Helper()
	b := &bootstrapv3.Bootstrap{}
	if err := UnmarshalEnvoy(js, b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

// checkText checks one file written from text and returns what the check said.
func checkText(t *testing.T, name, text string) ([]config.Config, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfgs, _, err := CheckFile(p)
	return cfgs, err
}

// A plugin configuration the plugin refuses is one error, not also "no HTTP
// connection manager with the kvroute wasm filter": the filter is there.
func TestPluginConfigErrorIsTheOnlyError(t *testing.T) {
	root := repoRoot(t)
	data, err := os.ReadFile(filepath.Join(root, "deploy/envoy/override-host.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(data), `"max_body_bytes": 8388608,`, `"max_body_byte": 8388608,`, 1)
	_, err = checkText(t, "override-host.yaml", bad)
	if err == nil || !strings.Contains(err.Error(), "max_body_byte") {
		t.Fatalf("want the plugin configuration's error, got %v", err)
	}
	if strings.Contains(err.Error(), "no HTTP connection manager") || strings.Count(err.Error(), "\n") != 0 {
		t.Fatalf("want one error, got:\n%v", err)
	}
	// A bootstrap without the filter still says so.
	_, err = checkText(t, "bare.yaml", "static_resources: {}\n")
	if err == nil || !strings.Contains(err.Error(), "no HTTP connection manager with the kvroute wasm filter") {
		t.Fatalf("want no HTTP connection manager, got %v", err)
	}
}

func TestSyntaxErrorsHaveLineAndColumn(t *testing.T) {
	cases := []struct{ name, text, want string }{
		// YAML accepts the trailing comma; JSON does not.
		{"plugin.json", "{\"pools\": {\n  \"decode\": {\"endpoints\": [{\"address\": \"10.0.0.1:8000\"},]}}}\n", "plugin.json:2:57: invalid JSON"},
		{"plugin.json", "{\"pools\": {\"decode\": \n\n   {\"endpoints\" []}}}", "plugin.json:3:17: invalid JSON"},
		{"cut.json", "{\"pools\": {\"decode\": {", "cut.json:1:23: invalid JSON: unexpected end of input"},
		{"envoy.yaml", "static_resources:\n  clusters:\n   - name: x\n  bad: : [\n", "envoy.yaml:4: invalid YAML"},
	}
	for _, c := range cases {
		_, err := checkText(t, c.name, c.text)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %q: got %v, want %q", c.name, c.text, err, c.want)
		}
	}
	// Invalid JSON inside an Envoy bootstrap's plugin configuration string.
	root := repoRoot(t)
	data, err := os.ReadFile(filepath.Join(root, "deploy/envoy/override-host.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(data), `"max_body_bytes": 8388608,`, `"max_body_bytes": 8388608,,`, 1)
	_, err = checkText(t, "override-host.yaml", bad)
	if err == nil || !regexp.MustCompile(`plugin configuration: line [0-9]+:[0-9]+: invalid JSON`).MatchString(err.Error()) {
		t.Fatalf("got %v", err)
	}
}

// kvroute's plugin configuration on its own (the file the replay demo uses) is
// checked as one, not refused as an Envoy bootstrap with unknown fields.
func TestBarePluginConfig(t *testing.T) {
	root := repoRoot(t)
	for _, f := range []string{"testdata/replay/kvroute.json", "testdata/requests/config.json"} {
		cfgs, _, err := CheckFile(filepath.Join(root, f))
		if err != nil || len(cfgs) != 1 || len(cfgs[0].Pools.Decode.Endpoints) == 0 {
			t.Errorf("%s: got %v, %v", f, cfgs, err)
		}
	}
	_, err := checkText(t, "kvroute.json", `{"pools": {"decode": {"endpoints": [{"address": "10.0.0.1:8000"}]}}, "max_body_byte": 1}`)
	if err == nil || !strings.Contains(err.Error(), "plugin configuration: max_body_byte") {
		t.Errorf("want kvroute's own error for the unknown field, got %v", err)
	}
	_, err = checkText(t, "kvroute.yaml", "pools:\n  decode:\n    endpoints:\n    - address: 10.0.0.1:8000\n      dp_size: 0\n")
	if err == nil || !strings.Contains(err.Error(), "plugin configuration: pools.decode.endpoints[0].dp_size") {
		t.Errorf("want kvroute's own error for dp_size, got %v", err)
	}
	// A bootstrap with a stray kvroute field is still a bootstrap.
	_, err = checkText(t, "envoy.yaml", "static_resources: {}\npools: {}\n")
	if err == nil || !strings.Contains(err.Error(), `unknown field "pools"`) {
		t.Errorf("want Envoy's unknown field, got %v", err)
	}
}
