package main

import (
	"encoding/json"
	"math/rand"
	"strconv"
	"testing"

	"github.com/kvroute/kvroute/routing"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
)

// Two models on disjoint endpoints; qwen3 also takes its LoRA adapters by prefix.
// fleetsTopLevel is inserted before "models" (e.g. top-level pools).
func modelsConfig(topLevel string) string {
	return `{` + topLevel + `"routes":["/v1/chat/completions","/v1/completions","/v1/models"],
	"headers":{"model":"x-gateway-model-name"},
	"models":[
		{"names":["qwen3-32b","qwen3-32b-*"],"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"},{"address":"10.0.1.2:8000"}]}}},
		{"names":["llama-3.1-70b"],"pools":{"decode":{"endpoints":[{"address":"10.0.2.1:8000"}]},
			"prefill":{"endpoints":[{"address":"10.0.2.9:8000"}]}},
		 "disaggregation":{"mode":"sidecar","threshold_tokens":100}}]}`
}

const defaultPool = `"pools":{"decode":{"endpoints":[{"address":"10.0.9.1:8000"}]}},`

func modelChat(model, content string) string {
	return `{"model":` + model + `,"messages":[{"role":"user","content":` + strconv.Quote(content) + `}]}`
}

// routeModel sends a chat for model (a JSON value) and returns the upstream's
// destination, model header and decision, failing on anything but a continue.
func (h *host) routeModel(model, content string, headers ...[2]string) (dest, modelHeader, decision string) {
	id, action := h.send(post("/v1/chat/completions", modelChat(model, content), headers...))
	require.Equal(h.t, types.ActionContinue, action)
	require.Nil(h.t, h.GetSentLocalResponse(id))
	dest, _ = h.header(id, "x-gateway-destination-endpoint")
	modelHeader, _ = h.header(id, "x-gateway-model-name")
	decision, _ = h.header(id, "x-kvroute-decision")
	h.respond(id, 200)
	return dest, modelHeader, decision
}

func TestModelsRouteEachModelToItsOwnFleet(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, modelsConfig(""))
		spoof := [2]string{"x-gateway-model-name", "llama-3.1-70b"}
		seenQwen := map[string]bool{}
		for i := 0; i < 6; i++ {
			dest, model, _ := h.routeModel(`"qwen3-32b"`, "hello "+strconv.Itoa(i), spoof)
			assert.Contains(t, []string{"10.0.1.1:8000", "10.0.1.2:8000"}, dest)
			assert.Equal(t, "qwen3-32b", model, "the fleet's name, never the client's")
			seenQwen[dest] = true
		}
		assert.Len(t, seenQwen, 2, "balanced over the fleet's own endpoints")
		// A LoRA adapter of the base model: its fleet, named by the base.
		dest, model, _ := h.routeModel(`"qwen3-32b-sql-lora"`, "select")
		assert.Contains(t, []string{"10.0.1.1:8000", "10.0.1.2:8000"}, dest)
		assert.Equal(t, "qwen3-32b", model)
		dest, model, _ = h.routeModel(`"llama-3.1-70b"`, "hi")
		assert.Equal(t, "10.0.2.1:8000", dest)
		assert.Equal(t, "llama-3.1-70b", model)

		assert.Equal(t, uint64(7), h.counter("kvroute_model_requests_routed.qwen3-32b"))
		assert.Equal(t, uint64(1), h.counter("kvroute_model_requests_routed.llama-3_1-70b"))
		assert.Equal(t, uint64(8), h.counter("kvroute_requests_routed"), "the totals count every fleet")
		assert.Equal(t, uint64(1), h.counter("kvroute_model_decision_load.llama-3_1-70b"))
		// Every fleet's targets have their gauge.
		assert.Equal(t, int64(0), h.gauge("kvroute_target_active_requests.10_0_2_1_8000.rank_0"))
		assert.Equal(t, int64(0), h.gauge("kvroute_target_active_requests.10_0_1_2_8000.rank_0"))
	})
}

