package routing

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/engine"
	"github.com/kvroute/kvroute/routing/extract"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A hybrid-DP fleet: b:1 serves ranks 2..3 and c:1 ranks 1..4 of their deployments.
const dpStartPools = `{"trust_client_dp_rank":true,"pools":{"decode":{"endpoints":[` +
	`{"address":"a:1","dp_size":2},` +
	`{"address":"b:1","dp_size":2,"dp_rank_start":2},` +
	`{"address":"c:1","dp_size":4,"dp_rank_start":1}]}}}`

func dpStartConfig(t *testing.T, js string) *config.Config {
	t.Helper()
	cfg, err := config.ParseConfig([]byte(js))
	require.NoError(t, err)
	return &cfg
}

func TestTargetsNumberRanksFromDPRankStart(t *testing.T) {
	pt := NewPoolTargets(dpStartConfig(t, dpStartPools).Pools.Decode)
	got := map[string][]int{}
	for _, tg := range pt.Targets {
		got[tg.Address] = append(got[tg.Address], tg.Rank)
		assert.Equal(t, fmt.Sprint(tg.Rank), tg.RankText, "the header carries the worker rank")
		assert.Equal(t, TargetID(tg.Address, tg.Rank), tg.ID, "identity hashes the rank the header names")
		assert.GreaterOrEqual(t, pt.Index(tg.ID), 0)
	}
	assert.Equal(t, map[string][]int{"a:1": {0, 1}, "b:1": {2, 3}, "c:1": {1, 2, 3, 4}}, got)
}

