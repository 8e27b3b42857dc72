package routing

import (
	"testing"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/engine"
	"github.com/kvroute/kvroute/routing/extract"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEngineFiguresRaiseLoadWhileFresh(t *testing.T) {
	clock := &fakeClock{ms: 1_000_000}
	cfg := testConfig(t, `,"engine_metrics":{"enabled":true,"interval_ms":1000,"stale_ms":5000}`)
	store := state.NewMemoryStore()
	r := NewRouter(cfg, store, clock.now)
	// Another gateway replica's traffic: the engine on 10.0.0.1 runs 30 requests.
	require.NoError(t, r.PublishEngineFigures(false, "10.0.0.1:8000", map[int]engine.EngineFigures{0: {Running: 20, Waiting: 10}}))
	busy := 0
	for i := 0; i < 30; i++ {
		d := r.Decide(&extract.Request{Tokens: 100, Identity: uint64(i)}, NoRank)
		if d.Target.Address == "10.0.0.1:8000" {
			busy++
		}
		_ = r.Release(d.Ticket)
	}
	assert.Zero(t, busy, "the engine's own count keeps traffic off the busy worker")

	// Another VM of the same Envoy reads the same board.
	other := NewRouter(cfg, store, clock.now)
	d := other.Decide(&extract.Request{Tokens: 100, Identity: 99}, NoRank)
	assert.NotEqual(t, "10.0.0.1:8000", d.Target.Address)

	// Figures older than stale_ms no longer count.
	clock.ms += 5001
	seen := map[string]bool{}
	for i := 0; i < 30; i++ {
		d := r.Decide(&extract.Request{Tokens: 100, Identity: uint64(i)}, NoRank)
		seen[d.Target.Address] = true
		_ = r.Release(d.Ticket)
	}
	assert.True(t, seen["10.0.0.1:8000"])
}

func TestEngineFiguresPerDPRank(t *testing.T) {
	cfg, err := config.ParseConfig([]byte(`{"engine_metrics":{"enabled":true},"pools":{"decode":{"endpoints":[{"address":"a:1","dp_size":2},{"address":"b:1"}]}}}`))
	require.NoError(t, err)
	r := NewRouter(&cfg, state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	require.NoError(t, r.PublishEngineFigures(false, "a:1", map[int]engine.EngineFigures{0: {Running: 50}, 1: {Running: 0}, 7: {Running: 99}}))
	for i := 0; i < 20; i++ {
		d := r.Decide(&extract.Request{Tokens: 10, Identity: uint64(i)}, NoRank)
		assert.False(t, d.Target.Address == "a:1" && d.Target.Rank == 0, "rank 0 of a:1 is busy")
		_ = r.Release(d.Ticket)
	}
}

func TestEngineFiguresIgnoredWhenDisabled(t *testing.T) {
	r := NewRouter(testConfig(t, ""), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	require.NoError(t, r.PublishEngineFigures(false, "10.0.0.1:8000", map[int]engine.EngineFigures{0: {Running: 100}}))
	seen := map[string]bool{}
	for i := 0; i < 30; i++ {
		d := r.Decide(&extract.Request{Tokens: 100, Identity: uint64(i)}, NoRank)
		seen[d.Target.Address] = true
		_ = r.Release(d.Ticket)
	}
	assert.Len(t, seen, 3)
}

func TestSlotWaitCountsTheLedgersOwnRequests(t *testing.T) {
	// The engine reports 50 running where this gateway sent 10 of 200 sent lately:
	// the slot wait goes by the 10, as the 200 are this gateway's alone.
	clock := &fakeClock{ms: 1_000_000}
	cfg := testConfig(t, `,"engine_metrics":{"enabled":true,"interval_ms":1000,"stale_ms":5000}`)
	r := NewRouter(cfg, state.NewMemoryStore(), clock.now)
	targets := r.DecodeTargets()
	for k := 0; k < 200; k++ {
		tk, err := r.decode.ledger.AcquireQueued(targets[k%len(targets)].ID, 100, 100, clock.ms, clock.ms)
		require.NoError(t, err)
		require.NoError(t, r.decode.ledger.FirstChunk(&tk, clock.ms+10))
		if k >= 10 {
			require.NoError(t, r.decode.ledger.Release(tk, clock.now))
		}
	}
	require.NoError(t, r.PublishEngineFigures(false, targets[0].Address, map[int]engine.EngineFigures{0: {Running: 50}}))
	v, err := r.view(r.decode, NoRank, clock.ms)
	require.NoError(t, err)
	require.Greater(t, v.total.Requests, int64(50), "the engine's report counts for load")
	window := float64(recentHalfLifeMS + clock.ms%recentHalfLifeMS)
	assert.InDelta(t, 10*window/200/16*v.rate, v.slotWait(16), 1e-6)
}
