package main

import (
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/routing/prefix"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAFirstChunkThatShowsACopyGoneTeachesTheCacheInFilter: with no cache configured
// every recorded copy counts as held, until a first chunk shows one gone. Documents
// E and D (8000 tokens each) are computed on rank 0 in 200 ms each (40 tokens a ms),
// then 24000 tokens of other work. A continuation of D (1000 tokens more) goes to
// rank 0 for its copy. If its first chunk comes back in the time of its own tokens,
// the copy was there: nothing is learned, and a continuation of E goes to rank 0 too.
// If it comes back in the time of the whole prompt, the copy was gone: rank 0's cache
// is learned as that copy's age, and E's copy, older, no longer counts as held. With
// a cache of 1000000 tokens configured the same news takes it only a twentieth down,
// and E's copy still counts. Nor does a disaggregated continuation teach anything:
// its first chunk times the prefill target's work.
func TestAFirstChunkThatShowsACopyGoneTeachesTheCacheInFilter(t *testing.T) {
	const pools = `"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":2}]}`
	for _, tc := range []struct {
		name     string
		cfg      string
		took     int // ms from the continuation's send to its first chunk
		decision string
	}{
		{"there", `{"trust_client_dp_rank":true,` + pools + `}}`, 25, "continuation"},
		{"gone", `{"trust_client_dp_rank":true,` + pools + `}}`, 225, "load"},
		{"gone, configured", `{"trust_client_dp_rank":true,"prefix":{"target_cache_tokens":1000000},` + pools + `}}`, 225, "continuation"},
		{"gone, disaggregated", `{"trust_client_dp_rank":true,` + pools + `,"prefill":{"endpoints":[{"address":"10.0.9.1:8000"}]}},
			"disaggregation":{"mode":"sidecar","threshold_tokens":0}}`, 225, "continuation;pd=disaggregated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, tc.cfg)
				rng := rand.New(rand.NewSource(24))
				e, d := prose(rng, 32000), prose(rng, 32000)
				// stream sends body and takes its first chunk after ms, and ends it.
				stream := func(body string, ms int, headers ...[2]string) (rank, decision string) {
					id, action := h.send(post("/v1/completions", completionBody(body), headers...))
					require.Equal(t, types.ActionContinue, action)
					rank, _ = h.header(id, "x-data-parallel-rank")
					decision, _ = h.header(id, "x-kvroute-decision")
					h.CallOnResponseHeaders(id, [][2]string{{":status", "200"}, {"content-type", "text/event-stream"}}, false)
					h.advance(ms)
					h.CallOnResponseBody(id, []byte("data: {}\n\n"), false)
					h.CallOnResponseBody(id, []byte("data: [DONE]\n\n"), true)
					h.CompleteHttpContext(id)
					return rank, decision
				}
				rank0 := [2]string{"x-data-parallel-rank", "0"}
				for _, doc := range []string{e, d, prose(rng, 32000), prose(rng, 32000), prose(rng, 32000)} {
					rank, _ := stream(doc, 200, rank0)
					require.Equal(t, "0", rank)
				}
				rank, decision := stream(d+prose(rng, 4000), tc.took)
				require.Equal(t, "0", rank, "D's copy is counted as held on rank 0")
				require.True(t, strings.HasPrefix(decision, "continuation"), decision)
				rank, decision = stream(e+prose(rng, 4000), 25)
				assert.Equal(t, tc.decision, decision)
				if strings.HasPrefix(tc.decision, "continuation") {
					assert.Equal(t, "0", rank)
				}
			})
		})
	}
}

