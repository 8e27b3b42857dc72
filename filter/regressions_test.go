package main

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/routing"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Regression tests of faults the reliability suite found.

// A body nested a million levels deep (1 MiB, under the default max_body_bytes) in an
// inline P/D mode with threshold_tokens 0 (every request disaggregated) reached the
// P/D body builders, whose recursive gjson validation overflowed the wasm stack: a
// trap, which recover() cannot catch, and the VM was lost. Such a body now fails open:
// routed by load, decoded directly, forwarded as it came.
func TestInlinePDDeeplyNestedBodyFailsOpen(t *testing.T) {
	body := `{"messages":` + strings.Repeat("[", 1<<20)
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		for _, mode := range inlineModes {
			t.Run(mode, func(t *testing.T) {
				h := startHost(t, vm, pdFleet(mode, 0))
				id, action := h.send(post("/v1/chat/completions", body))
				assert.Equal(t, types.ActionContinue, action)
				dest, ok := h.header(id, "x-gateway-destination-endpoint")
				assert.True(t, ok && strings.HasPrefix(dest, "10.0.1."), dest)
				assert.Empty(t, h.GetCalloutAttributesFromContext(id), "no prefill for a body that failed open")
				assert.Equal(t, body, string(h.GetCurrentRequestBody(id)))
				assert.Equal(t, uint64(1), h.counter("kvroute_parse_errors"))
				h.respond(id, 200)
				assert.Equal(t, routing.Load{}, h.poolLoad("decode"))
				assert.Equal(t, routing.Load{}, h.poolLoad("prefill"))
			})
		}
	})
}

// content-length: 9223372036854775807 on requests held open made the ledger's token
// sums wrap to negative, after which the cost drew other traffic to the wrapped
// target. The estimate is now bounded (a request that claims a huge body still counts
// as heavy: the fair-share cap is what limits how much traffic avoids its target).
func TestHugeContentLengthCannotWrapTheLedger(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		var ids []uint32
		for i := 0; i < 8; i++ {
			id := h.InitializeHttpContext()
			action := h.CallOnRequestHeaders(id, [][2]string{{":method", "POST"}, {":path", "/v1/completions"},
				{"content-length", "9223372036854775807"}}, false)
			require.Equal(t, types.ActionContinue, action, "decided at the headers, body streamed")
			ids = append(ids, id)
		}
		l := h.poolLoad("decode")
		assert.Equal(t, int64(8), l.Requests)
		assert.Greater(t, l.Tokens, int64(0), "token sums did not wrap")
		assert.LessOrEqual(t, l.Tokens, int64(8*routing.MaxRequestBytes), "each estimate is bounded")
		for i := 0; i < 30; i++ {
			id, _ := h.send(post("/v1/completions", `{"prompt":"q"}`, [2]string{"x-request-id", strings.Repeat("r", i+1)}))
			dest, _ := h.header(id, "x-gateway-destination-endpoint")
			require.True(t, strings.HasPrefix(dest, "10.0.0."), dest)
			ids = append(ids, id)
		}
		assert.Greater(t, h.poolLoad("decode").Tokens, int64(0))
		for _, id := range ids {
			h.respond(id, 200)
		}
		assert.Equal(t, routing.Load{}, h.poolLoad("decode"))
	})
}
