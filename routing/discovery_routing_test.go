package routing

import (
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/discovery"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// istioCluster is the service cluster Istio names a pool's Kubernetes service by.
const istioCluster = "outbound|8000||vllm.llm.svc.cluster.local"

func discoveredConfig(t testing.TB, static string) *config.Config {
	t.Helper()
	cfg, err := config.ParseConfig([]byte(`{"pools":{"decode":{"endpoints":[` + static + `],
		"discovery":{"service_cluster":"` + istioCluster + `","dp_size":2}}}}`))
	require.NoError(t, err)
	return &cfg
}

func TestDiscoveredSetReplacesStaticEndpoints(t *testing.T) {
	store, clock := state.NewMemoryStore(), &fakeClock{ms: 1e6}
	r := NewRouter(discoveredConfig(t, `{"address":"10.0.0.9:8000"}`), store, clock.now)
	d := r.Decide(convRequest("a"), NoRank)
	assert.Equal(t, "10.0.0.9:8000", d.Target.Address, "before the first poll the static endpoints serve")
	_ = r.Release(d.Ticket)

	other := NewRouter(discoveredConfig(t, `{"address":"10.0.0.9:8000"}`), store, clock.now) // another VM
	require.NoError(t, other.PublishDiscovered(false, []discovery.DiscoveredEndpoint{{Address: "10.0.0.1:8000"}, {Address: "10.0.0.2:8000", DPSize: 1}}))
	seen := map[string]bool{}
	for i := 0; i < 12; i++ {
		d := r.Decide(convRequest(fmt.Sprint("c", i)), NoRank)
		seen[d.Target.Address+"#"+d.Target.RankText] = true
		_ = r.Release(d.Ticket)
	}
	assert.Equal(t, map[string]bool{"10.0.0.1:8000#0": true, "10.0.0.1:8000#1": true, "10.0.0.2:8000#0": true}, seen,
		"the next decision uses the other VM's set; discovery.dp_size applies where the source names none")
	assert.Equal(t, []config.Endpoint{{Address: "10.0.0.1:8000", DPSize: 2}, {Address: "10.0.0.2:8000", DPSize: 1}}, r.Endpoints(false))
}

func TestDiscoveredEndpointsKeepTheirRankNumbering(t *testing.T) {
	store, clock := state.NewMemoryStore(), &fakeClock{ms: 1e6}
	r := NewRouter(discoveredConfig(t, ``), store, clock.now)
	require.NoError(t, r.PublishDiscovered(false, []discovery.DiscoveredEndpoint{
		{Address: "10.0.0.1:8000", DPSize: 2, DPRankStart: 4}, {Address: "10.0.0.2:8000"}}))
	seen := map[string]bool{}
	for i := 0; i < 12; i++ {
		d := r.Decide(convRequest(fmt.Sprint("c", i)), NoRank)
		seen[d.Target.Address+"#"+d.Target.RankText] = true
		_ = r.Release(d.Ticket)
	}
	assert.Equal(t, map[string]bool{"10.0.0.1:8000#4": true, "10.0.0.1:8000#5": true,
		"10.0.0.2:8000#0": true, "10.0.0.2:8000#1": true}, seen,
		"a discovered dp_rank_start numbers the rank header as a static one does")
}

func TestEmptyDiscoveredPoolPassesThrough(t *testing.T) {
	store, clock := state.NewMemoryStore(), &fakeClock{ms: 1e6}
	r := NewRouter(discoveredConfig(t, ``), store, clock.now)
	d := r.Decide(convRequest("a"), NoRank)
	assert.Equal(t, KindFallback, d.Kind)
	assert.Empty(t, d.Target.Address, "no endpoint: no destination")
	assert.False(t, d.Ticket.Valid)
	assert.False(t, d.StateFailed)
	ejected, err := r.ReportHealth(d.Target, false, true)
	require.NoError(t, err)
	assert.False(t, ejected)

	require.NoError(t, r.PublishDiscovered(false, []discovery.DiscoveredEndpoint{{Address: "10.0.0.1:8000"}}))
	d = r.Decide(convRequest("a"), NoRank)
	assert.Equal(t, "10.0.0.1:8000", d.Target.Address)
	_ = r.Release(d.Ticket)
	require.NoError(t, r.PublishDiscovered(false, []discovery.DiscoveredEndpoint{}))
	d = r.Decide(convRequest("a"), NoRank)
	assert.Equal(t, KindFallback, d.Kind, "scaled to zero")
}

// A conversation whose target left is placed afresh once, then sticks to its new home;
// it does not move back when the old pod's address returns.
func TestConversationOnRemovedTargetMovesOnceThenSticks(t *testing.T) {
	store, clock := state.NewMemoryStore(), &fakeClock{ms: 1e6}
	r := NewRouter(discoveredConfig(t, ``), store, clock.now)
	all := []discovery.DiscoveredEndpoint{{Address: "10.0.0.1:8000", DPSize: 1}, {Address: "10.0.0.2:8000", DPSize: 1}, {Address: "10.0.0.3:8000", DPSize: 1}}
	require.NoError(t, r.PublishDiscovered(false, all))
	first := r.Decide(convRequest("chat"), NoRank)
	_ = r.Release(first.Ticket)
	var rest []discovery.DiscoveredEndpoint
	for _, e := range all {
		if e.Address != first.Target.Address {
			rest = append(rest, e)
		}
	}
	require.NoError(t, r.PublishDiscovered(false, rest))
	moved := r.Decide(convRequest("chat"), NoRank)
	_ = r.Release(moved.Ticket)
	assert.Equal(t, KindNewConversation, moved.Kind)
	assert.NotEqual(t, first.Target.Address, moved.Target.Address)
	require.NoError(t, r.PublishDiscovered(false, all)) // the address comes back
	for i := 0; i < 3; i++ {
		d := r.Decide(convRequest("chat"), NoRank)
		_ = r.Release(d.Ticket)
		assert.Equal(t, KindSticky, d.Kind)
		assert.Equal(t, moved.Target.Address, d.Target.Address)
	}
}

func TestDiscoveredPrefillPoolEmptyGoesDirect(t *testing.T) {
	cfg, err := config.ParseConfig([]byte(`{"disaggregation":{"mode":"sidecar"},"pools":{
		"decode":{"endpoints":[{"address":"10.0.0.1:8000"}]},
		"prefill":{"discovery":{"source":"http","cluster":"kvroute_discovery","path":"/prefill.json"}}}}`))
	require.NoError(t, err)
	r := NewRouter(&cfg, state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	d := r.Decide(convRequest("a"), NoRank)
	assert.Equal(t, PDDirect, d.PD, "no prefill endpoint yet")
	_ = r.Release(d.Ticket)
	require.NoError(t, r.PublishDiscovered(true, []discovery.DiscoveredEndpoint{{Address: "10.0.1.1:8000"}}))
	d = r.Decide(convRequest("b"), NoRank)
	assert.Equal(t, PDDisaggregated, d.PD)
	assert.Equal(t, "10.0.1.1:8000", d.Prefill.Address)
	assert.Equal(t, config.DefaultBootstrapPort, d.Prefill.BootstrapPort)
}
