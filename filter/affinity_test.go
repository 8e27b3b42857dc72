package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const threeEndpoints = `{"pools":{"decode":{"endpoints":[
	{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"},{"address":"10.0.0.3:8000"}]}}}`

const dpFleet = `{"pools":{"decode":{"endpoints":[
	{"address":"10.0.0.1:8000","dp_size":2},{"address":"10.0.0.2:8000","dp_size":2},{"address":"10.0.0.3:8000"}]}}}`

func TestConversationTurnsStick(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		first := map[string]string{}
		for turn := 0; turn < 10; turn++ {
			for c := 0; c < 12; c++ {
				conv := fmt.Sprintf("conv-%d", c)
				dest, _, decision := h.route(post("/v1/chat/completions", chat(fmt.Sprintf("turn %d", turn)),
					[2]string{"x-session-id", conv}))
				if turn == 0 {
					assert.Equal(t, "new-conversation", decision)
					first[conv] = dest
					continue
				}
				assert.Equal(t, "sticky", decision, "%s turn %d", conv, turn)
				assert.Equal(t, first[conv], dest, "%s turn %d moved", conv, turn)
			}
		}
		used := map[string]int{}
		for _, d := range first {
			used[d]++
		}
		assert.Equal(t, map[string]int{"10.0.0.1:8000": 4, "10.0.0.2:8000": 4, "10.0.0.3:8000": 4}, used)
		assert.Equal(t, uint64(120), h.counter("kvroute_requests_routed"))
		assert.Equal(t, uint64(12), h.counter("kvroute_decision_new_conversation"))
		assert.Equal(t, uint64(108), h.counter("kvroute_decision_sticky"))
	})
}

func TestNewConversationsRoundRobinEndpointFirst(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, dpFleet)
		var got []string
		for c := 0; c < 10; c++ {
			dest, rank, _ := h.route(post("/v1/chat/completions", chat("hi"), [2]string{"x-session-id", fmt.Sprint("c", c)}))
			if rank == "" {
				rank = "-"
			}
			got = append(got, dest+"/"+rank)
		}
		// e0r0 e1r0 e2r0 e0r1 e1r1, then again; the dp_size 1 endpoint gets no rank header.
		want := []string{"10.0.0.1:8000/0", "10.0.0.2:8000/0", "10.0.0.3:8000/-", "10.0.0.1:8000/1", "10.0.0.2:8000/1"}
		assert.Equal(t, append(want, want...), got)
	})
}

func TestNewConversationsGoWhereTheirSystemPromptIsCached(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		var system strings.Builder
		for i := 0; system.Len() < 4000; i++ {
			fmt.Fprintf(&system, "rule%d ", i)
		}
		// A request without an id caches the system prompt on one target; the new
		// conversations that share it go there under the default round robin.
		home, _, _ := h.route(post("/v1/chat/completions", chat(system.String()+"warm up")))
		for c := 0; c < 4; c++ {
			dest, _, decision := h.route(post("/v1/chat/completions", chat(system.String()+fmt.Sprint("question ", c)),
				[2]string{"x-session-id", fmt.Sprint("s", c)}))
			assert.Equal(t, "new-conversation", decision)
			assert.Equal(t, home, dest, "conversation %d", c)
		}
	})
}

func TestRankHeaderOnlyWithDataParallelism(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		for i := 0; i < 6; i++ {
			id, _ := h.send(post("/v1/chat/completions", chat("x"), [2]string{"x-session-id", fmt.Sprint(i)}))
			_, has := h.header(id, "x-data-parallel-rank")
			assert.False(t, has)
			h.respond(id, 200)
		}
	})
}

