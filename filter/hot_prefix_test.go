package main

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAPrefixIsCopiedWhenItsDemandOutrunsItsHolderInFilter: a document (8000 tokens)
// is computed on rank 0 of four in 200 ms (40 tokens a ms). Then twelve requests on
// the document, each with 1000 tokens of its own, are sent: 5 ms apart, left in
// prefill, they bring rank 0 far more than it computes, and the document is copied
// to other ranks from the burst's first requests on, while rank 0's queue is still
// well under what its copy is worth. A second apart, each answered before the next,
// they all stay on rank 0; so does a burst when rank 0 took 5 s for the document.
func TestAPrefixIsCopiedWhenItsDemandOutrunsItsHolderInFilter(t *testing.T) {
	const cfg = `{"trust_client_dp_rank":true,"balance":{"fair_share_multiplier":100},
		"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":4}]}}}`
	for _, tc := range []struct {
		name     string
		docMS    int // the time the document took to compute
		gapMS    int
		answered bool
		copied   bool
	}{
		{"a burst", 200, 5, false, true},
		{"a second apart", 200, 1000, true, false},
		// At 5000 ms a copy takes longer than the demand was measured over.
		{"a burst on a prefix slow to copy", 5000, 5, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(41))
				doc := prose(rng, 32000)
				// send sends body and returns its stream, rank and decision.
				send := func(body string, headers ...[2]string) (id uint32, rank, decision string) {
					id, action := h.send(post("/v1/completions", completionBody(body), headers...))
					require.Equal(t, types.ActionContinue, action)
					rank, _ = h.header(id, "x-data-parallel-rank")
					decision, _ = h.header(id, "x-kvroute-decision")
					h.CallOnResponseHeaders(id, [][2]string{{":status", "200"}, {"content-type", "text/event-stream"}}, false)
					return id, rank, decision
				}
				answer := func(id uint32) {
					h.CallOnResponseBody(id, []byte("data: {}\n\n"), false)
					h.CallOnResponseBody(id, []byte("data: [DONE]\n\n"), true)
					h.CompleteHttpContext(id)
				}
				id, rank, _ := send(doc, [2]string{"x-data-parallel-rank", "0"})
				require.Equal(t, "0", rank)
				h.advance(tc.docMS)
				answer(id)
				ranks := map[string]int{}
				firstCopy := 0
				var open []uint32
				for i := 1; i <= 12; i++ {
					h.advance(tc.gapMS)
					id, rank, decision := send(doc + prose(rng, 4000))
					ranks[rank]++
					if rank != "0" && firstCopy == 0 {
						firstCopy = i
						assert.Equal(t, "load", decision, "the copy goes where the document is not")
					} else if rank == "0" {
						assert.True(t, strings.HasPrefix(decision, "continuation"), decision)
					}
					if tc.answered {
						h.advance(30)
						answer(id)
					} else {
						open = append(open, id)
					}
				}
				for _, id := range open {
					answer(id)
				}
				if !tc.copied {
					assert.Equal(t, map[string]int{"0": 12}, ranks)
					return
				}
				assert.Greater(t, len(ranks), 1, "ranks used: %v", ranks)
				assert.LessOrEqual(t, firstCopy, 6, "copied from the burst's first requests on")
				assert.Greater(t, ranks["0"], 1, "the holder keeps taking its share")
			})
		})
	}
}

