package main

import (
	"bytes"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/routing"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What a client controls — headers, body fields, ids, ranks, sizes — can never make
// the filter fail, send a request outside the configured pools, or keep or log a
// conversation id raw.

var ownedHeaderNames = []string{
	"x-gateway-destination-endpoint",
	"x-data-parallel-rank",
	"x-prefiller-host-port",
	"x-prefiller-data-parallel-rank",
	"x-kvroute-decision",
}

// headerValues returns every value of name among the request headers the upstream sees.
func (h *host) headerValues(id uint32, name string) []string {
	var out []string
	for _, kv := range h.GetCurrentRequestHeaders(id) {
		if kv[0] == name {
			out = append(out, kv[1])
		}
	}
	return out
}

// Envoy lower-cases header names before a filter sees them (HTTP/2 and HTTP/3 require
// lower case; HTTP/1 names are normalised), as the emulator does: a spoofed owned
// header in any case is the owned header, and stripped.
func TestSpoofedOwnedHeadersInAnyCase(t *testing.T) {
	cases := [][2]string{}
	for _, name := range ownedHeaderNames {
		cases = append(cases, [2]string{strings.ToUpper(name), "evil-upper:1"})
		title := []byte(name)
		for i := range title {
			if i == 0 || title[i-1] == '-' {
				title[i] -= 'a' - 'A'
			}
		}
		cases = append(cases, [2]string{string(title), "evil-title:1"})
	}
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		for _, r := range []request{
			{method: "POST", path: "/v1/chat/completions", body: []byte(chat("hi"))},
			{method: "GET", path: "/v1/models"},
			{method: "POST", path: "/other", body: []byte("{}")},
		} {
			for _, spoof := range cases {
				r.headers = [][2]string{spoof}
				id, action := h.send(r)
				assert.Equal(t, types.ActionContinue, action)
				for _, kv := range h.GetCurrentRequestHeaders(id) {
					assert.NotContains(t, kv[1], "evil", "%s %s: %q reached the upstream", r.method, r.path, kv)
				}
				h.respond(id, 200)
			}
		}
	})
}

// The same owned header sent on several lines: every line is gone, and what the
// upstream sees is the filter's one value.
//
// Envoy's proxy_remove_header_map_value removes every value of a name. The SDK host
// emulator removes only the first, and the filter removes each owned name once
// (filter/http.go, the `stripped` bit set), so in the emulator a repeated spoofed
// line survives when the filter writes no value of its own for that name. This test
// checks the Envoy-independent part (the filter's own value replaces a repeated
// line) and reports, without failing, whether a repeated line survives in this host.
func TestSpoofedOwnedHeadersOnRepeatedLines(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":2},{"address":"10.0.0.2:8000","dp_size":2}]}}}`)
		var spoof [][2]string
		for _, name := range []string{"x-gateway-destination-endpoint", "x-data-parallel-rank", "x-kvroute-decision"} {
			spoof = append(spoof, [2]string{name, "evil-1"}, [2]string{strings.ToUpper(name), "evil-2"})
		}
		for i := 0; i < 8; i++ {
			id, _ := h.send(post("/v1/chat/completions", chat(fmt.Sprint("q", i)), spoof...))
			dest := h.headerValues(id, "x-gateway-destination-endpoint")
			require.Len(t, dest, 1, "one destination line")
			assert.Contains(t, []string{"10.0.0.1:8000", "10.0.0.2:8000"}, dest[0])
			rank := h.headerValues(id, "x-data-parallel-rank")
			require.Len(t, rank, 1)
			assert.Contains(t, []string{"0", "1"}, rank[0])
			dec := h.headerValues(id, "x-kvroute-decision")
			require.Len(t, dec, 1)
			assert.Equal(t, "load", dec[0])
			h.respond(id, 200)
		}
		// Where the filter writes nothing of its own (an unrouted request, or the
		// prefill headers outside sidecar mode), only the removal protects: one
		// remove per line, so even a host that drops one line a call keeps none.
		survived := 0
		for _, r := range []request{
			{method: "GET", path: "/v1/models", headers: spoof},
			post("/v1/chat/completions", chat("x"), [2]string{"x-prefiller-host-port", "evil-1"}, [2]string{"x-prefiller-host-port", "evil-2"}),
		} {
			id, _ := h.send(r)
			for _, kv := range h.GetCurrentRequestHeaders(id) {
				if strings.HasPrefix(kv[1], "evil") {
					survived++
				}
			}
			h.respond(id, 200)
		}
		assert.Zero(t, survived, "repeated spoofed owned header lines reached the worker")
	})
}