func TestConversationIDFromHeadersAndBodyFields(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		cases := []request{
			post("/v1/chat/completions", chat("a"), [2]string{"x-session-id", "s1"}),
			post("/v1/chat/completions", chat("a"), [2]string{"x-correlation-id", "s2"}),
			post("/v1/chat/completions", chat("a"), [2]string{"x-session-affinity", "s3"}),
			post("/v1/chat/completions", chat("a"), [2]string{"x-multi-turn-session-id", "s4"}),
			post("/v1/chat/completions", `{"model":"m","conversation_params":{"conversation_id":"s5"},"messages":[{"role":"user","content":"a"}]}`),
			post("/v1/chat/completions", `{"model":"m","prompt_cache_key":"s6","messages":[{"role":"user","content":"a"}]}`),
			post("/v1/responses", `{"model":"m","conversation":"s7","input":"a"}`),
			post("/v1/responses", `{"model":"m","conversation":{"id":"s8"},"input":"a"}`),
		}
		for i, r := range cases {
			dest, _, decision := h.route(r)
			require.Equal(t, "new-conversation", decision, "case %d", i)
			for turn := 0; turn < 3; turn++ {
				d2, _, dec2 := h.route(r)
				assert.Equal(t, "sticky", dec2, "case %d", i)
				assert.Equal(t, dest, d2, "case %d", i)
			}
		}
		// The header wins over a body field, and the first configured header wins.
		dest, _, _ := h.route(post("/v1/chat/completions",
			`{"model":"m","prompt_cache_key":"other","messages":[{"role":"user","content":"a"}]}`,
			[2]string{"x-session-id", "s1"}))
		_, _, decision := h.route(post("/v1/chat/completions", chat("b"), [2]string{"x-session-id", "s1"}, [2]string{"x-correlation-id", "zzz"}))
		assert.Equal(t, "sticky", decision)
		d1, _, _ := h.route(cases[0])
		assert.Equal(t, d1, dest)
	})
}

func TestRequestsWithoutIDAreSpreadByLoadAndNotRecorded(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		seen := map[string]int{}
		var ids []uint32
		for i := 0; i < 9; i++ {
			// Requests in flight at once: the ledger steers each to the least loaded.
			id, _ := h.send(post("/v1/completions", fmt.Sprintf(`{"model":"m","prompt":"question %d"}`, i)))
			dest, _ := h.header(id, "x-gateway-destination-endpoint")
			dec, _ := h.header(id, "x-kvroute-decision")
			assert.Equal(t, "load", dec)
			seen[dest]++
			ids = append(ids, id)
		}
		assert.Equal(t, map[string]int{"10.0.0.1:8000": 3, "10.0.0.2:8000": 3, "10.0.0.3:8000": 3}, seen)
		for _, id := range ids {
			h.respond(id, 200)
		}
		assert.Equal(t, uint64(0), h.counter("kvroute_decision_new_conversation"))
		assert.Equal(t, uint64(9), h.counter("kvroute_decision_load"))
	})
}

func TestOwnedHeadersStrippedEverywhere(t *testing.T) {
	spoof := [][2]string{
		{"x-gateway-destination-endpoint", "evil:1"},
		{"x-data-parallel-rank", "7"},
		{"x-prefiller-host-port", "evil:2"},
		{"x-prefiller-data-parallel-rank", "3"},
		{"x-kvroute-decision", "sticky"},
	}
	owned := func(h *host, id uint32) map[string]string {
		out := map[string]string{}
		for _, kv := range spoof {
			if v, ok := h.header(id, kv[0]); ok {
				out[kv[0]] = v
			}
		}
		return out
	}
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		for _, r := range []request{
			{method: "GET", path: "/v1/models", headers: spoof},
			{method: "GET", path: "/v1/chat/completions", headers: spoof},
			{method: "POST", path: "/healthz", headers: spoof, body: []byte("{}")},
		} {
			id, action := h.send(r)
			assert.Equal(t, types.ActionContinue, action, r.path)
			assert.Empty(t, owned(h, id), "unrouted %s %s", r.method, r.path)
			h.respond(id, 200)
		}
		id, _ := h.send(request{method: "POST", path: "/v1/chat/completions?x=1", headers: spoof, body: []byte(chat("hi"))})
		got := owned(h, id)
		assert.NotEqual(t, "evil:1", got["x-gateway-destination-endpoint"])
		assert.True(t, strings.HasPrefix(got["x-gateway-destination-endpoint"], "10.0.0."))
		assert.NotContains(t, got, "x-data-parallel-rank")
		assert.NotContains(t, got, "x-prefiller-host-port")
		assert.NotContains(t, got, "x-prefiller-data-parallel-rank")
		assert.Equal(t, "load", got["x-kvroute-decision"])
		h.respond(id, 200)
	})
}