func TestModelsUnknownModelWithoutDefaultPoolIs404(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, modelsConfig(""))
		id, action := h.send(post("/v1/chat/completions", modelChat(`"gpt-4o"`, "hi")))
		assert.Equal(t, types.ActionPause, action, "nothing goes upstream")
		lr := h.GetSentLocalResponse(id)
		require.NotNil(t, lr)
		assert.Equal(t, uint32(404), lr.StatusCode)
		assert.Equal(t, "model_not_found", gjson.GetBytes(lr.Data, "error.code").Str)
		assert.Equal(t, "invalid_request_error", gjson.GetBytes(lr.Data, "error.type").Str)
		assert.Equal(t, "model", gjson.GetBytes(lr.Data, "error.param").Str)
		assert.Contains(t, gjson.GetBytes(lr.Data, "error.message").Str, "gpt-4o")
		assert.Contains(t, headerOf(lr.Headers, "content-type"), "application/json")
		h.CompleteHttpContext(id)
		assert.Equal(t, uint64(1), h.counter("kvroute_model_not_found"))
		assert.Equal(t, uint64(0), h.counter("kvroute_requests_routed"))
	})
}

func TestModelsUnknownModelGoesToTheTopLevelPools(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, modelsConfig(defaultPool))
		dest, model, _ := h.routeModel(`"gpt-4o"`, "hi", [2]string{"x-gateway-model-name", "qwen3-32b"})
		assert.Equal(t, "10.0.9.1:8000", dest)
		assert.Equal(t, "", model, "no fleet matched: no model header, and the client's is gone")
		assert.Equal(t, uint64(0), h.counter("kvroute_model_not_found"))
	})
}

func TestModelsMissingOrOddModelNeverFails(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		for _, model := range []string{`null`, `7`, `{"name":"qwen3-32b"}`, `""`} {
			// Without top-level pools: passed through for Envoy to balance.
			t.Run("no default "+model, func(t *testing.T) {
				h := startHost(t, vm, modelsConfig(""))
				dest, _, decision := h.routeModel(model, "hi")
				assert.Equal(t, "", dest)
				assert.Equal(t, "fallback", decision)
			})
			// With them: routed there.
			t.Run("default "+model, func(t *testing.T) {
				h := startHost(t, vm, modelsConfig(defaultPool))
				dest, _, _ := h.routeModel(model, "hi")
				assert.Equal(t, "10.0.9.1:8000", dest)
			})
		}
		// No model member at all, and a body that is not JSON.
		h := startHost(t, vm, modelsConfig(defaultPool))
		dest, _, _ := h.route(post("/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`))
		assert.Equal(t, "10.0.9.1:8000", dest)
		dest, _, _ = h.route(post("/v1/chat/completions", `{"model":"qwen3-32b",`))
		assert.Equal(t, "10.0.9.1:8000", dest, "an unreadable body names no model")
	})
}

func TestModelsConversationIdIsPerModel(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		// Two fleets over the same endpoints: only the state tells them apart.
		cfg := `{"models":[
			{"names":["a"],"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"},{"address":"10.0.1.2:8000"}]}}},
			{"names":["b"],"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"},{"address":"10.0.1.2:8000"}]}}}]}`
		h := startHost(t, vm, cfg)
		session := [2]string{"x-session-id", "s-1"}
		destA, _, dec := h.routeModel(`"a"`, "one", session)
		assert.Equal(t, "new-conversation", dec)
		_, _, dec = h.routeModel(`"b"`, "two", session)
		assert.Equal(t, "new-conversation", dec, "the same id under another model is another conversation")
		dest, _, dec := h.routeModel(`"a"`, "three", session)
		assert.Equal(t, "sticky", dec)
		assert.Equal(t, destA, dest)
		_, _, dec = h.routeModel(`"b"`, "four", session)
		assert.Equal(t, "sticky", dec)
	})
}

