package main

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/routing"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Fault injection through the host: prefill callouts that never answer, answer twice
// or answer after the client left, and ticks that stop. Every request still completes
// with a target, and every ledger returns to zero.
//
// Shared-data errors (get/set failures, CAS conflicts) cannot be injected through the
// SDK host emulator when the filter runs as compiled wasm; they are injected one layer
// down, through the routing.Store interface internal/shareddata implements, in
// routing/fault_store_test.go.

// inlineModes are the P/D modes in which the filter dispatches the prefill itself.
var inlineModes = []string{"vllm", "trtllm", "sglang"}

// prefillOK is a successful prefill answer of each inline protocol.
var prefillOK = map[string]string{
	"vllm":   `{"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[1],"remote_host":"10.0.2.1","remote_port":5600}}`,
	"trtllm": `{"choices":[{"index":0,"finish_reason":"length","disaggregated_params":{"request_type":"context_only","ctx_request_id":1}}]}`,
	"sglang": `{"choices":[]}`,
}

// sendPD sends a request long enough to be disaggregated and returns its context and
// prefill callout.
func (h *host) sendPD(mode string, i int) (uint32, uint32) {
	id, action := h.send(post("/v1/chat/completions", longChat(50+i, ""), [2]string{"x-request-id", fmt.Sprint("pd-", i)}))
	if mode == "sglang" {
		require.Equal(h.t, types.ActionContinue, action, "sglang: the decode leg goes at once")
	} else {
		require.Equal(h.t, types.ActionPause, action, "%s: the decode leg waits for the prefill", mode)
	}
	dest, ok := h.header(id, "x-gateway-destination-endpoint")
	require.True(h.t, ok)
	require.True(h.t, strings.HasPrefix(dest, "10.0.1."), dest)
	return id, h.onlyCallout(id).CalloutID
}

func TestFaultPrefillCalloutNeverAnswers(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		for _, mode := range inlineModes {
			t.Run(mode, func(t *testing.T) {
				h := startHost(t, vm, pdFleet(mode, 10))
				lost, _ := h.sendPD(mode, 1)
				other, otherCall := h.sendPD(mode, 2)
				assert.Equal(t, int64(2), h.poolLoad("prefill").Requests)
				// The callout never answers; Envoy's stream timeout (or the client)
				// ends the request while the filter still waits.
				h.CompleteHttpContext(lost)
				assert.Equal(t, int64(1), h.poolLoad("prefill").Requests, "only the lost request's prefill load is released")
				assert.Equal(t, int64(1), h.poolLoad("decode").Requests)
				// The other request is untouched and completes normally.
				h.CallOnHttpCallResponse(otherCall, [][2]string{{":status", "200"}}, nil, []byte(prefillOK[mode]))
				assert.Equal(t, types.ActionContinue, h.GetCurrentHttpStreamAction(other))
				h.respond(other, 200)
				assert.Equal(t, routing.Load{}, h.poolLoad("prefill"))
				assert.Equal(t, routing.Load{}, h.poolLoad("decode"))
				assert.Equal(t, uint64(0), h.counter("kvroute_fail_open"))
			})
		}
	})
}

func TestFaultPrefillCalloutAnsweredTwice(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		for _, mode := range inlineModes {
			t.Run(mode, func(t *testing.T) {
				h := startHost(t, vm, pdFleet(mode, 10))
				first, call := h.sendPD(mode, 1)
				second, secondCall := h.sendPD(mode, 2)
				h.CallOnHttpCallResponse(call, [][2]string{{":status", "200"}}, nil, []byte(prefillOK[mode]))
				assert.Equal(t, types.ActionContinue, h.GetCurrentHttpStreamAction(first))
				require.Equal(t, int64(1), h.poolLoad("prefill").Requests, "the second request's prefill is still running")
				// A second answer to the same callout: the SDK forgets a callout once
				// it answered, and refuses the repeat (it panics in the host-side
				// dispatch, before any filter code runs). Either way the filter must
				// not release again: that would take the second request's load.
				refused := func() (refused bool) {
					defer func() { refused = recover() != nil }()
					h.CallOnHttpCallResponse(call, [][2]string{{":status", "200"}}, nil, []byte(prefillOK[mode]))
					return false
				}()
				t.Logf("second answer refused by the SDK: %v", refused)
				assert.Equal(t, int64(1), h.poolLoad("prefill").Requests)
				// The first stream ends; its prefill was released once, at the answer.
				h.respond(first, 200)
				assert.Equal(t, int64(1), h.poolLoad("prefill").Requests, "stream end after the answer releases nothing more")
				// A timeout (no headers) for the second, then its stream ends.
				h.CallOnHttpCallResponse(secondCall, nil, nil, nil)
				assert.Equal(t, types.ActionContinue, h.GetCurrentHttpStreamAction(second))
				assert.Equal(t, routing.Load{}, h.poolLoad("prefill"))
				h.respond(second, 200)
				assert.Equal(t, routing.Load{}, h.poolLoad("prefill"))
				assert.Equal(t, routing.Load{}, h.poolLoad("decode"))
				assert.Equal(t, uint64(0), h.counter("kvroute_fail_open"))
			})
		}
	})
}

