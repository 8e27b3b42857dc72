package discovery

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// adminHostJSON is one HostStatus as Envoy's admin writes it for GET /clusters?format=json.
// The shape — field names, the protocol and port_value of socket_address, stats with
// string values, health_status with eds_health_status and only the flags that are set,
// weight, hostname, priority, locality, pretty-printed — is the one of
// envoyproxy/envoy test/server/admin/clusters_handler_test.cc (ClustersJsonAndText's
// expected_json), written by ClustersHandler::writeClustersAsJson in
// source/server/admin/clusters_handler.cc from envoy.admin.v3.HostStatus
// (api/envoy/admin/v3/clusters.proto).
func adminHostJSON(ip string, port int, health string) string {
	if health == "" {
		health = `"eds_health_status": "HEALTHY"`
	}
	return fmt.Sprintf(`    {
     "address": {
      "socket_address": {
       "protocol": "TCP",
       "address": %q,
       "port_value": %d
      }
     },
     "stats": [
      {"name": "cx_active", "value": "2", "type": "GAUGE"},
      {"name": "cx_connect_fail", "value": "0", "type": "COUNTER"},
      {"name": "rq_success", "value": "18294", "type": "COUNTER"},
      {"name": "rq_total", "value": "18300", "type": "COUNTER"}
     ],
     "health_status": {
      %s
     },
     "weight": 1,
     "hostname": "",
     "priority": 0,
     "locality": {
      "region": "us-east1",
      "zone": "us-east1-b"
     }
    }`, ip, port, health)
}

// adminClustersJSON is a whole /clusters?format=json answer: clusters by name, each
// with its hosts (nil: a cluster without hosts, whose host_statuses proto3 leaves out).
func adminClustersJSON(clusters map[string][]string, order ...string) string {
	var b strings.Builder
	b.WriteString("{\n \"cluster_statuses\": [\n")
	for i, name := range order {
		if i > 0 {
			b.WriteString(",\n")
		}
		fmt.Fprintf(&b, `  {
   "name": %q,
   "observability_name": %q,
   "added_via_api": true,
   "circuit_breakers": {
    "thresholds": [
     {"max_connections": 4294967295, "max_pending_requests": 4294967295, "max_requests": 4294967295, "max_retries": 4294967295},
     {"priority": "HIGH", "max_connections": 1024, "max_pending_requests": 1024, "max_requests": 1024, "max_retries": 3}
    ]
   }`, name, name)
		if hosts := clusters[name]; hosts != nil {
			b.WriteString(",\n   \"host_statuses\": [\n" + strings.Join(hosts, ",\n") + "\n   ]")
		}
		b.WriteString("\n  }")
	}
	b.WriteString("\n ]\n}\n")
	return b.String()
}

const istioCluster = "outbound|8000||vllm.llm.svc.cluster.local"

func addresses(eps []DiscoveredEndpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.Address)
	}
	return out
}

func TestParseEnvoyAdminPicksTheClusterAndItsHealthyHosts(t *testing.T) {
	doc := adminClustersJSON(map[string][]string{
		"prometheus_stats": {adminHostJSON("127.0.0.1", 15000, "")},
		istioCluster: {
			adminHostJSON("10.0.0.3", 8000, ""),
			adminHostJSON("10.0.0.1", 8000, ""),
			adminHostJSON("10.0.0.2", 8000, `"eds_health_status": "UNHEALTHY"`),
			adminHostJSON("10.0.0.4", 8000, `"eds_health_status": "HEALTHY",
      "failed_outlier_check": true`),
			adminHostJSON("10.0.0.5", 8000, `"eds_health_status": "DRAINING"`),
			adminHostJSON("10.0.0.6", 8000, `"eds_health_status": "HEALTHY",
      "failed_active_health_check": true,
      "pending_active_hc": true`),
			adminHostJSON("10.0.0.7", 8000, `"eds_health_status": "DEGRADED",
      "failed_active_degraded_check": true`),
			adminHostJSON("10.0.0.8", 8000, `"eds_health_status": "HEALTHY",
      "pending_dynamic_removal": true`),
			adminHostJSON("10.0.0.9", 8000, `"eds_health_status": "TIMEOUT"`),
			adminHostJSON("10.0.0.10", 8000, `"eds_health_status": "HEALTHY",
      "excluded_via_immediate_hc_fail": true`),
			adminHostJSON("10.0.0.11", 8000, `"eds_health_status": "HEALTHY",
      "active_hc_timeout": true,
      "failed_active_health_check": true`),
			adminHostJSON("fd00::12", 8000, `"eds_health_status": "HEALTHY",
      "failed_active_health_check": false`),
			adminHostJSON("10.0.0.1", 8000, ""), // again, at another priority
		},
		"outbound|8000||other.llm.svc.cluster.local": {adminHostJSON("10.9.9.9", 8000, "")},
	}, "prometheus_stats", "outbound|8000||other.llm.svc.cluster.local", istioCluster)
	eps, err := ParseEnvoyAdminClusters([]byte(doc), istioCluster)
	require.NoError(t, err)
	assert.Equal(t, []string{"10.0.0.1:8000", "10.0.0.3:8000", "10.0.0.7:8000", "[fd00::12]:8000"}, addresses(eps),
		"healthy and degraded hosts of the service's cluster only, sorted, once each")
	for _, e := range eps {
		assert.Zero(t, e.DPSize, "Envoy knows no DP size: the pool's default applies")
	}
}

