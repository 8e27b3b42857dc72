package main

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/shareddata"
	"github.com/kvroute/kvroute/routing"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
)

func pdFleet(mode string, threshold int) string {
	return fmt.Sprintf(`{"disaggregation":{"mode":%q,"threshold_tokens":%d},"pools":{
		"decode":{"endpoints":[{"address":"10.0.1.1:8000"},{"address":"10.0.1.2:8000"}]},
		"prefill":{"endpoints":[{"address":"10.0.2.1:8000","dp_size":2,"bootstrap_port":9000}]}}}`, mode, threshold)
}

// poolLoad reads a pool's ledger from the host's shared data, on the plugin's clock,
// after a tick has written the VM's batch of load changes.
func (h *host) poolLoad(pool string) routing.Load {
	h.Tick()
	now := goClock
	if h.wasm {
		now = 1640995200000 + 60_000 // wazero's fake epoch, plus the readings so far
	}
	snap, err := routing.NewLoadLedger(shareddata.Store{}, "kvroute", pool, 600000, 8).Snapshot(now)
	require.NoError(h.t, err)
	var l routing.Load
	for _, v := range snap {
		l.Requests += v.Requests
		l.Tokens += v.Tokens
	}
	return l
}

// longChat is a chat body of about n estimated tokens.
func longChat(n int, extra string) string {
	return `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":200` + extra +
		`,"messages":[{"role":"user","content":"` + strings.Repeat("abcd", n) + `"}]}`
}

func (h *host) onlyCallout(id uint32) proxytest.HttpCalloutAttribute {
	cs := h.GetCalloutAttributesFromContext(id)
	require.Len(h.t, cs, 1)
	return cs[0]
}

func headerOf(hs [][2]string, name string) string {
	for _, kv := range hs {
		if kv[0] == name {
			return kv[1]
		}
	}
	return ""
}

func TestSidecarModeSetsPrefillHeaders(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, pdFleet("sidecar", 100))
		// "user:" + 4×99 bytes = 401 bytes: 100 tokens, exactly at the threshold.
		id, action := h.send(post("/v1/chat/completions", longChat(99, "")))
		require.Equal(t, types.ActionContinue, action)
		dec, _ := h.header(id, "x-kvroute-decision")
		assert.Equal(t, "load;pd=disaggregated", dec)
		pf, _ := h.header(id, "x-prefiller-host-port")
		assert.Equal(t, "10.0.2.1:8000", pf)
		_, hasRank := h.header(id, "x-prefiller-data-parallel-rank")
		assert.True(t, hasRank, "the prefill endpoint has dp_size 2")
		assert.Equal(t, int64(1), h.poolLoad("prefill").Requests)
		h.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
		assert.Equal(t, int64(0), h.poolLoad("prefill").Requests, "released when the decoder answers")
		h.CompleteHttpContext(id)
		// One token below the threshold: direct.
		id, _ = h.send(post("/v1/chat/completions", longChat(98, "")))
		dec, _ = h.header(id, "x-kvroute-decision")
		assert.True(t, strings.HasSuffix(dec, ";pd=direct"), dec)
		_, has := h.header(id, "x-prefiller-host-port")
		assert.False(t, has)
		h.respond(id, 200)
		assert.Equal(t, uint64(1), h.counter("kvroute_pd_disaggregated"))
		assert.Equal(t, uint64(1), h.counter("kvroute_pd_direct"))
		assert.Equal(t, routing.Load{}, h.poolLoad("decode"))
	})
}