func TestOversizeBodyIsNotBuffered(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"max_body_bytes":1024,"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000"}]}}}`)
		big := chat(strings.Repeat("x", 4096))
		id := h.InitializeHttpContext()
		action := h.CallOnRequestHeaders(id, [][2]string{{":method", "POST"}, {":path", "/v1/chat/completions"},
			{"content-length", fmt.Sprint(len(big))}, {"x-session-id", "big"}}, false)
		assert.Equal(t, types.ActionContinue, action, "headers must not wait for an oversize body")
		dest, _ := h.header(id, "x-gateway-destination-endpoint")
		assert.Equal(t, "10.0.0.1:8000", dest)
		assert.Equal(t, types.ActionContinue, h.CallOnRequestBody(id, []byte(big), true))
		assert.Equal(t, []byte(big), h.GetCurrentRequestBody(id))
		h.respond(id, 200)
		// Without content-length the body is buffered until it outgrows the limit.
		id = h.InitializeHttpContext()
		assert.Equal(t, types.ActionPause, h.CallOnRequestHeaders(id, [][2]string{{":method", "POST"}, {":path", "/v1/chat/completions"}}, false))
		assert.Equal(t, types.ActionPause, h.CallOnRequestBody(id, []byte(big[:512]), false))
		assert.Equal(t, types.ActionContinue, h.CallOnRequestBody(id, []byte(big[512:2048]), false))
		dest, _ = h.header(id, "x-gateway-destination-endpoint")
		assert.Equal(t, "10.0.0.1:8000", dest)
		h.respond(id, 200)
		assert.Equal(t, uint64(2), h.counter("kvroute_requests_routed"))
	})
}

func TestGarbageBodiesFailOpen(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		bodies := []string{"not json", `["array"]`, `{"messages":"nope"}`, `{"model":"m","messages":[{"role":"user","content":"x"}`, "\xff\xfe"}
		for i, b := range bodies {
			id, action := h.send(post("/v1/chat/completions", b))
			assert.Equal(t, types.ActionContinue, action)
			dest, ok := h.header(id, "x-gateway-destination-endpoint")
			assert.True(t, ok, "body %d routed", i)
			assert.True(t, strings.HasPrefix(dest, "10.0.0."))
			dec, _ := h.header(id, "x-kvroute-decision")
			assert.Equal(t, "load", dec)
			assert.Equal(t, []byte(b), h.GetCurrentRequestBody(id), "body forwarded unchanged")
			h.respond(id, 200)
		}
		assert.Equal(t, uint64(len(bodies)), h.counter("kvroute_parse_errors"))
		// A garbage body with a conversation header still sticks.
		d1, _, dec1 := h.route(post("/v1/chat/completions", "garbage", [2]string{"x-session-id", "g"}))
		d2, _, dec2 := h.route(post("/v1/chat/completions", "garbage", [2]string{"x-session-id", "g"}))
		assert.Equal(t, "new-conversation", dec1)
		assert.Equal(t, "sticky", dec2)
		assert.Equal(t, d1, d2)
	})
}

func TestBodylessPostIsDecidedAtHeaders(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		id, action := h.send(request{method: "POST", path: "/v1/completions"})
		assert.Equal(t, types.ActionContinue, action)
		_, ok := h.header(id, "x-gateway-destination-endpoint")
		assert.True(t, ok)
		h.respond(id, 200)
	})
}

func TestConfigRefusedNamingTheField(t *testing.T) {
	cases := map[string]string{
		``: "pools.decode.endpoints",
		`{"pools":{"decode":{"endpoints":[{"address":"nope"}]}}}`:                                       "pools.decode.endpoints[0].address",
		`{"bogus":1,"pools":{"decode":{"endpoints":[{"address":"a:1"}]}}}`:                              "bogus",
		`{"prefix":{"block_tokens":0},"pools":{"decode":{"endpoints":[{"address":"a:1"}]}}}`:            "prefix.block_tokens",
		`{"pools":{"decode":{"endpoints":[{"address":"a:1"},{"address":"a:1"}]}}}`:                      "pools.decode.endpoints[1].address",
		`{"disaggregation":{"mode":"vllm"},"pools":{"decode":{"endpoints":[{"address":"a:1"}]}}}`:       "pools.prefill.endpoints",
		`{"conversation":{"first_turn":"random"},"pools":{"decode":{"endpoints":[{"address":"a:1"}]}}}`: "conversation.first_turn",
	}
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		for config, field := range cases {
			t.Run(field, func(t *testing.T) {
				h, status := tryStart(t, vm, config)
				assert.Equal(t, types.OnPluginStartStatusFailed, status, config)
				logs := h.GetCriticalLogs()
				require.Len(t, logs, 1, config)
				assert.Contains(t, logs[0], "invalid configuration: "+field+":", config)
			})
		}
	})
}
