package main

import (
	"fmt"
	"math/rand"
	"strconv"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// conversationOnRank0 starts a host of one endpoint with three trusted ranks and a
// cache of cache tokens a rank, computes a 2000-token system prompt on each rank, and
// begins conversation c on rank 0 with a first turn 500 tokens longer. turn sends a
// turn of c (with headers), streams it to its end 100 ms later, and says where it
// went and why.
func conversationOnRank0(t *testing.T, vm types.VMContext, cache int, seed int64) (h *host, rng *rand.Rand, system, first string, turn func(text string, headers ...[2]string) (rank, decision string)) {
	h = startHost(t, vm, fmt.Sprintf(`{"trust_client_dp_rank":true,"prefix":{"target_cache_tokens":%d},
		"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":3}]}}}`, cache))
	rng = rand.New(rand.NewSource(seed))
	system = prose(rng, 8000)
	for _, rank := range []string{"0", "1", "2"} {
		computeOn(t, h, system+prose(rng, 200), rank, 100)
	}
	conv := [2]string{"x-session-id", "c"}
	turn = func(text string, headers ...[2]string) (rank, decision string) {
		id, _ := h.send(post("/v1/completions", completionBody(text), append(headers, conv)...))
		decision, _ = h.header(id, "x-kvroute-decision")
		rank, _ = h.header(id, "x-data-parallel-rank")
		h.stream(id)
		h.advance(100)
		h.firstChunk(id)
		h.endStream(id)
		return rank, decision
	}
	first = system + prose(rng, 2000)
	_, decision := turn(first, [2]string{"x-data-parallel-rank", "0"})
	require.Equal(t, "new-conversation", decision)
	return h, rng, system, first, turn
}

// TestATurnWhoseHistoryTurnedOverLeavesAQueueInFilter: with a cache of 20000 tokens a
// rank, a 2000-token system prompt computed on each of three ranks and a
// conversation's first turn, 500 tokens more, on rank 0; then other work on rank 0
// after the system prompt, and 1000 tokens left queued there. After 10000 tokens of
// that work the history is still there, worth more than the queue, and the second
// turn stays; after 18000 it is gone, rank 0 caches no more of the turn than the
// other ranks do, and the turn goes where nothing is queued.
func TestATurnWhoseHistoryTurnedOverLeavesAQueueInFilter(t *testing.T) {
	for _, tc := range []struct {
		written  int // tokens computed on rank 0 after the first turn
		decision string
	}{{10000, "sticky"}, {18000, "overflow"}} {
		t.Run(strconv.Itoa(tc.written), func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h, rng, system, first, turn := conversationOnRank0(t, vm, 20000, 31)
				computeOn(t, h, system+prose(rng, 4*tc.written), "0", 100)
				queued := openOn(t, h, prose(rng, 4000), "0", false)
				rank, decision := turn(first + prose(rng, 400))
				assert.Equal(t, tc.decision, decision)
				assert.Equal(t, tc.decision == "sticky", rank == "0", "rank %s", rank)
				h.firstChunk(queued)
				h.endStream(queued)
			})
		})
	}
}

// TestATurnFollowsItsHistoryToWhereItsLastTurnOverflowedInFilter: a conversation
// begun on rank 0, its second turn sent elsewhere by 40000 tokens queued there; with
// that queue ended and 1000 tokens queued on rank 0 again, the third turn goes where
// the second went, which caches more of it than rank 0 does.
func TestATurnFollowsItsHistoryToWhereItsLastTurnOverflowedInFilter(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h, rng, _, first, turn := conversationOnRank0(t, vm, 1000000, 32)
		long := openOn(t, h, prose(rng, 160000), "0", false)
		second := first + prose(rng, 4000)
		moved, decision := turn(second)
		require.Equal(t, "overflow", decision)
		require.NotEqual(t, "0", moved)
		h.advance(2000) // its prefill, at the rate the ranks have shown
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