func TestVLLMInlinePrefill(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, pdFleet("vllm", 10))
		body := longChat(100, `,"max_completion_tokens":300,"min_tokens":5`)
		id, action := h.send(post("/v1/chat/completions", body, [2]string{"x-request-id", "req-1"}))
		require.Equal(t, types.ActionPause, action, "the decode leg waits for the prefill")
		co := h.onlyCallout(id)
		assert.Equal(t, "kvroute_prefill", co.Upstream)
		assert.Equal(t, "10.0.2.1:8000", headerOf(co.Headers, "x-gateway-destination-endpoint"))
		assert.Equal(t, "req-1", headerOf(co.Headers, "x-request-id"))
		assert.Equal(t, "/v1/chat/completions", headerOf(co.Headers, ":path"))
		assert.Equal(t, "POST", headerOf(co.Headers, ":method"))
		assert.NotEmpty(t, headerOf(co.Headers, "x-data-parallel-rank"))
		pb := gjson.ParseBytes(co.Body)
		assert.True(t, pb.Get("kv_transfer_params.do_remote_decode").Bool())
		assert.False(t, pb.Get("kv_transfer_params.do_remote_prefill").Bool())
		for _, f := range []string{"remote_engine_id", "remote_block_ids", "remote_host", "remote_port"} {
			assert.Equal(t, gjson.Null, pb.Get("kv_transfer_params."+f).Type, f)
			assert.True(t, pb.Get("kv_transfer_params."+f).Exists(), f)
		}
		assert.Equal(t, false, pb.Get("stream").Bool())
		assert.Equal(t, int64(1), pb.Get("max_tokens").Int())
		assert.Equal(t, int64(1), pb.Get("max_completion_tokens").Int())
		assert.False(t, pb.Get("stream_options").Exists())
		assert.False(t, pb.Get("min_tokens").Exists())
		assert.Equal(t, gjson.Get(body, "messages").Raw, pb.Get("messages").Raw)
		assert.Equal(t, int64(1), h.poolLoad("prefill").Requests)

		params := `{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"e1","remote_block_ids":[1,2],"remote_host":"10.0.2.1","remote_port":5600}`
		h.CallOnHttpCallResponse(co.CalloutID, [][2]string{{":status", "200"}}, nil, []byte(`{"id":"x","kv_transfer_params":`+params+`}`))
		assert.Equal(t, types.ActionContinue, h.GetCurrentHttpStreamAction(id))
		got := h.GetCurrentRequestBody(id)
		assert.JSONEq(t, params, gjson.GetBytes(got, "kv_transfer_params").Raw)
		assert.True(t, gjson.GetBytes(got, "stream").Bool(), "the decode leg keeps the client's stream")
		cl, _ := h.header(id, "content-length")
		assert.Equal(t, fmt.Sprint(len(got)), cl)
		dest, _ := h.header(id, "x-gateway-destination-endpoint")
		assert.Contains(t, []string{"10.0.1.1:8000", "10.0.1.2:8000"}, dest)
		dec, _ := h.header(id, "x-kvroute-decision")
		assert.Equal(t, "load;pd=disaggregated", dec)
		assert.Equal(t, int64(0), h.poolLoad("prefill").Requests, "released when the prefill returns")
		h.respond(id, 200)
		assert.Equal(t, routing.Load{}, h.poolLoad("decode"))
	})
}

