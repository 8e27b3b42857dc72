package main

import (
	"encoding/binary"
	"fmt"
	"math/rand"
	"testing"

	"github.com/kvroute/kvroute/internal/shareddata"
	"github.com/kvroute/kvroute/routing"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var activeGauges = []string{
	"kvroute_target_active_requests.10_0_0_1_8000.rank_0",
	"kvroute_target_active_requests.10_0_0_2_8000.rank_0",
	"kvroute_target_active_requests.10_0_0_3_8000.rank_0",
}

func (h *host) activeByGauge() (total int64, per []int64) {
	for _, g := range activeGauges {
		per = append(per, h.gauge(g))
	}
	return h.gauge("kvroute_active_requests"), per
}

func TestGaugesDefinedAtStart(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, dpFleet)
		for _, g := range []string{
			"kvroute_active_requests",
			"kvroute_target_active_requests.10_0_0_1_8000.rank_0",
			"kvroute_target_active_requests.10_0_0_1_8000.rank_1",
			"kvroute_target_active_requests.10_0_0_2_8000.rank_1",
			"kvroute_target_active_requests.10_0_0_3_8000.rank_0",
		} {
			assert.Equal(t, int64(0), h.gauge(g), g)
		}
		for _, c := range []string{"kvroute_requests_routed", "kvroute_decision_sticky", "kvroute_decision_overflow",
			"kvroute_decision_new_conversation", "kvroute_decision_continuation", "kvroute_decision_prefix",
			"kvroute_decision_load", "kvroute_decision_fallback", "kvroute_pd_disaggregated", "kvroute_pd_direct",
			"kvroute_pd_prefill_failures", "kvroute_parse_errors", "kvroute_state_conflicts",
			"kvroute_endpoint_ejections", "kvroute_fail_open"} {
			assert.Equal(t, uint64(0), h.counter(c), c)
		}
	})
}

// Every way a stream can end hands its load back exactly once.
func TestLoadReleasedExactlyOnceOnEveryEnding(t *testing.T) {
	endings := map[string]func(h *host, id uint32){
		"completed": func(h *host, id uint32) { h.respond(id, 200) },
		"streamed SSE": func(h *host, id uint32) {
			h.CallOnResponseHeaders(id, [][2]string{{":status", "200"}, {"content-type", "text/event-stream"}}, false)
			h.CallOnResponseBody(id, []byte("data: {}\n\n"), false)
			h.CallOnResponseBody(id, []byte("data: [DONE]\n\n"), true)
			h.CompleteHttpContext(id)
		},
		"reset before any response": func(h *host, id uint32) { h.CompleteHttpContext(id) },
		"local reply":               func(h *host, id uint32) { h.respond(id, 503) },
		"upstream timeout":          func(h *host, id uint32) { h.respond(id, 504) },
		"client gone mid-response": func(h *host, id uint32) {
			h.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
			h.CompleteHttpContext(id)
		},
	}
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		for name, end := range endings {
			t.Run(name, func(t *testing.T) {
				h := startHost(t, vm, threeEndpoints)
				var ids []uint32
				for i := 0; i < 6; i++ {
					id, _ := h.send(post("/v1/chat/completions", chat(fmt.Sprint("q", i)), [2]string{"x-session-id", fmt.Sprint(name, i%4)}))
					ids = append(ids, id)
				}
				total, per := h.activeByGauge()
				assert.Equal(t, int64(6), total, name)
				assert.Equal(t, int64(6), per[0]+per[1]+per[2], name)
				for _, id := range ids {
					end(h, id)
				}
				total, per = h.activeByGauge()
				assert.Equal(t, int64(0), total, name)
				assert.Equal(t, []int64{0, 0, 0}, per, name)
			})
		}
		t.Run("client gone while the body buffers", func(t *testing.T) {
			// A client that leaves while the body is still buffering took no load.
			h := startHost(t, vm, threeEndpoints)
			id := h.InitializeHttpContext()
			h.CallOnRequestHeaders(id, [][2]string{{":method", "POST"}, {":path", "/v1/completions"}}, false)
			h.CallOnRequestBody(id, []byte(`{"prompt":`), false)
			h.CompleteHttpContext(id)
			total, _ := h.activeByGauge()
			assert.Equal(t, int64(0), total)
			assert.Equal(t, uint64(0), h.counter("kvroute_requests_routed"))
		})
	})
}