// TestEveryReplicaCopiesAPrefixOntoTheSameTargetsInFilter: three gateway replicas,
// which share nothing, each see a burst on the same document over eight ranks (each
// computed it first on a rank of its own). All copy it onto the four ranks the
// document's hash ranks first, so their copies land on the same few ranks.
func TestEveryReplicaCopiesAPrefixOntoTheSameTargetsInFilter(t *testing.T) {
	const cfg = `{"trust_client_dp_rank":true,"balance":{"fair_share_multiplier":100},
		"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":8}]}}}`
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		rng := rand.New(rand.NewSource(42))
		doc := prose(rng, 32000)
		copies := map[string]bool{}
		for _, firstRank := range []string{"0", "5", "2"} {
			t.Run("first on rank "+firstRank, func(t *testing.T) {
				h := startHost(t, vm, cfg)
				id, _ := h.send(post("/v1/completions", completionBody(doc), [2]string{"x-data-parallel-rank", firstRank}))
				h.CallOnResponseHeaders(id, [][2]string{{":status", "200"}, {"content-type", "text/event-stream"}}, false)
				h.advance(200)
				h.CallOnResponseBody(id, []byte("data: {}\n\n"), false)
				h.CallOnResponseBody(id, []byte("data: [DONE]\n\n"), true)
				h.CompleteHttpContext(id)
				var open []uint32
				for i := 0; i < 16; i++ {
					h.advance(5)
					id, _ := h.send(post("/v1/completions", completionBody(doc+prose(rng, 4000)),
						[2]string{"x-request-id", fmt.Sprintf("replica-%s-%d", firstRank, i)}))
					rank, _ := h.header(id, "x-data-parallel-rank")
					if rank != firstRank {
						copies[rank] = true
					}
					h.CallOnResponseHeaders(id, [][2]string{{":status", "200"}, {"content-type", "text/event-stream"}}, false)
					open = append(open, id)
				}
				for _, id := range open {
					h.CallOnResponseBody(id, []byte("data: [DONE]\n\n"), true)
					h.CompleteHttpContext(id)
				}
			})
		}
		assert.NotEmpty(t, copies)
		assert.LessOrEqual(t, len(copies), 4, "the replicas' copies: %v", copies)
	})
}

// TestCopiesByDemandStopBeforeTheEntryFillsInALargePoolInFilter: a burst far beyond
// what any number of holders keeps up with is copied until it has 4 holders over 8
// ranks, as many as its index entry names, and 3 over 16, since a full entry counts
// as held on every rank and the burst would then spread over all 16.
func TestCopiesByDemandStopBeforeTheEntryFillsInALargePoolInFilter(t *testing.T) {
	for _, tc := range []struct{ ranks, holders int }{{8, 4}, {16, 3}} {
		t.Run(fmt.Sprint(tc.ranks), func(t *testing.T) {
			cfg := fmt.Sprintf(`{"trust_client_dp_rank":true,"balance":{"fair_share_multiplier":100},
				"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":%d}]}}}`, tc.ranks)
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(43))
				doc := prose(rng, 32000)
				id, _ := h.send(post("/v1/completions", completionBody(doc), [2]string{"x-data-parallel-rank", "0"}))
				h.CallOnResponseHeaders(id, [][2]string{{":status", "200"}, {"content-type", "text/event-stream"}}, false)
				h.advance(200)
				h.CallOnResponseBody(id, []byte("data: {}\n\n"), false)
				h.CallOnResponseBody(id, []byte("data: [DONE]\n\n"), true)
				h.CompleteHttpContext(id)
				ranks := map[string]bool{}
				var open []uint32
				for i := 0; i < 40; i++ {
					h.advance(2)
					id, _ := h.send(post("/v1/completions", completionBody(doc+prose(rng, 4000)),
						[2]string{"x-request-id", fmt.Sprintf("burst-%d", i)}))
					rank, _ := h.header(id, "x-data-parallel-rank")
					ranks[rank] = true
					h.CallOnResponseHeaders(id, [][2]string{{":status", "200"}, {"content-type", "text/event-stream"}}, false)
					open = append(open, id)
				}
				for _, id := range open {
					h.CallOnResponseBody(id, []byte("data: [DONE]\n\n"), true)
					h.CompleteHttpContext(id)
				}
				assert.Len(t, ranks, tc.holders, "ranks used: %v", ranks)
			})
		})
	}
}
