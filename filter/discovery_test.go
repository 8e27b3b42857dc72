package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/shareddata"
	"github.com/kvroute/kvroute/routing"
	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/discovery"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const vllmCluster = "outbound|8000||vllm.llm.svc.cluster.local"

// adminHost is one HostStatus of Envoy's GET /clusters?format=json. Its shape — field
// names, socket_address with protocol and port_value, stats with string values,
// health_status with eds_health_status and only the flags that are set, weight,
// hostname, priority, locality — is that of envoyproxy/envoy
// test/server/admin/clusters_handler_test.cc (ClustersJsonAndText, expected_json), as
// ClustersHandler::writeClustersAsJson (source/server/admin/clusters_handler.cc) writes
// envoy.admin.v3.HostStatus (api/envoy/admin/v3/clusters.proto).
func adminHost(ip string, health string) string {
	if health == "" {
		health = `"eds_health_status": "HEALTHY"`
	}
	return `    {
     "address": {"socket_address": {"protocol": "TCP", "address": "` + ip + `", "port_value": 8000}},
     "stats": [
      {"name": "cx_active", "value": "1", "type": "GAUGE"},
      {"name": "rq_success", "value": "52", "type": "COUNTER"}
     ],
     "health_status": {` + health + `},
     "weight": 1,
     "hostname": "",
     "priority": 0,
     "locality": {"region": "r1", "zone": "z1"}
    }`
}

// adminAnswer is a whole answer: the bootstrap's admin cluster and the service's cluster
// with hosts (none: the cluster scaled to zero, whose host_statuses proto3 leaves out).
func adminAnswer(hosts ...string) []byte {
	svc := `  {
   "name": "` + vllmCluster + `",
   "observability_name": "` + vllmCluster + `",
   "added_via_api": true,
   "circuit_breakers": {"thresholds": [{"max_connections": 4294967295}, {"priority": "HIGH", "max_connections": 1024}]}`
	if len(hosts) > 0 {
		svc += ",\n   \"host_statuses\": [\n" + strings.Join(hosts, ",\n") + "\n   ]"
	}
	return []byte(`{
 "cluster_statuses": [
  {
   "name": "prometheus_stats",
   "observability_name": "prometheus_stats",
   "circuit_breakers": {"thresholds": [{"max_connections": 1024}, {"priority": "HIGH", "max_connections": 1024}]},
   "host_statuses": [
` + adminHost("127.0.0.1", "") + `
   ]
  },
` + svc + `
  }
 ]
}
`)
}

func healthyHosts(ips ...string) []string {
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = adminHost(ip, "")
	}
	return out
}

const adminDiscovery = `{"pools":{"decode":{"discovery":{"source":"envoy_admin","cluster":"prometheus_stats",
	"service_cluster":"` + vllmCluster + `","interval_ms":100}}}}`

// discoveryHost follows the polls one test sends.
type discoveryHost struct {
	*host
	cluster string
	seen    int
}

// polls returns the polls sent through d.cluster since the last call.
func (d *discoveryHost) polls() []proxytest.HttpCalloutAttribute {
	all := d.GetCalloutAttributesFromContext(proxytest.PluginContextID)
	var out []proxytest.HttpCalloutAttribute
	for _, c := range all[d.seen:] {
		if c.Upstream == d.cluster {
			out = append(out, c)
		}
	}
	d.seen = len(all)
	return out
}

// nextPoll lets the interval pass, ticks and returns the one poll sent.
func (d *discoveryHost) nextPoll(t *testing.T) proxytest.HttpCalloutAttribute {
	t.Helper()
	d.advance(100)
	d.Tick()
	p := d.polls()
	require.Len(t, p, 1, "one poll per interval")
	return p[0]
}

// answer polls once and answers it.
func (d *discoveryHost) answer(t *testing.T, status int, body []byte) {
	t.Helper()
	c := d.nextPoll(t)
	d.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", fmt.Sprint(status)}}, nil, body)
}

func startDiscovery(t *testing.T, vm types.VMContext, config, cluster string) *discoveryHost {
	return &discoveryHost{host: startHost(t, vm, config), cluster: cluster}
}

// spread sends n new conversations and returns where they went.
func (d *discoveryHost) spread(n int, tag string) map[string]int {
	out := map[string]int{}
	for i := 0; i < n; i++ {
		dest, _, _ := d.route(post("/v1/chat/completions", chat("hello"), [2]string{"x-session-id", fmt.Sprint(tag, i)}))
		out[dest]++
	}
	return out
}