func TestTrustedRankIsReadInTheHeadersNumbering(t *testing.T) {
	cfg := dpStartConfig(t, dpStartPools)
	for _, tc := range []struct {
		rank int
		want []string // the targets a request with this rank may reach
	}{
		{0, []string{"a:1#0"}},
		{2, []string{"b:1#2", "c:1#2"}},
		{4, []string{"c:1#4"}},
		{1, []string{"a:1#1", "c:1#1"}},
	} {
		r := NewRouter(cfg, state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
		seen := map[string]bool{}
		for i := 0; i < 40; i++ {
			d := r.Decide(&extract.Request{Tokens: 10, Identity: uint64(i)}, tc.rank)
			seen[fmt.Sprintf("%s#%d", d.Target.Address, d.Target.Rank)] = true
			_ = r.Release(d.Ticket)
		}
		want := map[string]bool{}
		for _, w := range tc.want {
			want[w] = true
		}
		assert.Equal(t, want, seen, "rank %d", tc.rank)
	}

	// A rank no endpoint serves is ignored: every target stays eligible.
	r := NewRouter(cfg, state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	seen := map[string]bool{}
	for i := 0; i < 80; i++ {
		d := r.Decide(&extract.Request{Tokens: 10, Identity: uint64(i)}, 5)
		seen[fmt.Sprintf("%s#%d", d.Target.Address, d.Target.Rank)] = true
		_ = r.Release(d.Ticket)
	}
	assert.Len(t, seen, 8)
}

func TestTrustedRankWithoutStateUsesTheHeadersNumbering(t *testing.T) {
	r := NewRouter(dpStartConfig(t, dpStartPools), state.FailingStore{GetErr: errors.New("host: internal failure")}, (&fakeClock{ms: 1e6}).now)
	for i := 0; i < 20; i++ {
		d := r.Decide(&extract.Request{Tokens: 10, Identity: uint64(i)}, 3)
		require.Equal(t, KindFallback, d.Kind)
		assert.Contains(t, []string{"b:1#3", "c:1#3"}, fmt.Sprintf("%s#%d", d.Target.Address, d.Target.Rank))
	}
}

// Changing an endpoint's dp_rank_start changes which engine each of its targets
// reaches: a conversation must not stay on a target that now names another engine,
// and one whose rank is still served stays where it was.
func TestChangingDPRankStartDoesNotMisattributeConversations(t *testing.T) {
	store := state.NewMemoryStore()
	clock := &fakeClock{ms: 1e6}
	before := dpStartConfig(t, `{"pools":{"decode":{"endpoints":[{"address":"a:1","dp_size":2}]}}}`)
	r := NewRouter(before, store, clock.now)
	placed := map[string]int{}
	for i := 0; i < 8; i++ {
		id := fmt.Sprint("conv-", i)
		d := r.Decide(convRequest(id), NoRank)
		placed[id] = d.Target.Rank
		require.NoError(t, r.Release(d.Ticket))
	}
	require.Len(t, map[int]bool{placed["conv-0"]: true, placed["conv-1"]: true}, 2, "round robin used both ranks")

	// Now the endpoint is said to serve ranks 1..2: rank 1 is the same engine as before.
	after := dpStartConfig(t, `{"pools":{"decode":{"endpoints":[{"address":"a:1","dp_size":2,"dp_rank_start":1}]}}}`)
	r2 := NewRouter(after, store, clock.now)
	for id, rank := range placed {
		d := r2.Decide(convRequest(id), NoRank)
		if rank == 1 {
			assert.Equal(t, KindSticky, d.Kind, "%s: rank 1 still reaches the engine that holds it", id)
			assert.Equal(t, 1, d.Target.Rank)
		} else {
			assert.Equal(t, KindNewConversation, d.Kind, "%s: rank 0 is no longer served; its state is not carried to rank 1 or 2", id)
		}
		require.NoError(t, r2.Release(d.Ticket))
	}
}

func TestEngineFiguresOfARankStart(t *testing.T) {
	cfg := dpStartConfig(t, `{"engine_metrics":{"enabled":true},"pools":{"decode":{"endpoints":[{"address":"a:1","dp_size":2,"dp_rank_start":4},{"address":"b:1"}]}}}`)
	r := NewRouter(cfg, state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	page := []byte("vllm:num_requests_running{engine=\"4\",model_name=\"m\"} 50\nvllm:num_requests_running{engine=\"5\",model_name=\"m\"} 0\n")
	figures, err := engine.ParseEngineMetrics(config.FlavorVLLM, page, 2, 4)
	require.NoError(t, err)
	require.NoError(t, r.PublishEngineFigures(false, "a:1", figures))
	for i := 0; i < 20; i++ {
		d := r.Decide(&extract.Request{Tokens: 10, Identity: uint64(i)}, NoRank)
		assert.False(t, d.Target.Address == "a:1" && d.Target.Rank == 4, "rank 4 of a:1 is busy")
		_ = r.Release(d.Ticket)
	}
}

func TestParseEngineMetricsRankStart(t *testing.T) {
	page := func(engines ...int) []byte {
		var s string
		for _, e := range engines {
			s += fmt.Sprintf("vllm:num_requests_running{engine=\"%d\",model_name=\"m\"} %d\n", e, 10+e)
		}
		return []byte(s)
	}
	for _, tc := range []struct {
		name         string
		engines      []int
		dpSize, from int
		want         map[int]float64
	}{
		{"labels in the header's numbering", []int{4, 5}, 2, 4, map[int]float64{4: 14, 5: 15}},
		{"node-local labels on a start rank", []int{0, 1}, 2, 4, map[int]float64{4: 10, 5: 11}},
		{"global labels behind node-local headers", []int{4, 5, 6, 7}, 4, 0, map[int]float64{0: 14, 1: 15, 2: 16, 3: 17}},
		{"labels fitting the ranks win", []int{0, 5}, 2, 0, map[int]float64{0: 10}},
		{"labels wider than the ranks", []int{4, 6}, 2, 0, nil},
		{"one rank", []int{7}, 1, 3, map[int]float64{3: 17}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := engine.ParseEngineMetrics(config.FlavorVLLM, page(tc.engines...), tc.dpSize, tc.from)
			if tc.want == nil {
				require.ErrorIs(t, err, engine.ErrNoEngineFigures)
				return
			}
			require.NoError(t, err)
			running := map[int]float64{}
			for r, f := range got {
				running[r] = f.Running
			}
			assert.Equal(t, tc.want, running)
		})
	}

	// Unlabelled series are spread over the endpoint's own ranks.
	got, err := engine.ParseEngineMetrics(config.FlavorVLLM, []byte("vllm:num_requests_running 8\n"), 2, 6)
	require.NoError(t, err)
	assert.Equal(t, map[int]engine.EngineFigures{6: {Running: 4}, 7: {Running: 4}}, got)
}
