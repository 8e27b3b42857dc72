package main

import (
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/internal/shareddata"
	"github.com/kvroute/kvroute/routing"
	"github.com/kvroute/kvroute/routing/engine"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two vLLM hybrid-DP nodes: 10.0.0.1 serves ranks 4..5 of the deployment, 10.0.0.2
// ranks 0..1.
const dpStartFleet = `{"trust_client_dp_rank":true,"pools":{"decode":{"endpoints":[
	{"address":"10.0.0.1:8000","dp_size":2,"dp_rank_start":4},{"address":"10.0.0.2:8000","dp_size":2}]}}}`

func TestRankHeaderCarriesDPRankStart(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, dpStartFleet)
		seen := map[string]bool{}
		for i := 0; i < 24; i++ {
			dest, rank, _ := h.route(post("/v1/completions", fmt.Sprintf(`{"prompt":"q%d"}`, i)))
			seen[dest+"#"+rank] = true
		}
		assert.Equal(t, map[string]bool{
			"10.0.0.1:8000#4": true, "10.0.0.1:8000#5": true,
			"10.0.0.2:8000#0": true, "10.0.0.2:8000#1": true,
		}, seen)
		// The per-target gauges are named by the rank the worker answers to.
		for _, name := range []string{
			"kvroute_target_active_requests.10_0_0_1_8000.rank_4",
			"kvroute_target_active_requests.10_0_0_1_8000.rank_5",
			"kvroute_target_active_requests.10_0_0_2_8000.rank_0",
		} {
			_, err := h.GetGaugeMetric(name)
			assert.NoError(t, err, name)
		}
		_, err := h.GetGaugeMetric("kvroute_target_active_requests.10_0_0_1_8000.rank_0")
		assert.Error(t, err, "10.0.0.1 has no rank 0")
	})
}

// A trusted client rank is in the numbering the header carries: 5 is 10.0.0.1's
// second rank, 1 is 10.0.0.2's; 2 is nobody's and is ignored.
func TestTrustedClientRankUsesDPRankStart(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, dpStartFleet)
		for _, tc := range []struct{ sent, dest string }{
			{"5", "10.0.0.1:8000"}, {"4", "10.0.0.1:8000"}, {"1", "10.0.0.2:8000"}, {"0", "10.0.0.2:8000"},
		} {
			for i := 0; i < 4; i++ {
				dest, rank, _ := h.route(post("/v1/completions", fmt.Sprintf(`{"prompt":"r%d"}`, i), [2]string{"x-data-parallel-rank", tc.sent}))
				assert.Equal(t, tc.dest, dest, "rank %s", tc.sent)
				assert.Equal(t, tc.sent, rank)
			}
		}
		seen := map[string]bool{}
		for i := 0; i < 24; i++ {
			dest, rank, _ := h.route(post("/v1/completions", fmt.Sprintf(`{"prompt":"u%d"}`, i), [2]string{"x-data-parallel-rank", "2"}))
			seen[dest+"#"+rank] = true
		}
		assert.Len(t, seen, 4, "a rank no endpoint serves narrows nothing")
	})
}

func dpStartPDFleet(mode string) string {
	return fmt.Sprintf(`{"disaggregation":{"mode":%q},"pools":{
		"decode":{"endpoints":[{"address":"10.0.1.1:8000","dp_size":2,"dp_rank_start":2}]},
		"prefill":{"endpoints":[{"address":"10.0.2.1:8000","dp_size":2,"dp_rank_start":6}]}}}`, mode)
}

func TestPrefillRankCarriesDPRankStart(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		t.Run("sidecar", func(t *testing.T) {
			h := startHost(t, vm, dpStartPDFleet("sidecar"))
			seen := map[string]bool{}
			for i := 0; i < 8; i++ {
				id, _ := h.send(post("/v1/chat/completions", chat(fmt.Sprint("s", i))))
				rank, _ := h.header(id, "x-data-parallel-rank")
				assert.Contains(t, []string{"2", "3"}, rank)
				pf, _ := h.header(id, "x-prefiller-data-parallel-rank")
				seen[pf] = true
				h.respond(id, 200)
			}
			assert.Equal(t, map[string]bool{"6": true, "7": true}, seen)
		})
		// Every inline mode sends the prefill leg with the prefill target's rank.
		for _, mode := range []string{"vllm", "trtllm", "sglang"} {
			t.Run(mode, func(t *testing.T) {
				h := startHost(t, vm, dpStartPDFleet(mode))
				seen := map[string]bool{}
				for i := 0; i < 8; i++ {
					id, _ := h.send(post("/v1/chat/completions", chat(fmt.Sprint("p", i))))
					co := h.onlyCallout(id)
					seen[headerOf(co.Headers, "x-data-parallel-rank")] = true
					h.CallOnHttpCallResponse(co.CalloutID, [][2]string{{":status", "503"}}, nil, nil)
					rank, _ := h.header(id, "x-data-parallel-rank")
					assert.Contains(t, []string{"2", "3"}, rank, "the decode leg")
					h.CompleteHttpContext(id)
				}
				assert.Equal(t, map[string]bool{"6": true, "7": true}, seen)
			})
		}
	})
}

// A hybrid-DP node's metrics page labels its engines with their deployment ranks.
func TestEngineMetricsOfADPRankStart(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"engine_metrics":{"enabled":true,"interval_ms":100,"stale_ms":5000},"pools":{"decode":{"endpoints":[
			{"address":"10.0.0.1:8000","dp_size":2,"dp_rank_start":4}]}}}`)
		h.Tick()
		sc := h.scrapes()
		require.Len(t, sc, 1)
		page := `vllm:num_requests_running{engine="4",model_name="m"} 40
vllm:num_requests_waiting{engine="4",model_name="m"} 20
vllm:num_requests_running{engine="5",model_name="m"} 0
vllm:num_requests_waiting{engine="5",model_name="m"} 0
`
		h.CallOnHttpCallResponse(sc["10.0.0.1:8000"].CalloutID, [][2]string{{":status", "200"}}, nil, []byte(page))
		// The figures are published for the targets that carry those ranks.
		got := map[uint64]engine.EngineFigures{}
		require.NoError(t, engine.NewEngineBoard(shareddata.Store{}, "kvroute", "decode", 0, 8).ReadInto(got, 0, 1))
		assert.Equal(t, map[uint64]engine.EngineFigures{
			routing.TargetID("10.0.0.1:8000", 4): {Running: 40, Waiting: 20},
			routing.TargetID("10.0.0.1:8000", 5): {},
		}, got)
	})
}