func keys(m map[string]int) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return sortedStrings(out)
}

func sortedStrings(s []string) []string {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s
}

// A WasmPlugin with no pod IP in it: the fleet comes from Envoy's admin, scales up,
// down to zero and back, and every decision follows the last answer.
func TestDiscoveryFollowsTheFleet(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startDiscovery(t, vm, adminDiscovery, "prometheus_stats")
		dest, _, decision := h.route(post("/v1/chat/completions", chat("before any poll")))
		assert.Empty(t, dest, "no endpoint yet: the request passes through to Envoy's balancing")
		assert.Equal(t, "fallback", decision)

		h.Tick()
		first := h.polls()
		require.Len(t, first, 1)
		assert.Equal(t, "GET", headerOf(first[0].Headers, ":method"))
		assert.Equal(t, discovery.EnvoyAdminPath(vllmCluster), headerOf(first[0].Headers, ":path"))
		h.CallOnHttpCallResponse(first[0].CalloutID, [][2]string{{":status", "200"}}, nil,
			adminAnswer(healthyHosts("10.0.0.1", "10.0.0.2")...))
		assert.Equal(t, []string{"10.0.0.1:8000", "10.0.0.2:8000"}, keys(h.spread(6, "a")))

		h.answer(t, 200, adminAnswer(healthyHosts("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4")...))
		got := h.spread(8, "b")
		assert.Equal(t, []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"}, keys(got),
			"joining pods take new conversations at once")

		h.answer(t, 200, adminAnswer())
		dest, _, decision = h.route(post("/v1/chat/completions", chat("scaled to zero")))
		assert.Empty(t, dest)
		assert.Equal(t, "fallback", decision)

		h.answer(t, 200, adminAnswer(healthyHosts("10.0.0.7")...))
		dest, _, _ = h.route(post("/v1/chat/completions", chat("back")))
		assert.Equal(t, "10.0.0.7:8000", dest)
		assert.Zero(t, h.counter("kvroute_discovery_failures"))
		assert.Zero(t, h.counter("kvroute_fail_open"))
	})
}

// A rollout replaces every pod: each conversation moves once to a new pod and then
// sticks there; the old pods' load leaves the ledger, and their gauges read zero,
// their prefill rates too.
func TestDiscoveryRolloutMovesConversationsOnce(t *testing.T) {
	cfg := strings.Replace(adminDiscovery, `{"pools"`, `{"prefix":{"target_cache_tokens":40000},"pools"`, 1)
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startDiscovery(t, vm, cfg, "prometheus_stats")
		h.answer(t, 200, adminAnswer(healthyHosts("10.0.0.1", "10.0.0.2", "10.0.0.3")...))
		before := map[string]string{}
		open := map[string]uint32{} // one request per conversation still running at the rollout
		for i := 0; i < 9; i++ {
			conv := fmt.Sprint("conv-", i)
			dest, _, _ := h.route(post("/v1/chat/completions", chat("turn 1"), [2]string{"x-session-id", conv}))
			before[conv] = dest
			id, _ := h.send(post("/v1/chat/completions", chat("turn 1b"), [2]string{"x-session-id", conv}))
			open[conv] = id
		}
		assert.Equal(t, int64(9), h.gauge("kvroute_active_requests"))

		h.answer(t, 200, adminAnswer(healthyHosts("10.0.1.1", "10.0.1.2", "10.0.1.3")...))
		after := map[string]string{}
		for conv := range before {
			dest, _, decision := h.route(post("/v1/chat/completions", chat("turn 2"), [2]string{"x-session-id", conv}))
			assert.Equal(t, "new-conversation", decision, conv)
			assert.True(t, strings.HasPrefix(dest, "10.0.1."), "%s went to %s", conv, dest)
			after[conv] = dest
		}
		for conv := range before {
			for turn := 3; turn < 5; turn++ {
				dest, _, decision := h.route(post("/v1/chat/completions", chat("turn"), [2]string{"x-session-id", conv}))
				assert.Equal(t, "sticky", decision)
				assert.Equal(t, after[conv], dest, "%s stays on its new pod", conv)
			}
		}
		// The requests that were running on the old pods end now.
		for _, id := range open {
			h.respond(id, 200)
		}
		assert.Equal(t, int64(0), h.gauge("kvroute_active_requests"))
		assert.Equal(t, routing.Load{}, h.poolLoad("decode"))
		data, ok := h.allSharedData()
		require.True(t, ok)
		ledger := data["kvroute/load/decode"]
		for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
			id := binary.LittleEndian.AppendUint64(nil, routing.TargetID(ip+":8000", 0))
			assert.False(t, bytes.Contains(ledger, id), "the ledger keeps nothing of %s, not even its write clock", ip)
		}
		for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.1.1"} {
			for _, family := range TargetGaugeFamilies {
				name := TargetGaugeName(family, routing.Target{Address: ip + ":8000", RankText: "0"})
				v, err := h.GetGaugeMetric(name)
				require.NoError(t, err, "%s is defined", name)
				switch {
				case ip != "10.0.1.1" || family == TargetActiveRequests:
					assert.Zero(t, v, name)
				case family == TargetCacheTokens:
					assert.Equal(t, uint64(40000), v, "%s: the stated cache of a pod still there", name)
				default:
					assert.NotZero(t, v, "%s: a pod still there keeps the rate its answers showed", name)
				}
			}
		}
	})
}