func TestPrefillFailures(t *testing.T) {
	cases := map[string]struct {
		headers [][2]string
		body    string
		check   func(t *testing.T, h *host, id uint32, original []byte)
	}{
		"4xx goes back to the client": {
			headers: [][2]string{{":status", "400"}, {"content-type", "application/json"}},
			body:    `{"error":{"message":"bad"}}`,
			check: func(t *testing.T, h *host, id uint32, _ []byte) {
				lr := h.GetSentLocalResponse(id)
				require.NotNil(t, lr)
				assert.Equal(t, uint32(400), lr.StatusCode)
				assert.Equal(t, `{"error":{"message":"bad"}}`, string(lr.Data))
				assert.Equal(t, uint64(0), h.counter("kvroute_pd_prefill_failures"))
			},
		},
		"5xx falls back to direct decode": {
			headers: [][2]string{{":status", "503"}},
			check: func(t *testing.T, h *host, id uint32, original []byte) {
				assert.Nil(t, h.GetSentLocalResponse(id))
				assert.Equal(t, types.ActionContinue, h.GetCurrentHttpStreamAction(id))
				assert.Equal(t, original, h.GetCurrentRequestBody(id), "the body goes on unchanged")
				dec, _ := h.header(id, "x-kvroute-decision")
				assert.Equal(t, "load;pd=direct", dec)
				assert.Equal(t, uint64(1), h.counter("kvroute_pd_prefill_failures"))
			},
		},
		"timeout (no response headers) falls back": {
			check: func(t *testing.T, h *host, id uint32, original []byte) {
				assert.Equal(t, types.ActionContinue, h.GetCurrentHttpStreamAction(id))
				assert.Equal(t, original, h.GetCurrentRequestBody(id))
				assert.Equal(t, uint64(1), h.counter("kvroute_pd_prefill_failures"))
			},
		},
		"2xx without kv_transfer_params falls back": {
			headers: [][2]string{{":status", "200"}},
			body:    `{"id":"x"}`,
			check: func(t *testing.T, h *host, id uint32, original []byte) {
				assert.Equal(t, types.ActionContinue, h.GetCurrentHttpStreamAction(id))
				assert.Equal(t, original, h.GetCurrentRequestBody(id))
				assert.Equal(t, uint64(1), h.counter("kvroute_pd_prefill_failures"))
			},
		},
	}
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		for name, c := range cases {
			t.Run(name, func(t *testing.T) {
				h := startHost(t, vm, pdFleet("vllm", 10))
				body := longChat(50, "")
				id, action := h.send(post("/v1/chat/completions", body))
				require.Equal(t, types.ActionPause, action)
				co := h.onlyCallout(id)
				h.CallOnHttpCallResponse(co.CalloutID, c.headers, nil, []byte(c.body))
				c.check(t, h, id, []byte(body))
				assert.Equal(t, routing.Load{}, h.poolLoad("prefill"))
				h.CompleteHttpContext(id)
				assert.Equal(t, routing.Load{}, h.poolLoad("decode"))
			})
		}
		t.Run("client leaves while the prefill runs", func(t *testing.T) {
			h := startHost(t, vm, pdFleet("vllm", 10))
			id, _ := h.send(post("/v1/chat/completions", longChat(50, "")))
			co := h.onlyCallout(id)
			h.CompleteHttpContext(id)
			assert.Equal(t, routing.Load{}, h.poolLoad("prefill"))
			assert.Equal(t, routing.Load{}, h.poolLoad("decode"))
			// The late answer finds no stream and changes nothing.
			h.CallOnHttpCallResponse(co.CalloutID, [][2]string{{":status", "200"}}, nil, []byte(`{}`))
			assert.Equal(t, routing.Load{}, h.poolLoad("prefill"))
			assert.Equal(t, uint64(0), h.counter("kvroute_fail_open"))
		})
	})
}

func TestTRTLLMInlineContextPhase(t *testing.T) {
	ctxParams := `{"request_type":"context_only","first_gen_tokens":[42],"ctx_request_id":123,"opaque_state":"b3BhcXVl"}`
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		t.Run("generation leg carries the context's params", func(t *testing.T) {
			h := startHost(t, vm, pdFleet("trtllm", 10))
			id, action := h.send(post("/v1/chat/completions", longChat(50, "")))
			require.Equal(t, types.ActionPause, action)
			co := h.onlyCallout(id)
			assert.Equal(t, "context_only", gjson.GetBytes(co.Body, "disaggregated_params.request_type").String())
			assert.False(t, gjson.GetBytes(co.Body, "stream").Bool())
			h.CallOnHttpCallResponse(co.CalloutID, [][2]string{{":status", "200"}}, nil,
				[]byte(`{"choices":[{"index":0,"finish_reason":"length","disaggregated_params":`+ctxParams+`}]}`))
			assert.Equal(t, types.ActionContinue, h.GetCurrentHttpStreamAction(id))
			got := gjson.ParseBytes(h.GetCurrentRequestBody(id))
			assert.Equal(t, "generation_only", got.Get("disaggregated_params.request_type").String())
			assert.Equal(t, int64(123), got.Get("disaggregated_params.ctx_request_id").Int())
			assert.Equal(t, "[42]", got.Get("disaggregated_params.first_gen_tokens").Raw)
			assert.Equal(t, "b3BhcXVl", got.Get("disaggregated_params.opaque_state").String())
			h.respond(id, 200)
		})
		t.Run("a context phase that finished answers the client", func(t *testing.T) {
			h := startHost(t, vm, pdFleet("trtllm", 10))
			id, _ := h.send(post("/v1/chat/completions", longChat(50, "")))
			co := h.onlyCallout(id)
			done := `{"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hi"}}]}`
			h.CallOnHttpCallResponse(co.CalloutID, [][2]string{{":status", "200"}}, nil, []byte(done))
			lr := h.GetSentLocalResponse(id)
			require.NotNil(t, lr)
			assert.Equal(t, uint32(200), lr.StatusCode)
			assert.Equal(t, done, string(lr.Data))
			h.CompleteHttpContext(id)
			assert.Equal(t, routing.Load{}, h.poolLoad("decode"))
			assert.Equal(t, routing.Load{}, h.poolLoad("prefill"))
		})
	})
}