func TestStickyOverflowsAtCapAndKeepsMapping(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"balance":{"fair_share_multiplier":1.0},"pools":{"decode":{"endpoints":[
			{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"},{"address":"10.0.0.3:8000"}]}}}`)
		var kinds, dests []string
		var ids []uint32
		for i := 0; i < 7; i++ {
			id, _ := h.send(post("/v1/chat/completions", chat(fmt.Sprint("turn", i)), [2]string{"x-session-id", "pinned"}))
			d, _ := h.header(id, "x-kvroute-decision")
			dest, _ := h.header(id, "x-gateway-destination-endpoint")
			kinds, dests = append(kinds, d), append(dests, dest)
			ids = append(ids, id)
		}
		// The worked sequence of routing.TestCapSequenceMultiplierOne.
		assert.Equal(t, []string{"new-conversation", "overflow", "overflow", "sticky", "overflow", "overflow", "sticky"}, kinds)
		assert.Equal(t, dests[0], dests[3])
		assert.Equal(t, dests[0], dests[6])
		assert.NotEqual(t, dests[0], dests[1])
		for _, id := range ids {
			h.respond(id, 200)
		}
		// With the load gone, the conversation is back on its mapping.
		dest, _, decision := h.route(post("/v1/chat/completions", chat("later"), [2]string{"x-session-id", "pinned"}))
		assert.Equal(t, "sticky", decision)
		assert.Equal(t, dests[0], dest)
		assert.Equal(t, uint64(4), h.counter("kvroute_decision_overflow"))
	})
}

func TestLeastLoadedFirstTurnInFilter(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"conversation":{"first_turn":"least_loaded"},"balance":{"fair_share_multiplier":100},
			"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"},{"address":"10.0.0.3:8000"}]}}}`)
		// Pin three long requests of one conversation onto its target.
		var held []uint32
		first := ""
		for i := 0; i < 3; i++ {
			id, _ := h.send(post("/v1/chat/completions", chat("long"), [2]string{"x-session-id", "heavy"}))
			d, _ := h.header(id, "x-gateway-destination-endpoint")
			if first == "" {
				first = d
			}
			require.Equal(t, first, d)
			held = append(held, id)
		}
		for i := 0; i < 12; i++ {
			dest, _, dec := h.route(post("/v1/chat/completions", chat("hi"), [2]string{"x-session-id", fmt.Sprint("new", i)}))
			assert.Equal(t, "new-conversation", dec)
			assert.NotEqual(t, first, dest)
		}
		for _, id := range held {
			h.respond(id, 200)
		}
	})
}

func TestPassiveHealthEjectsAndRecovers(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"health":{"failure_threshold":3,"cooldown_ms":300},"pools":{"decode":{"endpoints":[
			{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"}]}}}`)
		id, _ := h.send(post("/v1/chat/completions", chat("x"), [2]string{"x-session-id", "s"}))
		bad, _ := h.header(id, "x-gateway-destination-endpoint")
		h.respond(id, 503)
		for i := 0; i < 2; i++ {
			id, _ := h.send(post("/v1/chat/completions", chat("x"), [2]string{"x-session-id", "s"}))
			d, _ := h.header(id, "x-gateway-destination-endpoint")
			dec, _ := h.header(id, "x-kvroute-decision")
			require.Equal(t, "sticky", dec)
			require.Equal(t, bad, d)
			h.respond(id, 502)
		}
		assert.Equal(t, uint64(1), h.counter("kvroute_endpoint_ejections"))
		// Ejected: the conversation is placed afresh and new traffic avoids it.
		d, _, dec := h.route(post("/v1/chat/completions", chat("x"), [2]string{"x-session-id", "s"}))
		assert.Equal(t, "new-conversation", dec)
		assert.NotEqual(t, bad, d)
		for i := 0; i < 10; i++ {
			d, _, _ := h.route(post("/v1/completions", fmt.Sprintf(`{"prompt":"p%d"}`, i)))
			assert.NotEqual(t, bad, d)
		}
		h.advance(350)
		seen := map[string]bool{}
		for i := 0; i < 20; i++ {
			d, _, _ := h.route(post("/v1/completions", fmt.Sprintf(`{"prompt":"p%d"}`, i)))
			seen[d] = true
		}
		assert.True(t, seen[bad], "back in rotation after the cooldown")
	})
}