// A host whose health flaps: while Envoy reports it unhealthy it takes no new
// conversation and its conversation moves; back healthy, it takes new ones again and
// the moved conversation stays where it went.
func TestDiscoveryFlappingHost(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startDiscovery(t, vm, adminDiscovery, "prometheus_stats")
		up := adminAnswer(healthyHosts("10.0.0.1", "10.0.0.2")...)
		down := adminAnswer(adminHost("10.0.0.1", ""), adminHost("10.0.0.2", `"eds_health_status": "HEALTHY", "failed_outlier_check": true`))
		h.answer(t, 200, up)
		var onTwo string
		for i := 0; onTwo == "" && i < 10; i++ {
			conv := fmt.Sprint("flap-", i)
			if dest, _, _ := h.route(post("/v1/chat/completions", chat("x"), [2]string{"x-session-id", conv})); dest == "10.0.0.2:8000" {
				onTwo = conv
			}
		}
		require.NotEmpty(t, onTwo)
		for round := 0; round < 3; round++ {
			h.answer(t, 200, down)
			assert.Equal(t, []string{"10.0.0.1:8000"}, keys(h.spread(4, fmt.Sprint("down", round))))
			dest, _, _ := h.route(post("/v1/chat/completions", chat("x"), [2]string{"x-session-id", onTwo}))
			assert.Equal(t, "10.0.0.1:8000", dest)
			h.answer(t, 200, up)
			// Back healthy, it takes new conversations again (these prompts are too
			// short for either host's recent work to set them apart).
			assert.Contains(t, keys(h.spread(4, fmt.Sprint("up", round))), "10.0.0.2:8000")
			dest, decision := "", ""
			dest, _, decision = h.route(post("/v1/chat/completions", chat("x"), [2]string{"x-session-id", onTwo}))
			assert.Equal(t, "10.0.0.1:8000", dest, "moved once, it stays")
			assert.Equal(t, "sticky", decision)
		}
	})
}

// An admin that times out, fails, or answers garbage: the last good set stays, every
// failure is counted, and no request notices.
func TestDiscoveryFaultsKeepTheLastGoodSet(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startDiscovery(t, vm, adminDiscovery, "prometheus_stats")
		h.answer(t, 200, adminAnswer(healthyHosts("10.0.0.1", "10.0.0.2")...))
		good := []string{"10.0.0.1:8000", "10.0.0.2:8000"}
		faults := []struct {
			name    string
			headers [][2]string
			body    []byte
		}{
			{"timeout", nil, nil}, // Envoy calls back with no headers
			{"503", [][2]string{{":status", "503"}}, []byte("no healthy upstream")},
			{"garbage", [][2]string{{":status", "200"}}, []byte("<html>hello</html>")},
			{"truncated", [][2]string{{":status", "200"}}, adminAnswer(healthyHosts("10.0.0.3")...)[:300]},
			{"cluster missing", [][2]string{{":status", "200"}}, []byte(`{"cluster_statuses":[{"name":"prometheus_stats"}]}`)},
			{"empty 200", [][2]string{{":status", "200"}}, nil},
		}
		for i, f := range faults {
			c := h.nextPoll(t)
			h.CallOnHttpCallResponse(c.CalloutID, f.headers, nil, f.body)
			assert.Equal(t, uint64(i+1), h.counter("kvroute_discovery_failures"), f.name)
			assert.Equal(t, good, keys(h.spread(4, f.name)), f.name)
		}
		// A poll that never answers holds no request either, and a later one still
		// brings news.
		h.nextPoll(t)
		h.advance(2500)
		h.Tick()
		for _, c := range h.polls() {
			h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}}, nil, adminAnswer(healthyHosts("10.0.0.5")...))
		}
		assert.Equal(t, []string{"10.0.0.5:8000"}, keys(h.spread(3, "later")))
		assert.Zero(t, h.counter("kvroute_fail_open"))
	})
}

