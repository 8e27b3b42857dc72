package main

import (
	"math/rand"
	"strconv"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFirstResponseChunkEndsTheQueuedPrefill: a request's prefill counts as queued on
// its target until the first chunk of its response body, not its response headers
// (a streamed response sends those before the first token). A second request whose
// first half (4000 tokens) opens the first one's 16000-token prompt avoids that
// target while the first is in prefill, and goes there for its cache once the first
// chunk is back.
func TestFirstResponseChunkEndsTheQueuedPrefillInFilter(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		for _, chunk := range []bool{false, true} {
			t.Run("chunk="+strconv.FormatBool(chunk), func(t *testing.T) {
				h := startHost(t, vm, threeEndpoints)
				rng := rand.New(rand.NewSource(8))
				doc := prose(rng, 64000) // 16000 tokens
				a, _ := h.send(post("/v1/completions", completionBody(doc)))
				home, _ := h.header(a, "x-gateway-destination-endpoint")
				h.CallOnResponseHeaders(a, [][2]string{{":status", "200"}, {"content-type", "text/event-stream"}}, false)
				if chunk {
					h.CallOnResponseBody(a, []byte("data: {}\n\n"), false)
				}
				b, _ := h.send(post("/v1/completions", completionBody(doc[:16000]+prose(rng, 16000))))
				dest, _ := h.header(b, "x-gateway-destination-endpoint")
				dec, _ := h.header(b, "x-kvroute-decision")
				if chunk {
					assert.Equal(t, home, dest, "the prefill is over: the cache there wins")
					assert.Equal(t, "prefix", dec)
				} else {
					assert.NotEqual(t, home, dest, "16000 tokens still queued there")
					assert.Equal(t, "load", dec)
				}
				h.respond(b, 200)
				h.CallOnResponseBody(a, []byte("data: [DONE]\n\n"), true)
				h.CompleteHttpContext(a)
				h.advance(200) // a tick writes the batch
				h.Tick()
				assert.Equal(t, int64(0), h.gauge("kvroute_active_requests"), "every request's load is released")
			})
		}
	})
}

// TestAPrefillEstimatedOverNoLongerRepelsInFilter: a target learns its prefill rate
// from the first chunks that come back, and counts a queued prefill as done once that
// rate says so, before its first chunk. A 4000-token document's prefill teaches its
// target the rate; a 20000-token prompt on the document (16000 tokens new) then
// queues there. A request sharing the document (half of its 8000 tokens) goes
// elsewhere while the 16000 tokens are ahead there, and to the document's target once
// they are estimated done: with nothing ahead there, its cost is 5 × 4000 + the
// decode load 8000 = 28000 against 4 × 8000 = 32000 elsewhere.
func TestAPrefillEstimatedOverNoLongerRepelsInFilter(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		for _, wait := range []bool{false, true} {
			t.Run("wait="+strconv.FormatBool(wait), func(t *testing.T) {
				h := startHost(t, vm, threeEndpoints)
				rng := rand.New(rand.NewSource(9))
				doc := prose(rng, 16000) // 4000 tokens
				a0, _ := h.send(post("/v1/completions", completionBody(doc)))
				home, _ := h.header(a0, "x-gateway-destination-endpoint")
				h.CallOnResponseHeaders(a0, [][2]string{{":status", "200"}, {"content-type", "text/event-stream"}}, false)
				h.advance(100)
				h.CallOnResponseBody(a0, []byte("data: {}\n\n"), false)
				h.CallOnResponseBody(a0, []byte("data: [DONE]\n\n"), true)
				h.CompleteHttpContext(a0)

				a, _ := h.send(post("/v1/completions", completionBody(doc+prose(rng, 64000))))
				dest, _ := h.header(a, "x-gateway-destination-endpoint")
				assert.Equal(t, home, dest, "the document's target computes the least")
				h.CallOnResponseHeaders(a, [][2]string{{":status", "200"}, {"content-type", "text/event-stream"}}, false)
				if wait {
					// At the rate of a0's prefill, 16000 tokens take 400 ms; past
					// twice that the target would count as stalled.
					h.advance(600)
				}
				b, _ := h.send(post("/v1/completions", completionBody(doc+prose(rng, 16000))))
				dest, _ = h.header(b, "x-gateway-destination-endpoint")
				if wait {
					assert.Equal(t, home, dest, "the queued prefill is estimated over")
				} else {
					assert.NotEqual(t, home, dest, "16000 tokens ahead there")
				}
				h.respond(b, 200)
				h.CallOnResponseBody(a, []byte("data: [DONE]\n\n"), true)
				h.CompleteHttpContext(a)
				h.advance(200)
				h.Tick()
				assert.Equal(t, int64(0), h.gauge("kvroute_active_requests"), "every request's load is released")
			})
		}
	})
}