func TestSGLangBootstrap(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, pdFleet("sglang", 10))
		id, action := h.send(post("/v1/chat/completions", longChat(50, ""), [2]string{"x-request-id", "r-9"}))
		require.Equal(t, types.ActionContinue, action, "the decode leg goes at once")
		co := h.onlyCallout(id)
		got := gjson.ParseBytes(h.GetCurrentRequestBody(id))
		assert.Equal(t, "10.0.2.1", got.Get("bootstrap_host").String())
		assert.Equal(t, int64(9000), got.Get("bootstrap_port").Int())
		room := got.Get("bootstrap_room").Uint()
		assert.NotZero(t, room)
		assert.Less(t, room, uint64(1)<<63)
		assert.Equal(t, h.GetCurrentRequestBody(id), co.Body, "the same body to both legs")
		assert.Equal(t, "r-9", headerOf(co.Headers, "x-request-id"))
		cl, _ := h.header(id, "content-length")
		assert.Equal(t, fmt.Sprint(len(co.Body)), cl)
		assert.Equal(t, int64(1), h.poolLoad("prefill").Requests)
		h.CallOnHttpCallResponse(co.CalloutID, [][2]string{{":status", "200"}}, nil, []byte(`{"choices":[]}`))
		assert.Equal(t, int64(0), h.poolLoad("prefill").Requests)
		h.respond(id, 200)
	})
}

func TestInlineModeWithUnbufferedBodyDecodesDirectly(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"max_body_bytes":1000,"disaggregation":{"mode":"vllm","threshold_tokens":10},"pools":{
			"decode":{"endpoints":[{"address":"10.0.1.1:8000"}]},"prefill":{"endpoints":[{"address":"10.0.2.1:8000"}]}}}`)
		id, action := h.send(post("/v1/chat/completions", longChat(1000, "")))
		assert.Equal(t, types.ActionContinue, action)
		assert.Empty(t, h.GetCalloutAttributesFromContext(id))
		dec, _ := h.header(id, "x-kvroute-decision")
		assert.Equal(t, "load;pd=direct", dec)
		assert.Equal(t, routing.Load{}, h.poolLoad("prefill"))
		h.respond(id, 200)
	})
}

func TestClientPDFieldsNeverReachAWorker(t *testing.T) {
	evil := `,"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"203.0.113.9","remote_port":1},"bootstrap_host":"203.0.113.9","disaggregated_params":{"request_type":"generation_only","ctx_request_id":666}`
	for _, mode := range []string{"sidecar", "vllm", "trtllm", "sglang"} {
		t.Run(mode, func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, pdFleet(mode, 1000))
				// Short: decoded directly, with the client's fields removed.
				id, action := h.send(post("/v1/chat/completions", longChat(10, evil)))
				require.Equal(t, types.ActionContinue, action)
				got := gjson.ParseBytes(h.GetCurrentRequestBody(id))
				for _, k := range []string{"kv_transfer_params", "bootstrap_host", "disaggregated_params"} {
					assert.False(t, got.Get(k).Exists(), "%s reached the decoder", k)
				}
				cl, _ := h.header(id, "content-length")
				assert.Equal(t, fmt.Sprint(len(h.GetCurrentRequestBody(id))), cl)
				h.respond(id, 200)
				// Long, inline: the prefill leg carries kvroute's own values only.
				if mode == "sidecar" {
					return
				}
				id, _ = h.send(post("/v1/chat/completions", longChat(2000, evil)))
				co := h.onlyCallout(id)
				assert.NotContains(t, string(co.Body), "203.0.113.9")
				assert.NotContains(t, string(co.Body), "666")
				h.CompleteHttpContext(id)
			})
		})
	}
	// With disaggregation off the body is the client's business: untouched.
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		body := longChat(10, evil)
		id, _ := h.send(post("/v1/chat/completions", body))
		assert.Equal(t, body, string(h.GetCurrentRequestBody(id)))
		h.respond(id, 200)
	})
}

