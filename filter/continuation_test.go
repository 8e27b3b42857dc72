package main

import (
	"math/rand"
	"strconv"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
)

// TestATurnEndingBetweenCheckpointsFindsItsHistoryInFilter: a shared prompt of 242
// blocks and a conversation's first turn 9 blocks longer, on rank 0, end below the
// same checkpoint of the index (240, the next is 256); another conversation on the
// shared prompt is on rank 1, and rank 0 has a prompt in prefill. The second turn
// still goes to rank 0: its history's last block is found between the checkpoints.
func TestATurnEndingBetweenCheckpointsFindsItsHistoryInFilter(t *testing.T) {
	const cfg = `{"trust_client_dp_rank":true,"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":4}]}}}`
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, cfg)
		rng := rand.New(rand.NewSource(51))
		shared := prose(rng, 242*64+10)
		first := shared + prose(rng, 9*64)
		computeOn(t, h, first, "0", 100)
		computeOn(t, h, shared+prose(rng, 2000), "1", 100)
		openOn(t, h, prose(rng, 4000), "0", false)
		id, _ := h.send(post("/v1/completions", completionBody(first+prose(rng, 2000))))
		rank, _ := h.header(id, "x-data-parallel-rank")
		decision, _ := h.header(id, "x-kvroute-decision")
		assert.Equal(t, "0", rank)
		assert.Equal(t, "continuation", decision)
	})
}

// TestAHolderAtTheCapIsWeighedBeforeAShorterMatchInFilter: a system prompt and a
// conversation's history are on rank 0 of eight, the system prompt alone on rank 1.
// Rank 0 has 4 requests decoding, every other rank 1: rank 0 is at the fair-share
// cap. The next turn's match on rank 1 is long enough for a continuation, but rank 0
// is weighed first and keeps it: one request over the cap costs less than computing
// the history again. So it does when the history ends between two of the index's
// checkpoints past the system prompt's last one (513 and 60 blocks: the checkpoints
// there are 512 and 576), where the deepest checkpoint matched is held by both ranks.
func TestAHolderAtTheCapIsWeighedBeforeAShorterMatchInFilter(t *testing.T) {
	const cfg = `{"trust_client_dp_rank":true,"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":8}]}}}`
	for _, tc := range []struct {
		name            string
		system, history int // characters: 64 a block
	}{
		{"the history past a checkpoint", 24000, 4000},
		{"the history between checkpoints", 513*64 + 10, 60 * 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(52))
				system, history := prose(rng, tc.system), prose(rng, tc.history)
				computeOn(t, h, system+history, "0", 100)
				computeOn(t, h, system+prose(rng, 400), "1", 100)
				for r := 0; r < 8; r++ {
					n := 1
					if r == 0 {
						n = 4
					}
					for i := 0; i < n; i++ {
						openOn(t, h, prose(rng, 8000), strconv.Itoa(r), true)
					}
				}
				id, _ := h.send(post("/v1/completions", completionBody(system+history+prose(rng, 800))))
				rank, _ := h.header(id, "x-data-parallel-rank")
				decision, _ := h.header(id, "x-kvroute-decision")
				assert.Equal(t, "0", rank)
				assert.Equal(t, "continuation", decision)
			})
		})
	}
}