// TestATargetWithoutARateIsEstimatedAtItsPeersInFilter: a target that has not returned
// a first chunk yet is estimated at the rate its peers have shown. Rank 0 shows its
// rate (4000 tokens in 100 ms: 40 a ms), then 48000 tokens are queued on rank 0 and
// 32000 on rank 1, which has no rate of its own. 900 ms later rank 0 has about 12000
// left and rank 1, at rank 0's rate, none: a new 4000-token prompt goes to rank 1
// (with all of rank 1's queue counted as ahead it would go to rank 0).
func TestATargetWithoutARateIsEstimatedAtItsPeersInFilter(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"trust_client_dp_rank":true,"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":2}]}}}`)
		rng := rand.New(rand.NewSource(25))
		open := func(chars int, rank string) uint32 {
			id, _ := h.send(post("/v1/completions", completionBody(prose(rng, chars)), [2]string{"x-data-parallel-rank", rank}))
			got, _ := h.header(id, "x-data-parallel-rank")
			require.Equal(t, rank, got)
			h.CallOnResponseHeaders(id, [][2]string{{":status", "200"}, {"content-type", "text/event-stream"}}, false)
			return id
		}
		end := func(id uint32) {
			h.CallOnResponseBody(id, []byte("data: [DONE]\n\n"), true)
			h.CompleteHttpContext(id)
		}
		first := open(16000, "0")
		h.advance(100)
		h.CallOnResponseBody(first, []byte("data: {}\n\n"), false)
		end(first)
		long0, long1 := open(192000, "0"), open(128000, "1")
		h.advance(900)
		id, _ := h.send(post("/v1/completions", completionBody(prose(rng, 16000))))
		rank, _ := h.header(id, "x-data-parallel-rank")
		assert.Equal(t, "1", rank, "rank 1's queue is estimated done at rank 0's rate")
		h.respond(id, 200)
		end(long0)
		end(long1)
		h.advance(200)
		h.Tick()
		assert.Equal(t, int64(0), h.gauge("kvroute_active_requests"), "every request's load is released")
	})
}

// TestAPromptGoesWhereItsPrefillEndsSoonestAtEachRanksRate: rank 0 computes 4000 tokens
// in two seconds, rank 1 in one; rank 1 then runs a reply, rank 0 none. A new prompt
// of 10 000 tokens that neither caches is computed sooner on rank 1 and goes there;
// counted in tokens alone, the two would cost the same but for rank 1's reply, and
// it would go to rank 0.
func TestAPromptGoesWhereItsPrefillEndsSoonestAtEachRanksRate(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"trust_client_dp_rank":true,"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":2}]}}}`)
		rng := rand.New(rand.NewSource(26))
		computeChatOn(h, prose(rng, 16000), "0", 2000)
		computeChatOn(h, prose(rng, 16000), "1", 1000)
		reply := decodingOn(h, prose(rng, 100), "1")
		_, rank, decision := h.route(post("/v1/chat/completions", chat(prose(rng, 40000))))
		assert.Equal(t, "1", rank, decision)
		h.endStream(reply)
	})
}

// TestARankWithoutARateIsTakenAtItsServersRateInFilter: 10.0.0.1 runs ranks 0 and 1,
// 10.0.0.2 rank 2. Rank 1 computes 4000 tokens in a second, rank 2 in two; rank 0 has
// shown no rate and has 30 000 tokens queued, rank 1 100 000. A prompt of 10 000
// tokens goes to rank 0, taken at its server's rate (rank 1's): there its queue and
// its prefill end before rank 2 computes it. At the pool's rate it would cost more
// than on rank 2.
func TestARankWithoutARateIsTakenAtItsServersRateInFilter(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"trust_client_dp_rank":true,"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":2},{"address":"10.0.0.2:8000","dp_rank_start":2}]}}}`)
		rng := rand.New(rand.NewSource(27))
		computeChatOn(h, prose(rng, 16000), "1", 1000)
		computeChatOn(h, prose(rng, 16000), "2", 2000)
		var queued []uint32
		for _, q := range []struct {
			rank  string
			chars int
		}{{"1", 400000}, {"0", 120000}} {
			id, _ := h.send(post("/v1/chat/completions", chat(prose(rng, q.chars)), [2]string{"x-data-parallel-rank", q.rank}))
			h.stream(id)
			queued = append(queued, id)
		}
		_, rank, decision := h.route(post("/v1/chat/completions", chat(prose(rng, 40000))))
		assert.Equal(t, "0", rank, decision)
		for _, id := range queued {
			h.endStream(id)
		}
	})
}