func TestFaultPrefillAnswerAfterClientLeft(t *testing.T) {
	answers := map[string][][2]string{
		"2xx":     {{":status", "200"}},
		"4xx":     {{":status", "400"}},
		"5xx":     {{":status", "503"}},
		"timeout": nil,
	}
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		for _, mode := range inlineModes {
			for name, headers := range answers {
				t.Run(mode+"/"+name, func(t *testing.T) {
					h := startHost(t, vm, pdFleet(mode, 10))
					gone, call := h.sendPD(mode, 1)
					stays, staysCall := h.sendPD(mode, 2)
					h.CompleteHttpContext(gone)
					assert.Equal(t, int64(1), h.poolLoad("prefill").Requests)
					body := prefillOK[mode]
					if mode == "trtllm" && name == "2xx" {
						// A finished context phase: the filter would answer the client.
						body = `{"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hi"}}]}`
					}
					h.CallOnHttpCallResponse(call, headers, nil, []byte(body))
					assert.Nil(t, h.GetSentLocalResponse(gone), "nothing is sent to a client that left")
					assert.Equal(t, int64(1), h.poolLoad("prefill").Requests, "the late answer releases nothing")
					assert.Equal(t, int64(1), h.poolLoad("decode").Requests)
					h.CallOnHttpCallResponse(staysCall, [][2]string{{":status", "200"}}, nil, []byte(prefillOK[mode]))
					h.respond(stays, 200)
					assert.Equal(t, routing.Load{}, h.poolLoad("prefill"))
					assert.Equal(t, routing.Load{}, h.poolLoad("decode"))
					assert.Equal(t, uint64(0), h.counter("kvroute_fail_open"))
				})
			}
		}
	})
}

// Ticks that stop: the host never calls OnTick. Nothing on the request path waits
// for a tick — decisions, releases and health all work — so every request still
// routes and the ledger and gauges return to zero. (What the tick adds, the sweep of
// leases that expired, is covered by TestTickSweepsExpiredLoad.)
func TestFaultTicksStop(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"health":{"failure_threshold":2,"cooldown_ms":50},"pools":{"decode":{"endpoints":[
			{"address":"10.0.0.1:8000","dp_size":2},{"address":"10.0.0.2:8000"},{"address":"10.0.0.3:8000"}]}}}`)
		require.NotZero(t, h.GetTickPeriod(), "the filter asked for a tick; the host never gives one")
		rng := rand.New(rand.NewSource(3))
		var open []uint32
		const n = 300
		for i := 0; i < n; i++ {
			var hs [][2]string
			if rng.Intn(2) == 0 {
				hs = append(hs, [2]string{"x-session-id", fmt.Sprint("s", rng.Intn(20))})
			}
			id, action := h.send(post("/v1/chat/completions", chat(fmt.Sprint("q", rng.Intn(50))), hs...))
			require.Equal(t, types.ActionContinue, action)
			dest, _ := h.header(id, "x-gateway-destination-endpoint")
			require.Contains(t, []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}, dest)
			open = append(open, id)
			for len(open) > 0 && rng.Intn(2) == 0 {
				k := rng.Intn(len(open))
				switch rng.Intn(4) {
				case 0:
					h.CompleteHttpContext(open[k]) // the client left
				case 1:
					h.respond(open[k], 503)
				default:
					h.respond(open[k], 200)
				}
				open = append(open[:k], open[k+1:]...)
			}
		}
		for _, id := range open {
			h.respond(id, 200)
		}
		assert.Equal(t, uint64(n), h.counter("kvroute_requests_routed"))
		assert.Equal(t, routing.Load{}, h.poolLoad("decode"))
		total, _ := h.activeByGauge()
		assert.Equal(t, int64(0), total)
		assert.Equal(t, uint64(0), h.counter("kvroute_fail_open"))
		assert.Equal(t, uint64(0), h.counter("kvroute_state_conflicts"))
	})
}

// Engine scrapes (a callout per endpoint per interval) that never answer, answer late
// or answer twice: scraping goes on at the next interval (nothing waits for an
// answer), requests route throughout, and nothing is recovered as a fault.
func TestFaultScrapeCalloutsNeverAnswerOrAnswerLate(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, engineFleet)
		h.Tick()
		lost := h.scrapes()
		require.Len(t, lost, 3)
		for i := 0; i < 10; i++ { // nothing answered: requests route by the ledger
			dest, _, _ := h.route(post("/v1/completions", fmt.Sprintf(`{"prompt":"a%d"}`, i)))
			require.True(t, strings.HasPrefix(dest, "10.0.0."), dest)
		}
		h.advance(200)
		h.Tick()
		next := h.scrapes()
		require.Len(t, next, 3, "an unanswered scrape does not stop the next one")
		for addr, c := range next {
			page := vllmPage(0, 0)
			if addr == "10.0.0.1:8000" {
				page = vllmPage(25, 15)
			}
			h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}}, nil, []byte(page))
		}
		// The first round answers late, one of them twice (the SDK refuses a repeat).
		for _, c := range lost {
			h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}}, nil, []byte(vllmPage(1, 1)))
		}
		for _, c := range lost {
			func() {
				defer func() { _ = recover() }()
				h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}}, nil, []byte(vllmPage(1, 1)))
			}()
			break
		}
		for i := 0; i < 10; i++ {
			dest, _, _ := h.route(post("/v1/completions", fmt.Sprintf(`{"prompt":"b%d"}`, i)))
			require.True(t, strings.HasPrefix(dest, "10.0.0."), dest)
		}
		assert.Equal(t, uint64(0), h.counter("kvroute_fail_open"))
		assert.Equal(t, routing.Load{}, h.poolLoad("decode"))
	})
}