// TestAnEngineReportedCacheCountsInFilter: with no cache configured and engine metrics
// on, the size vLLM reports in cache_config_info is each rank's cache: num_gpu_blocks
// is the sum over the server's two engines. Document E (8000 tokens) is computed on
// rank 0, then 32000 tokens of other work there. With 20000 tokens a rank, E's copy is
// gone and its continuation is placed by load; with 1000000, or nothing reported, it
// is still a continuation on rank 0.
func TestAnEngineReportedCacheCountsInFilter(t *testing.T) {
	const cfg = `{"trust_client_dp_rank":true,"engine_metrics":{"enabled":true,"interval_ms":100,"stale_ms":60000},
		"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":2}]}}}`
	info := func(blocks int) string {
		return fmt.Sprintf(`# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="%d"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",num_gpu_blocks="%d"} 1.0
`, blocks, blocks)
	}
	for _, tc := range []struct {
		name     string
		page     string
		decision string
	}{
		{"reported under the writes", vllmPage(0, 0) + info(2500), "load"},
		{"reported above them", vllmPage(0, 0) + info(125000), "continuation"},
		{"not reported", vllmPage(0, 0), "continuation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				h.Tick()
				for _, c := range h.scrapes() {
					h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}}, nil, []byte(tc.page))
				}
				rng := rand.New(rand.NewSource(25))
				e := prose(rng, 32000)
				stream := func(body string, headers ...[2]string) (rank, decision string) {
					id, action := h.send(post("/v1/completions", completionBody(body), headers...))
					require.Equal(t, types.ActionContinue, action)
					rank, _ = h.header(id, "x-data-parallel-rank")
					decision, _ = h.header(id, "x-kvroute-decision")
					h.CallOnResponseHeaders(id, [][2]string{{":status", "200"}, {"content-type", "text/event-stream"}}, false)
					h.advance(200)
					h.CallOnResponseBody(id, []byte("data: {}\n\n"), false)
					h.CallOnResponseBody(id, []byte("data: [DONE]\n\n"), true)
					h.CompleteHttpContext(id)
					return rank, decision
				}
				rank0 := [2]string{"x-data-parallel-rank", "0"}
				for _, doc := range []string{e, prose(rng, 32000), prose(rng, 32000), prose(rng, 32000), prose(rng, 32000)} {
					rank, _ := stream(doc, rank0)
					require.Equal(t, "0", rank)
				}
				rank, decision := stream(e + prose(rng, 4000))
				assert.Equal(t, tc.decision, decision)
				if tc.decision == "continuation" {
					assert.Equal(t, "0", rank)
				}
			})
		})
	}
}

// TestALongPromptsHeadOutlivesItsTailInFilter: with a cache of 20000 tokens, a document
// of 8000 on rank 0, then other work there. After 8000 tokens of it the document is
// all there, and its continuation follows it; after 16000 only its first 4000 tokens
// are (an engine evicts a request's last blocks first), too little for a
// continuation, and the request is placed by its cost with that head counted.
func TestALongPromptsHeadOutlivesItsTailInFilter(t *testing.T) {
	const cfg = `{"trust_client_dp_rank":true,"prefix":{"target_cache_tokens":20000},
		"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":2}]}}}`
	for _, tc := range []struct {
		others   int // 8000-token prompts computed on rank 0 after the document
		decision string
	}{{1, "continuation"}, {2, "prefix"}} {
		t.Run(strconv.Itoa(tc.others), func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(26))
				doc := prose(rng, 32000)
				computeOn(t, h, doc, "0", 200)
				for i := 0; i < tc.others; i++ {
					computeOn(t, h, prose(rng, 32000), "0", 200)
				}
				id, _ := h.send(post("/v1/completions", completionBody(doc+prose(rng, 1600))))
				decision, _ := h.header(id, "x-kvroute-decision")
				rank, _ := h.header(id, "x-data-parallel-rank")
				assert.Equal(t, tc.decision, decision)
				assert.Equal(t, "0", rank, "the holder of the document, or of its head")
			})
		})
	}
}

// cacheInfo40000 is vLLM's cache_config_info for a server of two engines: 5000 blocks
// of 16 tokens summed over both, 40000 tokens a rank.
const cacheInfo40000 = `# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="5000"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",num_gpu_blocks="5000"} 1.0
`

// startReported starts the plugin with config and answers its first engine scrapes,
// if it makes any, with an idle page reporting cacheInfo40000.
func startReported(t *testing.T, vm types.VMContext, config string) *host {
	h := startHost(t, vm, config)
	h.Tick()
	for _, c := range h.scrapes() {
		h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}}, nil, []byte(vllmPage(0, 0)+cacheInfo40000))
	}
	return h
}