// distinctiveID is a conversation id no log line or stored value could contain by
// chance.
const distinctiveID = "kvroute-SECRET-conversation-7f3a9c2e41d8b6"

func TestConversationIDsNeverLoggedOrStored(t *testing.T) {
	ids := []string{
		distinctiveID,
		distinctiveID + "-body",
		"9876543210123456789", // a number id, by its JSON text
	}
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		// Every path that logs: ejections (threshold 1), prefill failures, parse errors.
		h := startHost(t, vm, `{"health":{"failure_threshold":1},"disaggregation":{"mode":"vllm","threshold_tokens":40},
			"conversation":{"body_fields":["prompt_cache_key","conversation_params.conversation_id","conversation","user"]},
			"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"},{"address":"10.0.1.2:8000"}]},
			"prefill":{"endpoints":[{"address":"10.0.2.1:8000"}]}}}`)
		bodies := []request{
			post("/v1/chat/completions", chat("hi"), [2]string{"x-session-id", ids[0]}),
			post("/v1/chat/completions", chat("hi"), [2]string{"x-correlation-id", ids[0]}),
			post("/v1/chat/completions", `{"model":"m","prompt_cache_key":"`+ids[1]+`","messages":[{"role":"user","content":"a"}]}`),
			post("/v1/chat/completions", `{"model":"m","conversation_params":{"conversation_id":"`+ids[1]+`"},"messages":[]}`),
			post("/v1/responses", `{"model":"m","conversation":{"id":"`+ids[1]+`"},"input":"x"}`),
			post("/v1/completions", `{"model":"m","user":`+ids[2]+`,"prompt":"x"}`),
			post("/v1/chat/completions", `not json `+ids[1], [2]string{"x-session-id", ids[0]}),
			post("/v1/chat/completions", longChat(60, `,"prompt_cache_key":"`+ids[1]+`"`)), // disaggregated
		}
		for round := 0; round < 3; round++ {
			for i, r := range bodies {
				id, action := h.send(r)
				if action == types.ActionPause {
					co := h.onlyCallout(id)
					h.CallOnHttpCallResponse(co.CalloutID, [][2]string{{":status", fmt.Sprint(500 + round)}}, nil, []byte(ids[1]))
				}
				_, ok := h.header(id, "x-gateway-destination-endpoint")
				require.True(t, ok, "request %d routed", i)
				h.respond(id, []int{200, 503, 502}[(round+i)%3])
			}
		}
		require.NotZero(t, h.counter("kvroute_endpoint_ejections"), "the ejection log path ran")
		require.NotZero(t, h.counter("kvroute_pd_prefill_failures"), "the prefill failure path ran")
		require.NotZero(t, h.counter("kvroute_parse_errors"), "the parse error path ran")
		logs := h.allLogs()
		require.NotEmpty(t, logs)
		for _, line := range logs {
			for _, id := range ids {
				assert.NotContains(t, line, id, "a log line holds a raw id")
			}
			assert.NotContains(t, line, "SECRET")
		}
		kv, ok := h.allSharedData()
		if !ok {
			t.Skip("this SDK version's shared data cannot be listed")
		}
		require.NotEmpty(t, kv)
		for k, v := range kv {
			for _, id := range ids {
				assert.NotContains(t, k, id, "a shared-data key holds a raw id")
				assert.False(t, bytes.Contains(v, []byte(id)), "shared data %q holds a raw id", k)
				assert.False(t, bytes.Contains(v, []byte(id[:12])), "shared data %q holds part of a raw id", k)
			}
		}
	})
}

// hostileIDs are conversation ids a client may send in a header or a body field.
var hostileIDs = map[string]string{
	"64 KiB":            strings.Repeat("x", 64<<10),
	"64 KiB mixed":      strings.Repeat("\x01\xffé\"\\", 64<<10/7),
	"control chars":     "a\x01\x02\x1b[31m\r\n\tb\x7f",
	"nul":               "a\x00b",
	"invalid utf-8":     "\xff\xfe\xfd\xc3\x28\xed\xa0\x80",
	"json-ish":          `"},"x":{"`,
	"only spaces":       "   ",
	"percent encoded":   "%00%0a%ff",
	"looks like target": "10.0.0.1:8000",
}