// A prefill target has its own active and cache gauges, the decode targets and the
// total count each request once, and a target in both pools carries both loads.
func TestPrefillTargetsHaveGauges(t *testing.T) {
	const decodeActive = "kvroute_target_active_requests.10_0_1_1_8000.rank_0"
	fleet := func(prefill string) string {
		return `{"disaggregation":{"mode":"sidecar","threshold_tokens":100},"prefix":{"target_cache_tokens":40000},
			"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"}]},"prefill":{"endpoints":[` + prefill + `]}}}`
	}
	t.Run("own endpoint", func(t *testing.T) {
		bothVMs(t, func(t *testing.T, vm types.VMContext) {
			h := startHost(t, vm, fleet(`{"address":"10.0.2.1:8000","dp_size":2}`))
			prefillActive := func() int64 {
				return h.gauge("kvroute_target_active_requests.10_0_2_1_8000.rank_0") +
					h.gauge("kvroute_target_active_requests.10_0_2_1_8000.rank_1")
			}
			assert.Equal(t, int64(0), prefillActive())
			assert.Equal(t, int64(40000), h.gauge("kvroute_target_cache_tokens.10_0_2_1_8000.rank_1"), "the stated size")
			_, err := h.GetGaugeMetric("kvroute_target_prefill_tokens_per_second.10_0_2_1_8000.rank_0")
			assert.Error(t, err, "a prefill target is never timed")

			id, _ := h.send(post("/v1/chat/completions", longChat(99, "")))
			pf, _ := h.header(id, "x-prefiller-host-port")
			require.Equal(t, "10.0.2.1:8000", pf)
			assert.Equal(t, int64(1), prefillActive())
			assert.Equal(t, int64(1), h.gauge(decodeActive))
			assert.Equal(t, int64(1), h.gauge("kvroute_active_requests"), "one request")
			h.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
			assert.Equal(t, int64(0), prefillActive(), "the prefill ends when the decoder answers")
			assert.Equal(t, int64(1), h.gauge(decodeActive))
			h.CompleteHttpContext(id)
			assert.Equal(t, int64(0), h.gauge(decodeActive))
		})
	})
	t.Run("shared with decode", func(t *testing.T) {
		bothVMs(t, func(t *testing.T, vm types.VMContext) {
			h := startHost(t, vm, fleet(`{"address":"10.0.1.1:8000"}`))
			_, err := h.GetGaugeMetric("kvroute_target_prefill_tokens_per_second.10_0_1_1_8000.rank_0")
			assert.NoError(t, err, "a target that also decodes keeps its rate")
			id, _ := h.send(post("/v1/chat/completions", longChat(99, "")))
			assert.Equal(t, int64(2), h.gauge(decodeActive), "decoding and prefilling the same request")
			assert.Equal(t, int64(1), h.gauge("kvroute_active_requests"), "one request")
			h.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
			assert.Equal(t, int64(1), h.gauge(decodeActive))
			h.CompleteHttpContext(id)
			assert.Equal(t, int64(0), h.gauge(decodeActive))
		})
	})
}