// 10 000 pods in one answer of several MiB: parsed and applied within the guest's
// memory, and every decision still routes.
func TestDiscoveryTenThousandEndpoints(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startDiscovery(t, vm, adminDiscovery, "prometheus_stats")
		h.route(post("/v1/chat/completions", chat("warm up")))
		memBefore, _ := guestMemoryBytes(vm)
		hosts := make([]string, 10000)
		for i := range hosts {
			hosts[i] = adminHost(fmt.Sprintf("10.1.%d.%d", i/256, i%256), "")
		}
		body := adminAnswer(hosts...)
		require.Greater(t, len(body), 3<<20)
		h.answer(t, 200, body)
		seen := h.spread(50, "big")
		for dest := range seen {
			assert.True(t, strings.HasPrefix(dest, "10.1."), dest)
		}
		assert.Greater(t, len(seen), 40, "new conversations spread over the fleet")
		if memAfter, ok := guestMemoryBytes(vm); ok && h.wasm {
			t.Logf("guest memory %d MiB, grown by %d MiB", memAfter>>20, (memAfter-memBefore)>>20)
			assert.Less(t, memAfter-memBefore, uint64(96<<20), "guest memory grew by %d MiB", (memAfter-memBefore)>>20)
		}
		assert.Zero(t, h.counter("kvroute_discovery_failures"))
	})
}

// Another VM of the same Envoy holds the lease: this one sends no poll and applies the
// set the other publishes at its next decision; once the lease lapses, it polls itself.
func TestDiscoveryLeaseOneVMPolls(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startDiscovery(t, vm, adminDiscovery, "prometheus_stats")
		store := shareddata.Store{} // the emulator's shared data, as the plugin's
		lease := discovery.NewDiscoveryLease(store, "kvroute", "decode", 8)
		const otherVM = 2 // this VM's id is odd and random; the Go plugin's is 1
		held, err := lease.TryAcquire(otherVM, 0, 4e12)
		require.NoError(t, err)
		require.True(t, held, "the other VM takes the lease before this one's first tick")
		for i := 0; i < 3; i++ {
			h.advance(100)
			h.Tick()
		}
		assert.Empty(t, h.polls(), "the other VM holds the lease")

		cfg, err := config.ParseConfig([]byte(adminDiscovery))
		require.NoError(t, err)
		board := discovery.NewEndpointBoard(store, "kvroute", "decode", *cfg.Pools.Decode.Discovery, 8)
		_, err = board.Publish([]discovery.DiscoveredEndpoint{{Address: "10.0.0.8:8000"}})
		require.NoError(t, err)
		dest, _, _ := h.route(post("/v1/chat/completions", chat("from the other VM's poll")))
		assert.Equal(t, "10.0.0.8:8000", dest, "applied at the next decision, no tick needed")

		_, err = lease.TryAcquire(otherVM, 0, 1) // the other VM's lease lapses
		require.NoError(t, err)
		h.answer(t, 200, adminAnswer(healthyHosts("10.0.0.9")...))
		dest, _, _ = h.route(post("/v1/chat/completions", chat("now this VM polls")))
		assert.Equal(t, "10.0.0.9:8000", dest)
		held, err = lease.TryAcquire(otherVM, 0, 1)
		require.NoError(t, err)
		assert.False(t, held, "this VM holds the lease now")
	})
}