// bodyString is s as a JSON string, keeping invalid UTF-8 bytes as they are (the
// filter must cope with a body that is not valid UTF-8 too).
func bodyString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20:
			fmt.Fprintf(&b, `\u%04x`, c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func TestHostileConversationIDsRouteAndStick(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		for name, hostile := range hostileIDs {
			// Each way in gets its own id (one id in a header and a body is one
			// conversation).
			id := func(how string) string { return hostile + how }
			via := map[string]request{
				"header": post("/v1/chat/completions", chat("hi"), [2]string{"x-session-id", id("")}),
				"body":   post("/v1/chat/completions", `{"model":"m","prompt_cache_key":`+bodyString(id("\x00b"))+`,"messages":[{"role":"user","content":"hi"}]}`),
				"object": post("/v1/responses", `{"model":"m","conversation":{"id":`+bodyString(id("\x00o"))+`},"input":"hi"}`),
			}
			for how, r := range via {
				if how == "header" && strings.TrimSpace(hostile) == "" {
					continue // Envoy trims header values; an empty id is no id
				}
				first, _, dec := h.route(r)
				assert.Contains(t, []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}, first, "%s via %s", name, how)
				assert.Equal(t, "new-conversation", dec, "%s via %s", name, how)
				for turn := 0; turn < 3; turn++ {
					again, _, dec := h.route(r)
					assert.Equal(t, "sticky", dec, "%s via %s", name, how)
					assert.Equal(t, first, again, "%s via %s", name, how)
				}
			}
		}
		assert.Equal(t, uint64(0), h.counter("kvroute_fail_open"))
		assert.Equal(t, routing.Load{}, h.poolLoad("decode"))
	})
}

// randomRequest makes one request of what a client may send: any method and path,
// spoofed owned headers with any value, ids, ranks and bodies of every kind.
func randomRequest(rng *rand.Rand) request {
	pick := func(xs ...string) string { return xs[rng.Intn(len(xs))] }
	r := request{
		method: pick("POST", "POST", "POST", "GET", "PUT", "post"),
		path: pick("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/chat/completions?a=b",
			"/v1/chat/completions/", "/V1/completions", "/v1/models", "//v1/completions", "/v1/responses#x"),
	}
	values := []string{"evil:1", "10.0.0.1:8000", "10.0.0.9:8000", "", "0", "1", "2", "7", "-1", " 1 ", "1e0", "0x1",
		"99999999999999999999", strings.Repeat("9", 5000), "\xff", "a\x00b", "sticky", "1,0"}
	// One line per owned name (repeated lines: TestSpoofedOwnedHeadersOnRepeatedLines).
	for _, name := range ownedHeaderNames {
		if rng.Intn(2) == 0 {
			if rng.Intn(2) == 0 {
				name = strings.ToUpper(name)
			}
			r.headers = append(r.headers, [2]string{name, values[rng.Intn(len(values))]})
		}
	}
	if rng.Intn(2) == 0 {
		ids := []string{fmt.Sprint("c", rng.Intn(30)), hostileIDs["control chars"], hostileIDs["invalid utf-8"], hostileIDs["64 KiB"]}
		r.headers = append(r.headers, [2]string{pick("x-session-id", "x-correlation-id", "X-Session-Affinity"), ids[rng.Intn(len(ids))]})
	}
	if rng.Intn(3) == 0 {
		r.headers = append(r.headers, [2]string{"x-request-id", fmt.Sprint(rng.Int63())})
	}
	bodies := []string{
		chat(fmt.Sprint("question ", rng.Intn(100))),
		`{"model":"m","prompt":"` + strings.Repeat("abcd", rng.Intn(200)) + `"}`,
		`{"model":"m","prompt":[1,2,3,` + strconv.Itoa(rng.Intn(1<<30)) + `]}`,
		`{"input":"hi","conversation":{"id":` + bodyString(fmt.Sprint("c", rng.Intn(30))) + `}}`,
		`{"prompt_cache_key":"x-gateway-destination-endpoint: evil:1","messages":[{"role":"user","content":"x"}]}`,
		`{"messages":` + strings.Repeat("[", 1000) + `}`,
		`{"model":"\xff","messages":[{"role":"\x00","content":"\xfe"}]}`,
		"not json", "", `null`, `[]`, `{"messages":[{"role":"user","content":{"a":1}}]}`,
	}
	if rng.Intn(8) > 0 {
		r.body = []byte(bodies[rng.Intn(len(bodies))])
	}
	return r
}