// slotsSeenInLedger is the most running requests any target of pool was last seen out
// of running slots at, as the shared ledger holds it after a tick.
func (h *host) slotsSeenInLedger(pool string) int64 {
	h.Tick()
	ids := map[uint64]int{}
	loads := make([]routing.Load, 16)
	err := routing.NewLoadLedger(shareddata.Store{}, "kvroute", pool, 600000, 8).LoadsInto(0, func(id uint64) int {
		if _, ok := ids[id]; !ok {
			ids[id] = len(ids)
		}
		return ids[id]
	}, loads)
	require.NoError(h.t, err)
	most := int64(0)
	for _, l := range loads {
		most = max(most, l.FullRunning)
	}
	return most
}

func TestADisaggregatedDecodeLegIsNoSlotSightingInFilter(t *testing.T) {
	// Sixteen streamed replies decoding on each decoder, their rate known; then a long
	// request whose first chunk comes two seconds later. Disaggregated, its decode leg
	// waited for the prefill worker, not for a slot: no decoder is seen out of running
	// slots. Sent direct, the same wait is a wait for a slot (control).
	for _, split := range []bool{true, false} {
		t.Run(fmt.Sprint("disaggregated ", split), func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				threshold := 1000
				if !split {
					threshold = 1 << 20
				}
				h := startHost(t, vm, pdFleet("sidecar", threshold))
				rng := rand.New(rand.NewSource(41))
				var held []uint32
				for i := 0; i < 32; i++ {
					id, _ := h.send(post("/v1/chat/completions", chat(prose(rng, 200))))
					h.stream(id)
					h.firstChunk(id)
					held = append(held, id)
				}
				id, _ := h.send(post("/v1/chat/completions", longChat(2000, "")))
				dec, _ := h.header(id, "x-kvroute-decision")
				require.Equal(t, split, strings.HasSuffix(dec, ";pd=disaggregated"), dec)
				h.stream(id)
				h.advance(2000)
				h.firstChunk(id)
				assert.Equal(t, !split, h.slotsSeenInLedger("decode") > 0)
				for _, id := range append(held, id) {
					h.endStream(id)
				}
			})
		})
	}
}

// TestAPrefillPoolMakesNoCopyForWantOfARateInFilter: prefill targets return no first
// chunk, so the prefill pool never shows a rate; the second holder a decode pool
// gives a prefix before its first chunk is not made there. A document's second
// request, 200 ms after the first, is prefilled on the rank still computing it.
func TestAPrefillPoolMakesNoCopyForWantOfARateInFilter(t *testing.T) {
	const cfg = `{"disaggregation":{"mode":"sidecar","threshold_tokens":100},"pools":{
		"decode":{"endpoints":[{"address":"10.0.1.1:8000"},{"address":"10.0.1.2:8000"}]},
		"prefill":{"endpoints":[{"address":"10.0.2.1:8000","dp_size":8}]}}}`
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, cfg)
		rng := rand.New(rand.NewSource(9))
		doc := prose(rng, 32000)
		var ranks []string
		var ids []uint32
		for i := 0; i < 2; i++ {
			id, _ := h.send(post("/v1/chat/completions", chat(doc+prose(rng, 4000))))
			dec, _ := h.header(id, "x-kvroute-decision")
			require.True(t, strings.HasSuffix(dec, ";pd=disaggregated"), dec)
			rank, _ := h.header(id, "x-prefiller-data-parallel-rank")
			ranks, ids = append(ranks, rank), append(ids, id)
			h.advance(200)
		}
		assert.Equal(t, ranks[0], ranks[1], "the document is prefilled where it is being computed")
		for _, id := range ids {
			h.respond(id, 200)
		}
	})
}