func TestParseEnvoyAdminFaults(t *testing.T) {
	pipe := `    {"address": {"pipe": {"path": "/var/run/x.sock"}}, "health_status": {"eds_health_status": "HEALTHY"}}`
	for _, tc := range []struct {
		name, doc string
		want      []string // nil: an error
	}{
		{"garbage", "<html>503 upstream connect error</html>", nil},
		{"truncated", adminClustersJSON(map[string][]string{istioCluster: {adminHostJSON("10.0.0.1", 8000, "")}}, istioCluster)[:200], nil},
		{"no cluster_statuses", `{"clusters": []}`, nil},
		{"not an object", `[1,2,3]`, nil},
		{"cluster absent", adminClustersJSON(map[string][]string{"other": {adminHostJSON("10.0.0.1", 8000, "")}}, "other"), nil},
		{"host_statuses not an array", `{"cluster_statuses":[{"name":"` + istioCluster + `","host_statuses":{}}]}`, nil},
		{"no hosts: scaled to zero", adminClustersJSON(map[string][]string{istioCluster: nil}, istioCluster), []string{}},
		{"pipe and bad hosts skipped", adminClustersJSON(map[string][]string{istioCluster: {
			pipe, adminHostJSON("not an ip!", 8000, ""), adminHostJSON("10.0.0.1", 0, ""), adminHostJSON("10.0.0.2", 8000, "")}}, istioCluster),
			[]string{"10.0.0.2:8000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eps, err := ParseEnvoyAdminClusters([]byte(tc.doc), istioCluster)
			if tc.want == nil {
				require.ErrorIs(t, err, ErrDiscoveryAnswer)
				return
			}
			require.NoError(t, err)
			got := addresses(eps)
			if got == nil {
				got = []string{}
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

// A 10 000-host cluster among others parses whole; the parse keeps nothing of the
// answer beyond the endpoints (each address is a copy).
func TestParseEnvoyAdminTenThousandHosts(t *testing.T) {
	doc := bigAdminAnswer(10000)
	require.Greater(t, len(doc), 5<<20, "the sample is the size Envoy writes for such a fleet")
	eps, err := ParseEnvoyAdminClusters([]byte(doc), istioCluster)
	require.NoError(t, err)
	require.Len(t, eps, 10000)
	assert.Equal(t, "10.0.0.0:8000", eps[0].Address)
}

func bigAdminAnswer(n int) string {
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = adminHostJSON(fmt.Sprintf("10.0.%d.%d", i/256, i%256), 8000, "")
	}
	return adminClustersJSON(map[string][]string{
		"prometheus_stats": {adminHostJSON("127.0.0.1", 15000, "")},
		istioCluster:       hosts,
	}, "prometheus_stats", istioCluster)
}

func BenchmarkParseEnvoyAdminTenThousandHosts(b *testing.B) {
	doc := []byte(bigAdminAnswer(10000))
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseEnvoyAdminClusters(doc, istioCluster); err != nil {
			b.Fatal(err)
		}
	}
}

func TestEnvoyAdminPathEscapesTheClusterName(t *testing.T) {
	assert.Equal(t,
		"/clusters?format=json&filter=%5Eoutbound%5C%7C8000%5C%7C%5C%7Cvllm%5C.llm%5C.svc%5C.cluster%5C.local%24",
		EnvoyAdminPath(istioCluster))
}

func TestParseEndpointList(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      []DiscoveredEndpoint // nil: an error
	}{
		{"kvroute shape", `{"endpoints":[{"address":"10.0.0.2:8000","dp_size":2,"dp_rank_start":4},{"address":"10.0.0.1:8000"}]}`,
			[]DiscoveredEndpoint{{Address: "10.0.0.1:8000"}, {Address: "10.0.0.2:8000", DPSize: 2, DPRankStart: 4}}},
		{"llm-d shape", `{"endpoints":[{"address":"10.0.0.1","port":8000,"name":"vllm-0"},{"address":"fd00::1","port":8001}]}`,
			[]DiscoveredEndpoint{{Address: "10.0.0.1:8000"}, {Address: "[fd00::1]:8001"}}},
		{"bare array", `[{"address":"vllm-0.vllm.llm:8000"}]`, []DiscoveredEndpoint{{Address: "vllm-0.vllm.llm:8000"}}},
		{"empty list", `{"endpoints":[]}`, []DiscoveredEndpoint{}},
		{"duplicates", `{"endpoints":[{"address":"10.0.0.1:8000","dp_size":2},{"address":"10.0.0.1:8000"}]}`,
			[]DiscoveredEndpoint{{Address: "10.0.0.1:8000", DPSize: 2}}},
		{"garbage", `not json`, nil},
		{"no endpoints member", `{"pods":[]}`, nil},
		{"address missing", `{"endpoints":[{"port":8000}]}`, nil},
		{"no port", `{"endpoints":[{"address":"10.0.0.1"}]}`, nil},
		{"bad port", `{"endpoints":[{"address":"10.0.0.1","port":70000}]}`, nil},
		{"bad dp_size", `{"endpoints":[{"address":"10.0.0.1:8000","dp_size":0}]}`, nil},
		{"one bad element spoils the list", `{"endpoints":[{"address":"10.0.0.1:8000"},{"address":"x y:1"}]}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eps, err := ParseEndpointList([]byte(tc.doc))
			if tc.want == nil {
				require.ErrorIs(t, err, ErrDiscoveryAnswer)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, eps)
		})
	}
}

func TestEndpointBoardVersionsTheSet(t *testing.T) {
	store := state.NewMemoryStore()
	d := config.DefaultDiscovery()
	d.ServiceCluster = istioCluster
	b := NewEndpointBoard(store, "kvroute", "decode", d, 8)
	gen, err := b.Generation()
	require.NoError(t, err)
	assert.Zero(t, gen, "nothing published yet")
	_, _, ok, err := b.Read()
	require.NoError(t, err)
	assert.False(t, ok)

	set := []DiscoveredEndpoint{{Address: "10.0.0.1:8000"}, {Address: "10.0.0.2:8000", DPSize: 2, DPRankStart: 2}}
	gen, err = b.Publish(set)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), gen)
	gen, err = b.Publish(append([]DiscoveredEndpoint(nil), set...))
	require.NoError(t, err)
	assert.Equal(t, uint64(1), gen, "the same set is no change")
	gen, err = b.Publish(set[:1])
	require.NoError(t, err)
	assert.Equal(t, uint64(2), gen)
	g, eps, ok, err := b.Read()
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, uint64(2), g)
	assert.Equal(t, set[:1], eps)

	// Another discovery block (a reconfiguration to another cluster) does not take
	// the old set for its own.
	d2 := d
	d2.ServiceCluster = "outbound|8000||other"
	_, _, ok, err = NewEndpointBoard(store, "kvroute", "decode", d2, 8).Read()
	require.NoError(t, err)
	assert.False(t, ok)

	// A value of another format reads as no set.
	require.NoError(t, store.Set("kvroute/disc/decode", []byte{99, 1, 2, 3}, 0))
	_, _, ok, err = b.Read()
	require.NoError(t, err)
	assert.False(t, ok)
	gen, err = b.Publish(set)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), gen, "started afresh")
}

func TestEndpointSetDecodeRejectsTornValues(t *testing.T) {
	v := encodeEndpointSet(7, 3, []DiscoveredEndpoint{{Address: "10.0.0.1:8000"}, {Address: "10.0.0.2:8000"}})
	for n := 0; n < len(v); n++ {
		_, _, _, ok := decodeEndpointSet(v[:n])
		assert.False(t, ok, "cut at %d", n)
	}
	_, _, _, ok := decodeEndpointSet(append(v, 0))
	assert.False(t, ok, "trailing byte")
	src, gen, eps, ok := decodeEndpointSet(v)
	require.True(t, ok)
	assert.Equal(t, uint64(7), src)
	assert.Equal(t, uint64(3), gen)
	assert.Len(t, eps, 2)
}

func TestDiscoveryConfig(t *testing.T) {
	cfg, err := config.ParseConfig([]byte(`{"pools":{"decode":{"discovery":{"service_cluster":"outbound|8000||vllm.llm.svc.cluster.local"}}}}`))
	require.NoError(t, err)
	require.NotNil(t, cfg.Pools.Decode.Discovery)
	want := config.DefaultDiscovery()
	want.ServiceCluster = "outbound|8000||vllm.llm.svc.cluster.local"
	assert.Equal(t, want, *cfg.Pools.Decode.Discovery)
	assert.Empty(t, cfg.Pools.Decode.Endpoints, "endpoints may be empty with discovery")
	assert.Nil(t, cfg.Pools.Prefill.Discovery)

	for _, tc := range []struct{ doc, field, reason string }{
		{`{"pools":{"decode":{"discovery":{}}}}`, "pools.decode.discovery.service_cluster", "required"},
		{`{"pools":{"decode":{"discovery":{"source":"http"}}}}`, "pools.decode.discovery.path", "required"},
		{`{"pools":{"decode":{"discovery":{"source":"http","path":"/e","service_cluster":"x"}}}}`, "pools.decode.discovery.service_cluster", "only for"},
		{`{"pools":{"decode":{"discovery":{"service_cluster":"x","path":"/e"}}}}`, "pools.decode.discovery.path", "only for"},
		{`{"pools":{"decode":{"discovery":{"source":"dns","service_cluster":"x"}}}}`, "pools.decode.discovery.source", "must be one of"},
		{`{"pools":{"decode":{"discovery":{"service_cluster":"x","interval_ms":50}}}}`, "pools.decode.discovery.interval_ms", ">= 100"},
		{`{"pools":{"decode":{"discovery":{"service_cluster":"x","dp_size":0}}}}`, "pools.decode.discovery.dp_size", ">= 1"},
		{`{"pools":{"decode":{"discovery":{"service_cluster":"x","cluster":""}}}}`, "pools.decode.discovery.cluster", "empty"},
		{`{"pools":{"decode":{"discovery":{"service_cluster":"x","typo":1}}}}`, "pools.decode.discovery.typo", "unknown field"},
		{`{"disaggregation":{"mode":"vllm"},"pools":{"decode":{"discovery":{"service_cluster":"x"}}}}`, "pools.prefill.endpoints", "or pools.prefill.discovery"},
	} {
		_, err := config.ParseConfig([]byte(tc.doc))
		var ce *config.ConfigError
		require.ErrorAs(t, err, &ce, tc.doc)
		assert.Equal(t, tc.field, ce.Field, tc.doc)
		assert.Contains(t, ce.Reason, tc.reason, tc.doc)
	}
}

// FuzzParseDiscovery feeds both parsers arbitrary answers: they never panic, and what
// they return is a sorted, duplicate-free list of valid host:port addresses.
func FuzzParseDiscovery(f *testing.F) {
	f.Add([]byte(adminClustersJSON(map[string][]string{istioCluster: {adminHostJSON("10.0.0.1", 8000, "")}}, istioCluster)))
	f.Add([]byte(`{"endpoints":[{"address":"10.0.0.1:8000","dp_size":2},{"address":"fd00::1","port":1}]}`))
	f.Add([]byte(`[{"address":"a:1"},{"address":"a:1"}]`))
	f.Add([]byte(`{"cluster_statuses":[{"name":"` + istioCluster + `","host_statuses":[{"address":{"socket_address":{"address":"::1","port_value":1}}}]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, parse := range []func([]byte) ([]DiscoveredEndpoint, error){
			func(b []byte) ([]DiscoveredEndpoint, error) { return ParseEnvoyAdminClusters(b, istioCluster) },
			ParseEndpointList,
		} {
			eps, err := parse(body)
			if err != nil {
				continue
			}
			for i, e := range eps {
				if config.HostPort("", e.Address) != nil {
					t.Fatalf("invalid address %q", e.Address)
				}
				if i > 0 && eps[i-1].Address >= e.Address {
					t.Fatalf("not sorted or repeated: %q then %q", eps[i-1].Address, e.Address)
				}
			}
		}
	})
}