// TestACopyThereNeverTakesTheCacheHigherInFilter: with a cache of 40000 tokens a rank
// stated, or reported by vLLM (5000 blocks of 16 summed over the server's two
// engines), document E (8000 tokens) is computed on rank 0, then 32000 tokens of
// other work; E's continuation comes back in its own tokens' time, so E's copy, about
// 40000 tokens old with itself, was there: past 4/5 of the cache, which learning
// would take a tenth up. Then document F, then 34600 tokens of other work: F's copy
// needs 42600 tokens to be whole. Held to 40000, rank 0 keeps only F's first 5400
// tokens, too few for a continuation, and F's next turn is placed by its cost; at
// 44000 the whole copy would count, and the turn would follow it as a continuation.
func TestACopyThereNeverTakesTheCacheHigherInFilter(t *testing.T) {
	const pools = `"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":2}]}}`
	for _, tc := range []struct{ name, cfg string }{
		{"stated", `{"trust_client_dp_rank":true,"prefix":{"target_cache_tokens":40000},` + pools + `}`},
		{"reported", `{"trust_client_dp_rank":true,"engine_metrics":{"enabled":true,"interval_ms":100,"stale_ms":60000},` + pools + `}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startReported(t, vm, tc.cfg)
				rng := rand.New(rand.NewSource(27))
				e, f := prose(rng, 32000), prose(rng, 32000)
				// At 40 tokens a ms, as the first documents teach the rate.
				computeOn(t, h, e, "0", 200)
				for i := 0; i < 4; i++ {
					computeOn(t, h, prose(rng, 32000), "0", 200)
				}
				id, _ := h.send(post("/v1/completions", completionBody(e+prose(rng, 4000))))
				decision, _ := h.header(id, "x-kvroute-decision")
				rank, _ := h.header(id, "x-data-parallel-rank")
				require.Equal(t, "continuation", decision)
				require.Equal(t, "0", rank)
				h.stream(id)
				h.advance(25)
				h.firstChunk(id)
				h.endStream(id)

				assert.Equal(t, "prefix", fTurnAfterOtherWork(t, h, rng, f), "F's head only counts as held")
			})
		})
	}
}

// TestAReportAfterTheDecisionBoundsItsFirstChunkInFilter: as above, with the engine's
// size (40000 tokens) reported only after E's continuation was decided, and read by
// the next decision before E's first chunk; the report then goes stale. E's first
// chunk, which found its copy there past 4/5 of the size reported since, still takes
// the learned cache no higher than that size, so F's next turn, once the report is
// stale, does not count F's copy as whole and is no continuation. Learned from
// nothing, with no size bounding the news, the cache would stay unknown and every
// copy count as whole.
func TestAReportAfterTheDecisionBoundsItsFirstChunkInFilter(t *testing.T) {
	const cfg = `{"trust_client_dp_rank":true,"engine_metrics":{"enabled":true,"interval_ms":100,"stale_ms":500},
		"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":2}]}}}`
	const info = `# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="2500"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",num_gpu_blocks="2500"} 1.0
