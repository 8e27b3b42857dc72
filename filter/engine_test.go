package main

import (
	"fmt"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func vllmPage(running, waiting int) string {
	return fmt.Sprintf(`# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} %d.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} %d.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
`, running, waiting)
}

const engineFleet = `{"engine_metrics":{"enabled":true,"interval_ms":100,"stale_ms":5000},"pools":{"decode":{"endpoints":[
	{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"},{"address":"10.0.0.3:8000"}]}}}`

// scrapes returns the scrape callouts sent since the last call, by endpoint (the
// emulator keeps every callout of a context, answered or not).
func (h *host) scrapes() map[string]proxytest.HttpCalloutAttribute {
	all := h.GetCalloutAttributesFromContext(proxytest.PluginContextID)
	out := map[string]proxytest.HttpCalloutAttribute{}
	for _, c := range all[h.scrapesSeen:] {
		out[headerOf(c.Headers, "x-gateway-destination-endpoint")] = c
	}
	h.scrapesSeen = len(all)
	return out
}

func TestEngineMetricsSteerAwayFromBusyEngines(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, engineFleet)
		h.Tick()
		sc := h.scrapes()
		require.Len(t, sc, 3, "one scrape per endpoint")
		for addr, c := range sc {
			assert.Equal(t, "kvroute_metrics", c.Upstream)
			assert.Equal(t, "GET", headerOf(c.Headers, ":method"))
			assert.Equal(t, "/metrics", headerOf(c.Headers, ":path"))
			page := vllmPage(0, 0)
			if addr == "10.0.0.1:8000" {
				page = vllmPage(25, 15) // busy with another gateway's traffic
			}
			h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}}, nil, []byte(page))
		}
		for i := 0; i < 20; i++ {
			dest, _, _ := h.route(post("/v1/completions", fmt.Sprintf(`{"prompt":"q%d"}`, i)))
			assert.NotEqual(t, "10.0.0.1:8000", dest)
		}
	})
}

func TestFailedScrapesAffectNoRequest(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, engineFleet)
		h.Tick()
		for _, c := range h.scrapes() {
			h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "503"}}, nil, []byte("down"))
		}
		h.scrapes()
		h.advance(200)
		h.Tick()
		for _, c := range h.scrapes() {
			h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}}, nil, []byte("not prometheus {{{"))
		}
		seen := map[string]bool{}
		for i := 0; i < 30; i++ {
			dest, _, _ := h.route(post("/v1/completions", fmt.Sprintf(`{"prompt":"q%d"}`, i)))
			seen[dest] = true
		}
		assert.Len(t, seen, 3)
		assert.Equal(t, uint64(0), h.counter("kvroute_fail_open"))
	})
}

func TestNoScrapesWhenDisabled(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		h.Tick()
		assert.Empty(t, h.scrapes())
	})
}