func TestModelsDisaggregationOnOneFleetOnly(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, modelsConfig(""))
		long := modelChat(`"llama-3.1-70b"`, longText(120))
		id, action := h.send(post("/v1/chat/completions", long))
		require.Equal(t, types.ActionContinue, action)
		dec, _ := h.header(id, "x-kvroute-decision")
		assert.Equal(t, "load;pd=disaggregated", dec)
		pf, _ := h.header(id, "x-prefiller-host-port")
		assert.Equal(t, "10.0.2.9:8000", pf)
		h.respond(id, 200)
		// The other fleet has no P/D: no pd part, no prefill header.
		id, _ = h.send(post("/v1/chat/completions", modelChat(`"qwen3-32b"`, longText(120))))
		dec, _ = h.header(id, "x-kvroute-decision")
		assert.Equal(t, "load", dec)
		_, has := h.header(id, "x-prefiller-host-port")
		assert.False(t, has)
		h.respond(id, 200)
		assert.Equal(t, uint64(1), h.counter("kvroute_pd_disaggregated"))
	})
}

func longText(tokens int) string {
	b := make([]byte, 4*tokens)
	for i := range b {
		b[i] = 'a' + byte(i%26)
	}
	return string(b)
}

func TestModelsCatalogue(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		t.Run("answered", func(t *testing.T) {
			h := startHost(t, vm, modelsConfig(defaultPool))
			id, action := h.send(request{method: "GET", path: "/v1/models?x=1"})
			assert.Equal(t, types.ActionPause, action)
			lr := h.GetSentLocalResponse(id)
			require.NotNil(t, lr)
			assert.Equal(t, uint32(200), lr.StatusCode)
			assert.JSONEq(t, `{"object":"list","data":[
				{"id":"qwen3-32b","object":"model","created":0,"owned_by":"kvroute"},
				{"id":"llama-3.1-70b","object":"model","created":0,"owned_by":"kvroute"}]}`, string(lr.Data))
			h.CompleteHttpContext(id)
		})
		t.Run("not in routes", func(t *testing.T) {
			// The upstream answers, as before.
			h := startHost(t, vm, `{"models":[{"names":["a"],"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"}]}}}]}`)
			id, action := h.send(request{method: "GET", path: "/v1/models"})
			assert.Equal(t, types.ActionContinue, action)
			assert.Nil(t, h.GetSentLocalResponse(id))
		})
		t.Run("no models", func(t *testing.T) {
			// In routes without models: no catalogue to give, the upstream answers.
			h := startHost(t, vm, `{"routes":["/v1/models","/v1/completions"],`+defaultPool[:len(defaultPool)-1]+`}`)
			id, action := h.send(request{method: "GET", path: "/v1/models"})
			assert.Equal(t, types.ActionContinue, action)
			assert.Nil(t, h.GetSentLocalResponse(id))
		})
	})
}

func TestModelsHeaderIsOwned(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		t.Run("stripped", func(t *testing.T) {
			// On a path that is not routed, too.
			h := startHost(t, vm, modelsConfig(defaultPool))
			id, _ := h.send(request{method: "GET", path: "/healthz", headers: [][2]string{{"X-Gateway-Model-Name", "x"}}})
			_, has := h.header(id, "x-gateway-model-name")
			assert.False(t, has)
		})
		t.Run("off by default", func(t *testing.T) {
			// A client's header of that name is then nobody's business.
			h := startHost(t, vm, `{`+defaultPool+`"models":[{"names":["a"],"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"}]}}}]}`)
			id, _ := h.send(post("/v1/chat/completions", modelChat(`"a"`, "hi"), [2]string{"x-gateway-model-name", "x"}))
			v, _ := h.header(id, "x-gateway-model-name")
			assert.Equal(t, "x", v)
		})
	})
}

func TestModelsConfigErrorsNameTheField(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		t.Run("name twice", func(t *testing.T) {
			h, status := tryStart(t, vm, `{"models":[{"names":["a"],"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"}]}}},
			{"names":["b","a"],"pools":{"decode":{"endpoints":[{"address":"10.0.1.2:8000"}]}}}]}`)
			assert.Equal(t, types.OnPluginStartStatusFailed, status)
			assert.Contains(t, h.GetCriticalLogs(), `kvroute: invalid configuration: models[1].names[1]: "a" is already named by models[0].names[0]`)
		})
		t.Run("first names alike as metrics", func(t *testing.T) {
			// Two first names that write alike in stat names would share every counter.
			h, status := tryStart(t, vm, `{"models":[{"names":["qwen3.32b"],"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"}]}}},
			{"names":["qwen3_32b"],"pools":{"decode":{"endpoints":[{"address":"10.0.1.2:8000"}]}}}]}`)
			assert.Equal(t, types.OnPluginStartStatusFailed, status)
			assert.Contains(t, h.GetCriticalLogs(), `kvroute: invalid configuration: models[1].names[0]: "qwen3_32b" names its fleet's metrics "qwen3_32b", as models[0].names[0] does: `+
				`the two fleets' counters would be one; rename one, or put another of its names first`)
		})
	})
}