// Health is per endpoint: the failures of one DP rank eject the whole endpoint, every
// rank of it, and the other endpoint's ranks all stay in use.
func TestAnEjectionTakesEveryRankOfTheEndpoint(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"health":{"failure_threshold":3,"cooldown_ms":60000},"pools":{"decode":{"endpoints":[
			{"address":"10.0.0.1:8000","dp_size":2},{"address":"10.0.0.2:8000","dp_size":2}]}}}`)
		var bad string
		for i := 0; i < 3; i++ {
			id, _ := h.send(post("/v1/chat/completions", chat("x"), [2]string{"x-session-id", "s"}))
			d, _ := h.header(id, "x-gateway-destination-endpoint")
			require.True(t, bad == "" || d == bad, "the conversation sticks until the ejection")
			bad = d
			h.respond(id, 503)
		}
		require.Equal(t, uint64(1), h.counter("kvroute_endpoint_ejections"))
		ranks := map[string]bool{}
		for i := 0; i < 20; i++ {
			d, rank, _ := h.route(post("/v1/completions", fmt.Sprintf(`{"prompt":"p%d"}`, i)))
			assert.NotEqual(t, bad, d, "no rank of the ejected endpoint takes a request")
			ranks[rank] = true
		}
		assert.Equal(t, map[string]bool{"0": true, "1": true}, ranks, "both ranks of the other endpoint do")
	})
}

func TestUpstreamConnectFailureCountsAgainstTarget(t *testing.T) {
	flags := make([]byte, 8)
	binary.LittleEndian.PutUint64(flags, 0x20) // UpstreamConnectionFailure
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"health":{"failure_threshold":2,"failure_statuses":[]},"pools":{"decode":{"endpoints":[
			{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"}]}}}`)
		require.NoError(t, h.SetProperty([]string{"response", "flags"}, flags))
		for i := 0; i < 2; i++ {
			id, _ := h.send(post("/v1/chat/completions", chat("x"), [2]string{"x-session-id", "s"}))
			h.CompleteHttpContext(id) // reset before any response
		}
		assert.Equal(t, uint64(1), h.counter("kvroute_endpoint_ejections"))
	})
}

