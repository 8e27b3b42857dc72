package routing

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/extract"
	"github.com/kvroute/kvroute/routing/hashx"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeClock is a settable millisecond clock.
type fakeClock struct{ ms int64 }

func (c *fakeClock) now() int64 { return c.ms }

func testConfig(t testing.TB, extra string) *config.Config {
	t.Helper()
	js := `{"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"},{"address":"10.0.0.3:8000"}]}}` + extra + `}`
	cfg, err := config.ParseConfig([]byte(js))
	require.NoError(t, err)
	return &cfg
}

func convRequest(id string) *extract.Request {
	return &extract.Request{Conversation: hashx.FingerprintString(id), HasConversation: true, Tokens: 10, Identity: hashx.FingerprintString("r-" + id)}
}

func TestStickyAfterFirstTurn(t *testing.T) {
	clock := &fakeClock{ms: 1e6}
	r := NewRouter(testConfig(t, ""), state.NewMemoryStore(), clock.now)
	d := r.Decide(convRequest("a"), NoRank)
	assert.Equal(t, KindNewConversation, d.Kind)
	err := r.Release(d.Ticket)
	require.NoError(t, err)
	for i := 0; i < 5; i++ {
		d2 := r.Decide(convRequest("a"), NoRank)
		assert.Equal(t, KindSticky, d2.Kind)
		assert.Equal(t, d.Target.ID, d2.Target.ID)
		err := r.Release(d2.Ticket)
		require.NoError(t, err)
	}
}

func TestTwoRoutersOverOneStoreAgree(t *testing.T) {
	// Two VMs of one Envoy: separate Routers, one shared store.
	store, clock := state.NewMemoryStore(), &fakeClock{ms: 1e6}
	a := NewRouter(testConfig(t, ""), store, clock.now)
	b := NewRouter(testConfig(t, ""), store, clock.now)
	var seen []string
	for i := 0; i < 6; i++ {
		vm := a
		if i%2 == 1 {
			vm = b
		}
		d := vm.Decide(convRequest(fmt.Sprint("c", i)), NoRank)
		seen = append(seen, d.Target.Address)
		_ = vm.Release(d.Ticket)
	}
	// One shared cursor: the two VMs continue one round robin.
	assert.Equal(t, []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}, seen)
	d := b.Decide(convRequest("c0"), NoRank)
	assert.Equal(t, KindSticky, d.Kind)
	assert.Equal(t, "10.0.0.1:8000", d.Target.Address)
}

func TestMappingToRemovedTargetCountsAsAbsent(t *testing.T) {
	store, clock := state.NewMemoryStore(), &fakeClock{ms: 1e6}
	r := NewRouter(testConfig(t, ""), store, clock.now)
	placed := map[string]string{}
	for i := 0; i < 6; i++ {
		id := fmt.Sprint("c", i)
		d := r.Decide(convRequest(id), NoRank)
		placed[id] = d.Target.Address
		_ = r.Release(d.Ticket)
	}
	// Reconfigure: drop 10.0.0.2, reorder the rest, add 10.0.0.4.
	cfg, err := config.ParseConfig([]byte(`{"pools":{"decode":{"endpoints":[{"address":"10.0.0.4:8000"},{"address":"10.0.0.3:8000"},{"address":"10.0.0.1:8000"}]}}}`))
	require.NoError(t, err)
	r2 := NewRouter(&cfg, store, clock.now)
	for id, addr := range placed {
		d := r2.Decide(convRequest(id), NoRank)
		if addr == "10.0.0.2:8000" {
			assert.Equal(t, KindNewConversation, d.Kind, id)
		} else {
			assert.Equal(t, KindSticky, d.Kind, id)
			assert.Equal(t, addr, d.Target.Address, id)
		}
		_ = r2.Release(d.Ticket)
	}
}

