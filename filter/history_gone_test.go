package main

import (
	"math/rand"
	"strconv"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestATurnWhoseHistoryTurnedOverLeavesAQueueInFilter: with a cache of 20000 tokens a
// rank, a 2000-token system prompt computed on each of three ranks and a
// conversation's first turn, 500 tokens more, on rank 0; then other work on rank 0
// after the system prompt, and 1000 tokens left queued there. After 10000 tokens of
// that work the history is still there, worth more than the queue, and the second
// turn stays; after 18000 it is gone, rank 0 caches no more of the turn than the
// other ranks do, and the turn goes where nothing is queued.
func TestATurnWhoseHistoryTurnedOverLeavesAQueueInFilter(t *testing.T) {
	const cfg = `{"trust_client_dp_rank":true,"prefix":{"target_cache_tokens":20000},
		"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":3}]}}}`
	for _, tc := range []struct {
		written  int // tokens computed on rank 0 after the first turn
		decision string
	}{{10000, "sticky"}, {18000, "overflow"}} {
		t.Run(strconv.Itoa(tc.written), func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(31))
				system := prose(rng, 8000)
				for _, rank := range []string{"0", "1", "2"} {
					computeOn(t, h, system+prose(rng, 200), rank, 100)
				}
				conv := [2]string{"x-session-id", "c"}
				first := system + prose(rng, 2000)
				id, _ := h.send(post("/v1/completions", completionBody(first), conv, [2]string{"x-data-parallel-rank", "0"}))
				decision, _ := h.header(id, "x-kvroute-decision")
				require.Equal(t, "new-conversation", decision)
				h.stream(id)
				h.advance(100)
				h.firstChunk(id)
				h.endStream(id)
				computeOn(t, h, system+prose(rng, 4*tc.written), "0", 100)
				queued := openOn(t, h, prose(rng, 4000), "0", false)
				id, _ = h.send(post("/v1/completions", completionBody(first+prose(rng, 400)), conv))
				decision, _ = h.header(id, "x-kvroute-decision")
				rank, _ := h.header(id, "x-data-parallel-rank")
				assert.Equal(t, tc.decision, decision)
				assert.Equal(t, tc.decision == "sticky", rank == "0", "rank %s", rank)
				h.stream(id)
				for _, s := range []uint32{id, queued} {
					h.firstChunk(s)
					h.endStream(s)
				}
			})
		})
	}
}

// TestATurnFollowsItsHistoryToWhereItsLastTurnOverflowedInFilter: a conversation
// begun on rank 0, its second turn sent elsewhere by 40000 tokens queued there; with
// that queue ended and 1000 tokens queued on rank 0 again, the third turn goes where
// the second went, which caches more of it than rank 0 does.
func TestATurnFollowsItsHistoryToWhereItsLastTurnOverflowedInFilter(t *testing.T) {
	const cfg = `{"trust_client_dp_rank":true,"prefix":{"target_cache_tokens":1000000},
		"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":3}]}}}`
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, cfg)
		rng := rand.New(rand.NewSource(32))
		system := prose(rng, 8000)
		for _, rank := range []string{"0", "1", "2"} {
			computeOn(t, h, system+prose(rng, 200), rank, 100)
		}
		conv := [2]string{"x-session-id", "c"}
		turn := func(text string, headers ...[2]string) (rank, decision string) {
			id, _ := h.send(post("/v1/completions", completionBody(text), append(headers, conv)...))
			decision, _ = h.header(id, "x-kvroute-decision")
			rank, _ = h.header(id, "x-data-parallel-rank")
			h.stream(id)
			h.advance(100)
			h.firstChunk(id)
			h.endStream(id)
			return rank, decision
		}
		first := system + prose(rng, 2000)
		_, decision := turn(first, [2]string{"x-data-parallel-rank", "0"})
		require.Equal(t, "new-conversation", decision)
		long := openOn(t, h, prose(rng, 160000), "0", false)
		second := first + prose(rng, 4000)
		moved, decision := turn(second)
		require.Equal(t, "overflow", decision)
		require.NotEqual(t, "0", moved)
		h.firstChunk(long)
		h.endStream(long)
		queued := openOn(t, h, prose(rng, 4000), "0", false)
		rank, decision := turn(second + prose(rng, 400))
		assert.Equal(t, "overflow", decision)
		assert.Equal(t, moved, rank)
		h.firstChunk(queued)
		h.endStream(queued)
	})
}