`
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, cfg)
		rng := rand.New(rand.NewSource(27))
		e, f := prose(rng, 32000), prose(rng, 32000)
		computeOn(t, h, e, "0", 200)
		for i := 0; i < 4; i++ {
			computeOn(t, h, prose(rng, 32000), "0", 200)
		}
		h.scrapes() // the scrapes so far go unanswered: no size is known
		// A decision on rank 1 reads the engine board (still empty); E's continuation,
		// 50 ms later, does not read it again.
		openOn(t, h, prose(rng, 400), "1", false)
		h.advance(50)
		id, _ := h.send(post("/v1/completions", completionBody(e+prose(rng, 4000))))
		decision, _ := h.header(id, "x-kvroute-decision")
		require.Equal(t, "continuation", decision)
		h.stream(id)
		h.Tick()
		for _, c := range h.scrapes() {
			h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}}, nil, []byte(vllmPage(0, 0)+info))
		}
		h.advance(50)
		openOn(t, h, prose(rng, 400), "1", false) // reads the report
		h.advance(10)
		h.firstChunk(id)
		h.endStream(id)

		assert.NotEqual(t, "continuation", fTurnAfterOtherWork(t, h, rng, f), "F's copy does not count as whole")
	})
}

// fTurnAfterOtherWork computes document f on rank 0 in 200 ms, then 34 600 tokens of
// other prompts there, so that f's copy needs 42 600 tokens to be whole, and returns
// the decision of f's next turn.
func fTurnAfterOtherWork(t *testing.T, h *host, rng *rand.Rand, f string) string {
	t.Helper()
	computeOn(t, h, f, "0", 200)
	for i := 0; i < 4; i++ {
		computeOn(t, h, prose(rng, 34600), "0", 216)
	}
	id, _ := h.send(post("/v1/completions", completionBody(f+prose(rng, 4000))))
	decision, _ := h.header(id, "x-kvroute-decision")
	return decision
}

// TestTargetGaugesShowTheCacheAndRateDecisionsUseInFilter: each decode target's gauges
// show the prefix cache decisions take it to hold and its observed prefill rate, set
// on the tick. A stated cache shows at once; one the engine reports shows once a tick
// has read the board, with no request; one learned shows the age of the copy its
// first chunk found gone: the 24000 tokens written on rank 0 after D, and the 7680 of
// D's copy the continuation matched; under a stated cache the same news takes it a
// twentieth down. The rate shows once a first chunk has timed a
// prefill: 8000 tokens in 200 ms (more in wazero, whose clock moves at every
// reading). Rank 1 computes nothing, and learns nothing.
func TestTargetGaugesShowTheCacheAndRateDecisionsUseInFilter(t *testing.T) {
	const pools = `"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":2}]}}`
	gauge := func(h *host, family, rank string) int64 {
		return h.gauge(family + ".10_0_0_1_8000.rank_" + rank)
	}
	for _, tc := range []struct {
		name       string
		cfg        string
		before     int64 // both ranks' cache before any request
		learned    bool  // a continuation's first chunk shows its copy gone
		cacheRank0 int64 // after the requests
		cacheRank1 int64
		rateRank0  int64
	}{
		{"stated", `{"trust_client_dp_rank":true,"prefix":{"target_cache_tokens":40000},` + pools + `}`, 40000, false, 40000, 40000, 40000},
		{"reported", `{"trust_client_dp_rank":true,"engine_metrics":{"enabled":true,"interval_ms":100,"stale_ms":60000},` + pools + `}`, 40000, false, 40000, 40000, 40000},
		{"unknown", `{"trust_client_dp_rank":true,` + pools + `}`, 0, false, 0, 0, 40000},
		{"learned", `{"trust_client_dp_rank":true,` + pools + `}`, 0, true, 31680, 0, 40000},
		{"learned under stated", `{"trust_client_dp_rank":true,"prefix":{"target_cache_tokens":40000},` + pools + `}`, 40000, true, 38000, 40000, 40000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startReported(t, vm, tc.cfg)
				h.advance(100)
				h.Tick()
				for _, rank := range []string{"0", "1"} {
					assert.Equal(t, tc.before, gauge(h, TargetCacheTokens, rank), "cache of rank %s before any request", rank)
					assert.Zero(t, gauge(h, TargetPrefillRate, rank), "rate of rank %s before any first chunk", rank)
				}
				rng := rand.New(rand.NewSource(24))
				d := prose(rng, 32000)
				for _, doc := range []string{d, prose(rng, 32000), prose(rng, 32000), prose(rng, 32000)} {
					computeOn(t, h, doc, "0", 200)
				}
				if tc.learned {
					computeOn(t, h, d+prose(rng, 4000), "0", 225)
				}
				h.Tick()
				assert.Equal(t, tc.cacheRank0, gauge(h, TargetCacheTokens, "0"))
				assert.Equal(t, tc.cacheRank1, gauge(h, TargetCacheTokens, "1"))
				if rate := gauge(h, TargetPrefillRate, "0"); h.wasm {
					// wazero's clock moves at every reading, so 200 ms there is more.
					assert.True(t, rate > 0 && rate < tc.rateRank0, "rate %d", rate)
				} else {
					assert.Equal(t, tc.rateRank0, rate)
				}
				assert.Zero(t, gauge(h, TargetPrefillRate, "1"))
				assert.Zero(t, gauge(h, TargetActiveRequests, "0"), "every stream ended")
			})
		})
	}
}

// TestAHistoryGoneBehindARefreshedHeadTeachesTheCacheInFilter: rank 0 computes a
// 2000-token system prompt and a 2000-token history after it, then 2000 tokens of
// other work, while the system prompt is computed again: on rank 0 itself (its head
// is then younger there than the history's copy), or on four other ranks of six (its
// entry then names those four, and it is taken to be held, and kept fresh,
// everywhere). The history's continuation comes back after the time of its tail past
// the system prompt: the tail was gone, and with 16000 tokens stated the cache is
// learned a twentieth down. Judged against the whole copy, the system prompt's tokens
// included, the same chunk says nothing sure: so it does with 20000 stated, where the
// copy, 2080 tokens old, is under an eighth of the cache and is judged whole.
func TestAHistoryGoneBehindARefreshedHeadTeachesTheCacheInFilter(t *testing.T) {
	for _, tc := range []struct {
		name          string
		cache, ranks  int
		refreshedOn   []string
		before, after int64
	}{
		{"the same rank", 16000, 2, nil, 16000, 15200},
		{"the same rank, a young copy", 20000, 2, nil, 20000, 20000},
		{"as many other ranks as an entry names", 16000, prefix.TargetsPerEntry + 2, everyRankFrom1(prefix.TargetsPerEntry), 16000, 15200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, fmt.Sprintf(`{"trust_client_dp_rank":true,"prefix":{"target_cache_tokens":%d},
					"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":%d}]}}}`, tc.cache, tc.ranks))
				rng := rand.New(rand.NewSource(27))
				system, history := prose(rng, 8000), prose(rng, 8000)
				computeOn(t, h, system+history, "0", 400)
				if tc.refreshedOn == nil {
					computeOn(t, h, system+prose(rng, 8000), "0", 208)
				} else {
					computeOn(t, h, prose(rng, 8320), "0", 208)
					for _, rank := range tc.refreshedOn {
						computeOn(t, h, system+prose(rng, 400), rank, 208)
					}
				}
				const gauge = "kvroute_target_cache_tokens.10_0_0_1_8000.rank_0"
				require.Equal(t, tc.before, h.gauge(gauge))
				computeOn(t, h, system+history+prose(rng, 400), "0", 202)
				assert.Equal(t, tc.after, h.gauge(gauge))
			})
		})
	}
}

// everyRankFrom1 is the ranks 1 to n.
func everyRankFrom1(n int) []string {
	ranks := make([]string, n)
	for i := range ranks {
		ranks[i] = fmt.Sprint(i + 1)
	}
	return ranks
}