func TestStateFailureFallsBackWithoutState(t *testing.T) {
	for name, store := range map[string]state.Store{
		"cas conflicts on every try": state.FailingStore{SetErr: state.ErrCASMismatch, Inner: state.NewMemoryStore()},
		"host error on get":          state.FailingStore{GetErr: errors.New("host: internal failure")},
	} {
		t.Run(name, func(t *testing.T) {
			clock := &fakeClock{ms: 1e6}
			r := NewRouter(testConfig(t, ""), store, clock.now)
			// Explicit conversations: rendezvous hashing, the same on every try and
			// every replica.
			first := r.Decide(convRequest("x"), NoRank)
			assert.Equal(t, KindFallback, first.Kind)
			assert.True(t, first.StateFailed)
			other := NewRouter(testConfig(t, ""), store, clock.now)
			for i := 0; i < 3; i++ {
				assert.Equal(t, first.Target.ID, other.Decide(convRequest("x"), NoRank).Target.ID)
			}
			// Anonymous requests: still spread and never blocked.
			seen := map[string]bool{}
			failed := 0
			for i := 0; i < 30; i++ {
				d := r.Decide(&extract.Request{Tokens: 5, Identity: uint64(i)}, NoRank)
				seen[d.Target.Address] = true
				if d.StateFailed {
					failed++
				}
				if name == "host error on get" {
					// Nothing could be read: a VM-local round robin, nothing to release.
					assert.True(t, d.StateFailed)
					assert.False(t, d.Ticket.Valid)
				} else {
					// The ledger was read; only writing the VM's batch fails, so its
					// load is held locally, placed by it, and released like any other.
					assert.NotEqual(t, KindFallback, d.Kind)
					assert.True(t, d.Ticket.Valid)
				}
			}
			assert.Len(t, seen, 3)
			assert.NotZero(t, failed, "a batch that cannot be written counts as a state failure")
		})
	}
}

func TestTrustedClientRankRestrictsTargets(t *testing.T) {
	cfg, err := config.ParseConfig([]byte(`{"trust_client_dp_rank":true,"pools":{"decode":{"endpoints":[{"address":"a:1","dp_size":4},{"address":"b:1","dp_size":2}]}}}`))
	require.NoError(t, err)
	r := NewRouter(&cfg, state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	for i := 0; i < 8; i++ {
		d := r.Decide(&extract.Request{Tokens: 3, Identity: uint64(i)}, 3)
		assert.Equal(t, "a:1", d.Target.Address)
		assert.Equal(t, 3, d.Target.Rank)
	}
	for i := 0; i < 8; i++ {
		d := r.Decide(&extract.Request{Tokens: 3, Identity: uint64(i)}, 1)
		assert.Equal(t, 1, d.Target.Rank)
	}
	// A rank no endpoint has is ignored.
	seen := map[int]bool{}
	for i := 0; i < 32; i++ {
		seen[r.Decide(&extract.Request{Tokens: 3, Identity: uint64(i)}, 9).Target.Rank] = true
	}
	assert.Greater(t, len(seen), 1)
}

// Without a rank or an ejection a view's eligible targets are the list every target
// is in, shared by the views: what the test of each gives, through a change of the
// pool's endpoints, and never written by a decision.
func TestViewWithoutRankOrEjectionHasEveryTarget(t *testing.T) {
	cfg := testConfig(t, "")
	r := NewRouter(cfg, state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	p := r.decode
	check := func() {
		t.Helper()
		v, err := r.view(p, NoRank, 1e6)
		require.NoError(t, err)
		require.Equal(t, p.eligibleTargets(NoRank, nil), v.eligible)
		for i, e := range p.everyTarget {
			require.Equal(t, i, e)
		}
	}
	check()
	for i := 0; i < 50; i++ {
		r.Decide(&extract.Request{Tokens: 10 + i, Identity: uint64(i)}, NoRank)
	}
	check()
	eps := append(cfg.Pools.Decode.Endpoints, config.Endpoint{Address: "10.0.0.9:8000", DPSize: 2})
	p.setTargets(eps)
	check()
	require.Len(t, p.everyTarget, 5)
}

// A target carries its endpoint's health key, and a report on a target made by hand
// (without it) reaches the same endpoint.
func TestTargetsCarryTheirEndpointsHealthKey(t *testing.T) {
	cfg := testConfig(t, `,"health":{"failure_threshold":2}`)
	r := NewRouter(cfg, state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	for _, tg := range r.DecodeTargets() {
		require.Equal(t, hashx.FingerprintString(tg.Address), tg.EndpointFP, tg.Address)
	}
	tg := r.DecodeTargets()[1]
	ejected, err := r.ReportHealth(tg, false, true)
	require.NoError(t, err)
	require.False(t, ejected)
	ejected, err = r.ReportHealth(Target{Address: tg.Address}, false, true)
	require.NoError(t, err)
	require.True(t, ejected, "the second failure of one endpoint")
}
