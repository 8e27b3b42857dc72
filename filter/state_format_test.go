package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/routing"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An upgraded filter meeting an old filter's state (docs/behaviour.md, State): shared data
// holds values of a format this build does not know before its first request. Each such
// key is started afresh: routing works from the first request, no old mapping or load is
// read, and the ledger ends at zero. (routing/state_format_test.go checks each key's
// format handling one by one.)
func TestUpgradedFilterMeetsOldState(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"conversation":{"max_sessions":64},"pools":{"decode":{"endpoints":[
			{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"},{"address":"10.0.0.3:8000"}]}}}`)
		old := []byte{0xfe, 'o', 'l', 'd', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
		keys := []string{"kvroute/load/decode", "kvroute/health/decode", "kvroute/rr/decode",
			"kvroute/load/prefill", "kvroute/health/prefill", "kvroute/rr/prefill"}
		for b := 0; b < 64/16; b++ { // ceil(max_sessions/16) buckets, named in base 36
			keys = append(keys, "kvroute/conv/decode/"+strconv.FormatInt(int64(b), 36))
		}
		for _, k := range keys {
			require.NoError(t, proxywasm.SetSharedData(k, old, 0))
		}
		var open []uint32
		for turn := 0; turn < 3; turn++ {
			for c := 0; c < 12; c++ {
				id, action := h.send(post("/v1/chat/completions", chat(fmt.Sprint("turn ", turn)),
					[2]string{"x-session-id", fmt.Sprint("conv-", c)}))
				require.Equal(t, types.ActionContinue, action)
				dest, _ := h.header(id, "x-gateway-destination-endpoint")
				assert.Contains(t, []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}, dest)
				dec, _ := h.header(id, "x-kvroute-decision")
				if turn == 0 {
					assert.Equal(t, "new-conversation", dec, "conv-%d", c)
				} else {
					assert.Equal(t, "sticky", dec, "conv-%d turn %d", c, turn)
				}
				open = append(open, id)
			}
		}
		assert.Equal(t, int64(36), h.poolLoad("decode").Requests, "the old ledger's content is not counted")
		for _, id := range open {
			h.respond(id, 200)
		}
		assert.Equal(t, routing.Load{}, h.poolLoad("decode"))
		assert.Equal(t, uint64(0), h.counter("kvroute_state_conflicts"))
		assert.Equal(t, uint64(0), h.counter("kvroute_fail_open"))
		assert.Equal(t, uint64(12), h.counter("kvroute_decision_new_conversation"))
		// Every decode key the requests touched now holds this build's format.
		for _, k := range keys {
			v, _, err := proxywasm.GetSharedData(k)
			require.NoError(t, err)
			if len(v) > 0 && v[0] != old[0] {
				want := byte(1)
				if strings.HasPrefix(k, "kvroute/load/") {
					want = 8 // the ledger's format, with requests counted in fractions
				}
				assert.Equal(t, want, v[0], k)
			}
		}
		v, _, _ := proxywasm.GetSharedData("kvroute/load/decode")
		// Rewritten fresh: no load, only each target's write clock, prefill progress,
		// recent work, cache, running slots seen and decode stays (id, clock, since,
		// chunk, rate, recent work, cache, slots seen, stays, 0 slots).
		assert.Len(t, v, 1+3*93)
	})
}