func TestTickSweepsExpiredLoad(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"state":{"lease_ms":1000},"pools":{"decode":{"endpoints":[
			{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"},{"address":"10.0.0.3:8000"}]}}}`)
		assert.Equal(t, uint32(100), h.GetTickPeriod())
		for i := 0; i < 4; i++ {
			h.send(post("/v1/completions", fmt.Sprintf(`{"prompt":"lost %d"}`, i))) // never completed
		}
		total, _ := h.activeByGauge()
		require.Equal(t, int64(4), total)
		h.advance(1300) // past the lease and its last slot
		h.Tick()
		total, per := h.activeByGauge()
		assert.Equal(t, int64(0), total)
		assert.Equal(t, []int64{0, 0, 0}, per)
	})
}

func TestTrustedClientRankInFilter(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		t.Run("trusted", func(t *testing.T) {
			h := startHost(t, vm, `{"trust_client_dp_rank":true,"pools":{"decode":{"endpoints":[
			{"address":"10.0.0.1:8000","dp_size":4},{"address":"10.0.0.2:8000","dp_size":2}]}}}`)
			for i := 0; i < 10; i++ {
				_, rank, _ := h.route(post("/v1/completions", fmt.Sprintf(`{"prompt":"r%d"}`, i), [2]string{"x-data-parallel-rank", "3"}))
				assert.Equal(t, "3", rank)
			}
		})
		// Untrusted (default): the client's rank is stripped and ignored.
		t.Run("untrusted", func(t *testing.T) {
			h2 := startHost(t, vm, `{"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":4}]}}}`)
			ranks := map[string]bool{}
			for i := 0; i < 20; i++ {
				_, rank, _ := h2.route(post("/v1/completions", fmt.Sprintf(`{"prompt":"r%d"}`, i), [2]string{"x-data-parallel-rank", "3"}))
				ranks[rank] = true
			}
			assert.Greater(t, len(ranks), 1)
		})
	})
}

func TestDecisionTimeHistogramIsRecorded(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		_, err := h.GetHistogramMetric("kvroute_decision_time_us")
		require.NoError(t, err, "defined at start")
		h.route(post("/v1/chat/completions", chat("hello")))
		// The emulator keeps the last recorded value. In wazero the monotonic clock
		// moves 1 ms a reading, so the first decision (the one of its run that is
		// timed) records at least that; the Go plugin's decision may take under 1 µs of
		// real time, so there only the histogram's presence is certain.
		v, err := h.GetHistogramMetric("kvroute_decision_time_us")
		require.NoError(t, err)
		if h.wasm {
			assert.GreaterOrEqual(t, v, uint64(1000), "the first decision was timed")
		}
	})
}

// Another VM's load reaches this VM's decisions on the tick: the tick writes this VM's
// batch and reads what the others wrote. Here the other VM is played by the test,
// writing into the shared ledger directly; every anonymous request then avoids the
// target it loaded.
func TestTickBringsOtherVMsLoad(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"}]}}}`)
		id, _ := h.send(post("/v1/chat/completions", chat("first")))
		h.respond(id, 200)
		now := goClock
		if h.wasm {
			now = 1640995200000 + 1_000 // wazero's fake epoch, plus the readings so far
		}
		other := routing.NewLoadLedger(shareddata.Store{}, "kvroute", "decode", 600000, 8)
		busy := routing.TargetID("10.0.0.1:8000", 0)
		for i := 0; i < 20; i++ {
			_, err := other.Acquire(busy, 1000, now)
			require.NoError(t, err)
		}
		require.NoError(t, other.Flush(now))
		h.Tick()
		for i := 0; i < 10; i++ {
			id, _ := h.send(post("/v1/chat/completions", chat(fmt.Sprint("request ", i))))
			dest, _ := h.header(id, "x-gateway-destination-endpoint")
			assert.Equal(t, "10.0.0.2:8000", dest, "request %d: the other VM's load is seen", i)
			h.respond(id, 200)
		}
		assert.Equal(t, int64(20), h.poolLoad("decode").Requests, "this VM's releases never touch the other VM's load")
	})
}