// Property: over many random requests, hostile ones included, the destination the
// upstream sees is always a configured endpoint of the decode pool (one line), the
// rank one of its ranks, the prefill destination a configured prefill endpoint — and
// a request the filter does not route carries none of them.
func TestDestinationIsAlwaysAConfiguredEndpoint(t *testing.T) {
	decode := map[string]int{"10.0.0.1:8000": 2, "10.0.0.2:8000": 1, "[fd00::3]:8000": 4}
	configs := map[string]string{
		"trusted ranks": `{"trust_client_dp_rank":true,"health":{"failure_threshold":2,"cooldown_ms":5},"pools":{"decode":{"endpoints":[
			{"address":"10.0.0.1:8000","dp_size":2},{"address":"10.0.0.2:8000"},{"address":"[fd00::3]:8000","dp_size":4}]}}}`,
		"sidecar": `{"disaggregation":{"mode":"sidecar","threshold_tokens":20},"health":{"failure_threshold":2,"cooldown_ms":5},"pools":{
			"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":2},{"address":"10.0.0.2:8000"},{"address":"[fd00::3]:8000","dp_size":4}]},
			"prefill":{"endpoints":[{"address":"10.0.9.1:8000","dp_size":2}]}}}`,
	}
	routes := map[string]bool{"/v1/chat/completions": true, "/v1/completions": true, "/v1/responses": true}
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		for name, cfg := range configs {
			t.Run(name, func(t *testing.T) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(42))
				routed := 0
				for i := 0; i < 400; i++ {
					r := randomRequest(rng)
					id, _ := h.send(r)
					path, _, _ := strings.Cut(r.path, "?")
					isRouted := r.method == "POST" && routes[path]
					dest := h.headerValues(id, "x-gateway-destination-endpoint")
					rank := h.headerValues(id, "x-data-parallel-rank")
					pf := h.headerValues(id, "x-prefiller-host-port")
					pfRank := h.headerValues(id, "x-prefiller-data-parallel-rank")
					if !isRouted {
						for _, vs := range [][]string{dest, rank, pf, pfRank, h.headerValues(id, "x-kvroute-decision")} {
							assert.Empty(t, vs, "request %d: unrouted %s %s", i, r.method, r.path)
						}
						h.respond(id, 200)
						continue
					}
					routed++
					require.Len(t, dest, 1, "request %d: %+v", i, r.headers)
					dp, ok := decode[dest[0]]
					require.True(t, ok, "request %d: destination %q is not configured", i, dest[0])
					if dp > 1 {
						require.Len(t, rank, 1, "request %d", i)
						n, err := strconv.Atoi(rank[0])
						require.NoError(t, err)
						assert.True(t, n >= 0 && n < dp, "request %d: rank %d of %s", i, n, dest[0])
					} else {
						assert.Empty(t, rank, "request %d: a rank for a dp_size 1 endpoint", i)
					}
					if len(pf) > 0 {
						require.Len(t, pf, 1)
						assert.Equal(t, "10.0.9.1:8000", pf[0], "request %d", i)
						require.Len(t, pfRank, 1)
						assert.Contains(t, []string{"0", "1"}, pfRank[0])
					} else {
						assert.Empty(t, pfRank)
					}
					h.respond(id, []int{200, 200, 200, 503, 502, 404}[rng.Intn(6)])
				}
				assert.Greater(t, routed, 50)
				assert.Equal(t, uint64(0), h.counter("kvroute_fail_open"))
				assert.Equal(t, routing.Load{}, h.poolLoad("decode"))
				assert.Equal(t, routing.Load{}, h.poolLoad("prefill"))
			})
		}
	})
}