// Each fleet discovers its own endpoints, with its own lease and set: two models
// polled from two lists, each routed over its own answer only.
func TestModelsDiscoverPerFleet(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		cfg := `{"models":[
			{"names":["a"],"pools":{"decode":{"discovery":{"source":"http","cluster":"lists","path":"/a","interval_ms":100}}}},
			{"names":["b"],"pools":{"decode":{"discovery":{"source":"http","cluster":"lists","path":"/b","interval_ms":100}}}}]}`
		h := &discoveryHost{host: startHost(t, vm, cfg), cluster: "lists"}
		dest, _, dec := h.routeModel(`"a"`, "before any poll")
		assert.Equal(t, "", dest)
		assert.Equal(t, "fallback", dec, "a fleet with no endpoint yet passes through")
		h.advance(100)
		h.Tick()
		polls := h.polls()
		require.Len(t, polls, 2, "one poll per fleet, both held by this VM")
		for _, p := range polls {
			body := `{"endpoints":[{"address":"10.0.1.1:8000"}]}`
			if headerOf(p.Headers, ":path") == "/b" {
				body = `{"endpoints":[{"address":"10.0.2.1:8000"}]}`
			}
			h.CallOnHttpCallResponse(p.CalloutID, [][2]string{{":status", "200"}}, nil, []byte(body))
		}
		dest, _, _ = h.routeModel(`"a"`, "one")
		assert.Equal(t, "10.0.1.1:8000", dest)
		dest, _, _ = h.routeModel(`"b"`, "two")
		assert.Equal(t, "10.0.2.1:8000", dest)
		assert.Equal(t, int64(0), h.gauge("kvroute_target_active_requests.10_0_2_1_8000.rank_0"), "a discovered fleet target gets its gauge")
	})
}

// TestATargetFleetsShareShowsTheFleetThatTimedItInFilter: two fleets on one endpoint.
// Its active gauge counts both fleets' requests; its rate is that of the fleet that
// has timed its prefill (8000 tokens in 200 ms), not of the fleet that has timed
// nothing, whichever is listed first.
func TestATargetFleetsShareShowsTheFleetThatTimedItInFilter(t *testing.T) {
	fleet := func(name string) string {
		return `{"names":["` + name + `"],"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000"}]}}}`
	}
	for _, order := range [][2]string{{"qwen3-32b", "llama-3.1-70b"}, {"llama-3.1-70b", "qwen3-32b"}} {
		t.Run(order[0]+" first", func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, `{"models":[`+fleet(order[0])+`,`+fleet(order[1])+`]}`)
				rng := rand.New(rand.NewSource(31))
				open := func(model string) uint32 {
					b, _ := json.Marshal(map[string]any{"model": model, "prompt": prose(rng, 32000)})
					id, _ := h.send(post("/v1/completions", string(b)))
					h.stream(id)
					return id
				}
				timed := open("llama-3.1-70b")
				h.advance(200)
				h.firstChunk(timed)
				h.endStream(timed)
				ids := []uint32{open("qwen3-32b"), open("llama-3.1-70b")}
				h.Tick()
				target := routing.Target{Address: "10.0.0.1:8000", RankText: "0"}
				assert.Equal(t, int64(2), h.gauge(TargetGaugeName(TargetActiveRequests, target)), "one request of each fleet")
				rate := h.gauge(TargetGaugeName(TargetPrefillRate, target))
				if h.wasm { // wazero's clock moves at every reading: 200 ms there is more
					assert.True(t, rate > 0 && rate < 40000, "rate %d", rate)
				} else {
					assert.Equal(t, int64(40000), rate)
				}
				for _, id := range ids {
					h.endStream(id)
				}
			})
		})
	}
}