// The http source, in both shapes it reads; DP sizes apply per endpoint.
func TestDiscoveryHTTPSource(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startDiscovery(t, vm, `{"pools":{"decode":{"endpoints":[{"address":"10.0.0.99:8000"}],
			"discovery":{"source":"http","cluster":"kvroute_discovery","path":"/v1/endpoints","dp_size":2,"interval_ms":100}}}}`,
			"kvroute_discovery")
		dest, _, _ := h.route(post("/v1/chat/completions", chat("static first")))
		assert.Equal(t, "10.0.0.99:8000", dest, "the static endpoints serve until the first good poll")
		h.answer(t, 200, []byte(`{"endpoints":[{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000","dp_size":1}]}`))
		seen := map[string]bool{}
		for i := 0; i < 9; i++ {
			dest, rank, _ := h.route(post("/v1/chat/completions", chat("x"), [2]string{"x-session-id", fmt.Sprint("h", i)}))
			seen[dest+"#"+rank] = true
		}
		assert.Equal(t, map[string]bool{"10.0.0.1:8000#0": true, "10.0.0.1:8000#1": true, "10.0.0.2:8000#": true}, seen)

		h.answer(t, 200, []byte(`{"endpoints":[{"address":"10.0.0.3","port":8000,"name":"vllm-3"}]}`)) // llm-d's shape
		dest, rank, _ := h.route(post("/v1/chat/completions", chat("llm-d")))
		assert.Equal(t, "10.0.0.3:8000", dest)
		assert.NotEmpty(t, rank)
		h.answer(t, 200, []byte(`{"endpoints":[{"address":"10.0.0.4:8000"},{"address":"no port"}]}`))
		assert.Equal(t, uint64(1), h.counter("kvroute_discovery_failures"), "one bad entry: the list is not trusted")
		dest, _, _ = h.route(post("/v1/chat/completions", chat("kept")))
		assert.Equal(t, "10.0.0.3:8000", dest)
	})
}

// Engine metrics are scraped from the discovered endpoints, not the static ones.
func TestDiscoveryEngineScrapesFollow(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startDiscovery(t, vm, `{"engine_metrics":{"enabled":true,"interval_ms":100,"stale_ms":5000},
			"pools":{"decode":{"endpoints":[{"address":"10.0.0.99:8000"}],"discovery":{"source":"envoy_admin",
			"cluster":"prometheus_stats","service_cluster":"`+vllmCluster+`","interval_ms":100}}}}`, "prometheus_stats")
		h.answer(t, 200, adminAnswer(healthyHosts("10.0.0.1", "10.0.0.2")...))
		h.advance(100)
		h.Tick()
		var scraped []string
		for _, c := range h.GetCalloutAttributesFromContext(proxytest.PluginContextID)[h.seen:] {
			if c.Upstream == "kvroute_metrics" {
				scraped = append(scraped, headerOf(c.Headers, "x-gateway-destination-endpoint"))
			}
		}
		require.NotEmpty(t, scraped)
		last := sortedStrings(scraped[len(scraped)-2:])
		assert.Equal(t, []string{"10.0.0.1:8000", "10.0.0.2:8000"}, last)
	})
}

// A discovered prefill pool: P/D uses it as soon as it has endpoints, and goes direct
// while it has none; its targets get their gauges as they join.
func TestDiscoveryPrefillPool(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startDiscovery(t, vm, `{"disaggregation":{"mode":"sidecar"},"pools":{
			"decode":{"endpoints":[{"address":"10.0.0.1:8000"}]},
			"prefill":{"discovery":{"source":"http","cluster":"kvroute_discovery","path":"/prefill","interval_ms":100}}}}`,
			"kvroute_discovery")
		id, _ := h.send(post("/v1/chat/completions", chat("no prefill yet")))
		d, _ := h.header(id, "x-kvroute-decision")
		assert.True(t, strings.HasSuffix(d, ";pd=direct"), d)
		_, ok := h.header(id, "x-prefiller-host-port")
		assert.False(t, ok)
		h.respond(id, 200)

		h.answer(t, 200, []byte(`[{"address":"10.0.2.1","port":8000}]`))
		id, _ = h.send(post("/v1/chat/completions", chat("now disaggregated")))
		pf, _ := h.header(id, "x-prefiller-host-port")
		assert.Equal(t, "10.0.2.1:8000", pf)
		const gauge = "kvroute_target_active_requests.10_0_2_1_8000.rank_0"
		assert.Equal(t, int64(1), h.gauge(gauge), "a discovered prefill target gets its gauges")
		h.respond(id, 200)
		assert.Equal(t, routing.Load{}, h.poolLoad("prefill"))
		assert.Equal(t, int64(0), h.gauge(gauge))
	})
}