// A trusted client rank only narrows the choice to that rank; a rank no endpoint has,
// or a value that is not a rank, is ignored.
func TestTrustedClientRankCannotLeaveThePool(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"trust_client_dp_rank":true,"pools":{"decode":{"endpoints":[
			{"address":"10.0.0.1:8000","dp_size":2},{"address":"10.0.0.2:8000"}]}}}`)
		for _, v := range []string{"0", "1", "2", "-1", "1024", "99999999999999999999", "1e0", " 1", "0x1", "+1", "１"} {
			id, _ := h.send(post("/v1/completions", `{"prompt":"x"}`, [2]string{"x-data-parallel-rank", v}))
			dest := h.headerValues(id, "x-gateway-destination-endpoint")
			require.Len(t, dest, 1)
			assert.Contains(t, []string{"10.0.0.1:8000", "10.0.0.2:8000"}, dest[0], "rank %q", v)
			if v == "1" || v == " 1" {
				assert.Equal(t, "10.0.0.1:8000", dest[0], "only 10.0.0.1 has rank 1")
				assert.Equal(t, []string{"1"}, h.headerValues(id, "x-data-parallel-rank"))
			}
			if dest[0] == "10.0.0.2:8000" {
				assert.Empty(t, h.headerValues(id, "x-data-parallel-rank"), "rank %q", v)
			}
			h.respond(id, 200)
		}
	})
}

// Deeply nested and huge JSON bodies cost bounded work: each returns, routes, and
// leaves the body as it was. (No timing is asserted; the work is bounded by
// max_body_bytes, which caps what is buffered and parsed.)
func TestDeeplyNestedAndHugeJSON(t *testing.T) {
	const depth = 100_000
	arrays := strings.Repeat("[", depth) + strings.Repeat("]", depth)
	objects := strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth)
	msg := `{"role":"user","content":"hello"}`
	many := strings.Repeat(msg+",", 100_000) + msg
	bodies := map[string]struct {
		body     string
		parseErr bool
	}{
		"100k nested arrays as messages": {`{"model":"m","messages":` + arrays + `}`, true},
		// Nesting deeper than routing's bound (256) anywhere fails open: routed by load.
		"100k nested arrays beside":        {`{"model":"m","x":` + arrays + `,"messages":[` + msg + `]}`, true},
		"100k nested objects beside":       {`{"x":` + objects + `,"prompt_cache_key":"k","messages":[` + msg + `]}`, true},
		"100k nested in a body field path": {`{"conversation_params":` + objects + `,"messages":[` + msg + `]}`, true},
		"100k nested in content parts":     {`{"messages":[{"role":"user","content":[` + arrays + `]}]}`, true},
		"unclosed 100k arrays":             {`{"messages":` + strings.Repeat("[", depth), true},
		"100k messages":                    {`{"model":"m","messages":[` + many + `]}`, false},
		"4 MiB string":                     {chat(strings.Repeat("a", 4<<20-100)), false},
		"200k keys":                        {`{` + strings.Repeat(`"k":1,`, 200_000) + `"prompt":"x"}`, false},
		"1M token ids":                     {`{"prompt":[` + strings.Repeat("1,", 1<<20) + `1]}`, false},
	}
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		before, memOK := guestMemoryBytes(vm)
		for name, b := range bodies {
			path := "/v1/chat/completions"
			if strings.Contains(b.body, `"prompt"`) {
				path = "/v1/completions"
			}
			errsBefore := h.counter("kvroute_parse_errors")
			id, action := h.send(post(path, b.body))
			assert.Equal(t, types.ActionContinue, action, name)
			dest, ok := h.header(id, "x-gateway-destination-endpoint")
			assert.True(t, ok && strings.HasPrefix(dest, "10.0.0."), "%s: routed to %q", name, dest)
			assert.Equal(t, b.body, string(h.GetCurrentRequestBody(id)), "%s: body forwarded unchanged", name)
			parseErr := h.counter("kvroute_parse_errors") > errsBefore
			assert.Equal(t, b.parseErr, parseErr, name)
			h.respond(id, 200)
		}
		if after, ok := guestMemoryBytes(vm); memOK && ok {
			t.Logf("guest linear memory: %d MiB before, %d MiB after the hostile bodies", before>>20, after>>20)
		}
		assert.Equal(t, uint64(0), h.counter("kvroute_fail_open"))
		assert.Equal(t, routing.Load{}, h.poolLoad("decode"))
	})
}