// A plugin retired by a reconfiguration hands over, at its end, what was waiting for
// a tick: its batch of load changes (else it would count until the lease expired) and
// its request counts.
func TestPluginDoneWritesTheBatch(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"}]}}}`)
		for i := 0; i < 3; i++ {
			id, _ := h.send(post("/v1/chat/completions", chat(fmt.Sprint("done ", i))))
			h.respond(id, 200)
		}
		for i := 0; i < 2; i++ { // still running when the plugin ends
			h.send(post("/v1/chat/completions", chat(fmt.Sprint("open ", i))))
		}
		shared := func() int64 {
			now := goClock
			if h.wasm {
				now = 1640995200000 + 1_000
			}
			snap, err := routing.NewLoadLedger(shareddata.Store{}, "kvroute", "decode", 600000, 8).Snapshot(now)
			require.NoError(t, err)
			var n int64
			for _, l := range snap {
				n += l.Requests
			}
			return n
		}
		assert.Equal(t, int64(0), shared(), "no tick yet: the batch is still the VM's")
		h.FinishVM()
		assert.Equal(t, int64(2), shared(), "written at the plugin's end")
		routed, err := h.GetCounterMetric("kvroute_requests_routed")
		require.NoError(t, err)
		assert.Equal(t, uint64(5), routed)
	})
}

// One decision in decisionTimeEvery is timed, the first of each run of them: the
// histogram's record is a host call the other decisions are spared.
func TestDecisionTimeIsSampled(t *testing.T) {
	var m metrics
	var timed []int
	for i := 1; i <= 3*decisionTimeEvery; i++ {
		if m.timeDecision() {
			timed = append(timed, i)
		}
	}
	assert.Equal(t, []int{1, 1 + decisionTimeEvery, 1 + 2*decisionTimeEvery}, timed)
}

// TestTheCapTightensWhileATargetWithFullSlotsHasStalledInFilter: one endpoint, three
// ranks computing 10 tokens a ms. Ranks 0 and 1 each run 16 requests past their first
// chunk, rank 2 has one with 3000 tokens queued: the cap is 24, the fair share 12. A
// small prompt costs least on rank 0 or 1. Once one more request on rank 1 has waited
// ten times its prefill, rank 1 has stalled with 16 running, the cap is the fair
// share, ranks 0 and 1 are past it, and the prompt goes to rank 2. A rank stalled
// running 15, or rank 2 stalled with its one request, leaves the cap as it is.
func TestTheCapTightensWhileATargetWithFullSlotsHasStalledInFilter(t *testing.T) {
	const cfg = `{"trust_client_dp_rank":true,
		"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":3}]}}}`
	cases := []struct {
		name     string
		running1 int    // requests running on rank 1
		stalled  string // "": none
	}{
		{"nothing stalled", 16, ""},
		{"rank 1 stalled running 16", 16, "1"},
		{"rank 1 stalled running 15", 15, "1"},
		{"rank 2 stalled with one request", 16, "2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(44))
				for _, rank := range []string{"0", "1", "2"} {
					computeOn(t, h, prose(rng, 4000), rank, 100)
				}
				var open []uint32
				if c.stalled == "2" {
					open = append(open, openOn(t, h, prose(rng, 12000), "2", false))
					h.advance(3000)
				}
				for rank, running := range []int{16, c.running1} {
					for i := 0; i < running; i++ {
						id := openOn(t, h, prose(rng, 400), fmt.Sprint(rank), false)
						open = append(open, id)
						h.advance(10)
						h.firstChunk(id)
					}
				}
				if c.stalled == "1" {
					open = append(open, openOn(t, h, prose(rng, 400), "1", false))
				}
				h.advance(100)
				if c.stalled != "2" {
					open = append(open, openOn(t, h, prose(rng, 12000), "2", false))
				}
				h.advance(1)
				id, _ := h.send(post("/v1/completions", completionBody(prose(rng, 400))))
				rank, _ := h.header(id, "x-data-parallel-rank")
				decision, _ := h.header(id, "x-kvroute-decision")
				h.stream(id)
				for _, id := range append(open, id) {
					h.endStream(id)
				}
				if c.stalled == "1" && c.running1 >= 16 {
					assert.Equal(t, "2", rank, "ranks 0 and 1 are past the fair share")
					assert.Equal(t, "load", decision)
					return
				}
				assert.NotEqual(t, "2", rank, "the cap stays at twice the fair share")
			})
		})
	}
}
