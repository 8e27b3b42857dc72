package main

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/routing/prefix"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openOn sends body to rank and leaves it in prefill, or with decoding, past its
// first chunk and decoding; it returns the stream.
func openOn(t *testing.T, h *host, body, rank string, decoding bool) uint32 {
	t.Helper()
	id, _ := h.send(post("/v1/completions", completionBody(body), [2]string{"x-data-parallel-rank", rank}))
	got, _ := h.header(id, "x-data-parallel-rank")
	require.Equal(t, rank, got)
	h.stream(id)
	if decoding {
		h.firstChunk(id)
	}
	return id
}

// computeOn sends body to rank, streams its first chunk ms later and ends it: the
// rank now holds the prompt and has shown its prefill rate.
func computeOn(t *testing.T, h *host, body, rank string, ms int) {
	t.Helper()
	id := openOn(t, h, body, rank, false)
	h.advance(ms)
	h.firstChunk(id)
	h.endStream(id)
}

// routed sends body as a completion and streams it; it returns the stream, and the
// rank and the decision kvroute chose.
func routed(h *host, body string) (id uint32, rank, decision string) {
	id, _ = h.send(post("/v1/completions", completionBody(body)))
	rank, _ = h.header(id, "x-data-parallel-rank")
	decision, _ = h.header(id, "x-kvroute-decision")
	h.stream(id)
	return id, rank, decision
}

// burst sends n requests on doc, gapMS apart, each with a prose of own characters of
// its own and an x-request-id of prefix and its number, and leaves them in prefill.
// It returns their streams and the ranks they went to.
func burst(h *host, rng *rand.Rand, doc string, n, gapMS, own int, prefix string) (ids []uint32, ranks []string) {
	for i := 0; i < n; i++ {
		h.advance(gapMS)
		id, _ := h.send(post("/v1/completions", completionBody(doc+prose(rng, own)),
			[2]string{"x-request-id", fmt.Sprintf("%s-%d", prefix, i)}))
		rank, _ := h.header(id, "x-data-parallel-rank")
		h.stream(id)
		ids, ranks = append(ids, id), append(ranks, rank)
	}
	return ids, ranks
}

// weighCopy sends a request on doc, with open left in prefill, ends them all, and
// asserts where it went: with copied, to another rank than the document's holder
// (rank 0), as a new copy; else to rank 0, as the document's continuation.
func weighCopy(t *testing.T, h *host, rng *rand.Rand, doc string, open []uint32, copied bool) {
	t.Helper()
	id, rank, decision := routed(h, doc+prose(rng, 4000))
	for _, id := range append(open, id) {
		h.endStream(id)
	}
	if !copied {
		assert.Equal(t, "0", rank, "the request stays with the document")
		assert.True(t, strings.HasPrefix(decision, "continuation"), decision)
		return
	}
	assert.NotEqual(t, "0", rank, "the document is copied off its queue")
	assert.Equal(t, "load", decision)
}

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
				computeOn(t, h, doc, "0", tc.docMS)
				ranks := map[string]int{}
				firstCopy := 0
				var open []uint32
				for i := 1; i <= 12; i++ {
					h.advance(tc.gapMS)
					id, action := h.send(post("/v1/completions", completionBody(doc+prose(rng, 4000))))
					require.Equal(t, types.ActionContinue, action)
					rank, _ := h.header(id, "x-data-parallel-rank")
					decision, _ := h.header(id, "x-kvroute-decision")
					h.stream(id)
					ranks[rank]++
					if rank != "0" && firstCopy == 0 {
						firstCopy = i
						assert.Equal(t, "load", decision, "the copy goes where the document is not")
					} else if rank == "0" {
						assert.True(t, strings.HasPrefix(decision, "continuation"), decision)
					}
					if tc.answered {
						h.advance(30)
						h.firstChunk(id)
						h.endStream(id)
					} else {
						open = append(open, id)
					}
				}
				for _, id := range open {
					h.endStream(id)
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

// TestAPrefixQueuedForIsCopiedInFilter: a document (8000 tokens) is computed on rank
// 0 of four in 200 ms (40 tokens a ms). Another prompt is sent to rank 0 and left in
// prefill, and a second request on the document, with 1000 tokens of its own, is sent
// to rank 0 behind it. A third request on the document, too few with the second to
// put it in demand, copies it to another rank while the second waits behind more than
// the document's tokens. With a shorter prompt ahead of the second, with the other
// prompt sent after the second (rank 0 busy, but not with the document), or with a
// long prompt queued on rank 1 too (the ranks' mean queue longer than the document:
// no time to spare for a copy), it stays on rank 0.
func TestAPrefixQueuedForIsCopiedInFilter(t *testing.T) {
	const cfg = `{"trust_client_dp_rank":true,"balance":{"fair_share_multiplier":100},
		"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":4}]}}}`
	for _, tc := range []struct {
		name           string
		otherChars     int  // the other prompt sent to rank 0, in characters
		otherBefore    bool // whether it was sent before the second request
		elsewhereChars int  // a prompt left in prefill on rank 1, in characters
		copied         bool
	}{
		{"queued for behind more than it", 40000, true, 0, true},
		{"queued for behind less than it", 16000, true, 0, false},
		{"busy with another prompt since", 40000, false, 0, false},
		{"a backlogged pool", 40000, true, 120000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(44))
				doc := prose(rng, 32000)
				other := prose(rng, tc.otherChars)
				computeOn(t, h, doc, "0", 200)
				var open []uint32
				if tc.otherBefore {
					open = append(open, openOn(t, h, other, "0", false))
				}
				open = append(open, openOn(t, h, doc+prose(rng, 4000), "0", false))
				if !tc.otherBefore {
					open = append(open, openOn(t, h, other, "0", false))
				}
				if tc.elsewhereChars > 0 {
					open = append(open, openOn(t, h, prose(rng, tc.elsewhereChars), "1", false))
				}
				weighCopy(t, h, rng, doc, open, tc.copied)
			})
		})
	}
}

// TestAStalledHolderHasItsPrefixCopiedInFilter: a document (8000 tokens) is computed
// on rank 0 of four in 200 ms (40 tokens a ms). Then a request on it comes every
// second, with 1000 tokens of its own: too few to put the document in demand. Each
// is answered 30 ms after it is sent and keeps decoding, so rank 0 runs past the
// fair-share cap, which does not outweigh the document's cache there. Then one
// request is not answered: a second later rank 0 has shown none of its prefill (its
// running slots are full), and the next request copies the document to another
// rank. With that request answered it stays on rank 0.
func TestAStalledHolderHasItsPrefixCopiedInFilter(t *testing.T) {
	const cfg = `{"trust_client_dp_rank":true,
		"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":4}]}}}`
	for _, stalled := range []bool{false, true} {
		t.Run(fmt.Sprintf("stalled=%v", stalled), func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(43))
				doc := prose(rng, 32000)
				computeOn(t, h, doc, "0", 200)
				var open []uint32
				for i := 0; i < 13; i++ {
					h.advance(1000)
					id, _ := h.send(post("/v1/completions", completionBody(doc+prose(rng, 4000))))
					rank, _ := h.header(id, "x-data-parallel-rank")
					require.Equal(t, "0", rank, "request %d stays with the document", i)
					h.stream(id)
					if i < 12 || !stalled {
						h.advance(30)
						h.firstChunk(id)
					}
					open = append(open, id)
				}
				h.advance(1000)
				id, rank, decision := routed(h, doc+prose(rng, 4000))
				for _, id := range append(open, id) {
					h.endStream(id)
				}
				if !stalled {
					assert.Equal(t, "0", rank)
					return
				}
				assert.NotEqual(t, "0", rank, "the document is copied off its stalled holder")
				assert.Equal(t, "load", decision)
			})
		})
	}
}

// TestEveryReplicaCopiesAPrefixOntoTheSameTargetsInFilter: three gateway replicas,
// which share nothing, each see a burst on the same document over twice as many ranks
// as an index entry names (each computed it first on a rank of its own). All copy it
// onto the ranks the document's hash ranks first, as many as an entry names, so
// their copies land on the same few ranks.
func TestEveryReplicaCopiesAPrefixOntoTheSameTargetsInFilter(t *testing.T) {
	cfg := fmt.Sprintf(`{"trust_client_dp_rank":true,"balance":{"fair_share_multiplier":100},
		"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":%d}]}}}`, 2*prefix.TargetsPerEntry)
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		rng := rand.New(rand.NewSource(42))
		doc := prose(rng, 32000)
		copies := map[string]bool{}
		for _, firstRank := range []string{"0", "5", "2"} {
			t.Run("first on rank "+firstRank, func(t *testing.T) {
				h := startHost(t, vm, cfg)
				computeOn(t, h, doc, firstRank, 200)
				ids, ranks := burst(h, rng, doc, 16, 5, 4000, "replica-"+firstRank)
				for _, rank := range ranks {
					if rank != firstRank {
						copies[rank] = true
					}
				}
				for _, id := range ids {
					h.endStream(id)
				}
			})
		}
		assert.NotEmpty(t, copies)
		assert.LessOrEqual(t, len(copies), prefix.TargetsPerEntry, "the replicas' copies: %v", copies)
	})
}

// TestCopiesByDemandStopBeforeTheEntryFillsInALargePoolInFilter: a burst far beyond
// what any number of holders keeps up with is copied until it has as many holders as
// its index entry names over twice that many ranks, and one fewer over four times
// that many, since a full entry counts as held on every rank and the burst would
// then spread over all of them.
func TestCopiesByDemandStopBeforeTheEntryFillsInALargePoolInFilter(t *testing.T) {
	const w = prefix.TargetsPerEntry
	for _, tc := range []struct{ ranks, holders int }{{2 * w, w}, {4 * w, w - 1}} {
		t.Run(fmt.Sprint(tc.ranks), func(t *testing.T) {
			cfg := fmt.Sprintf(`{"trust_client_dp_rank":true,"balance":{"fair_share_multiplier":100},
				"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":%d}]}}}`, tc.ranks)
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(43))
				doc := prose(rng, 32000)
				computeOn(t, h, doc, "0", 200)
				ids, ranks := burst(h, rng, doc, 40, 2, 4000, "burst")
				used := map[string]bool{}
				for _, rank := range ranks {
					used[rank] = true
				}
				for _, id := range ids {
					h.endStream(id)
				}
				assert.Len(t, used, tc.holders, "ranks used: %v", used)
			})
		})
	}
}

func TestAPrefixWhoseHoldersSlotBacklogOutlastsACopyIsCopied(t *testing.T) {
	// A document only rank 1 caches. Ten seconds on, a thousand requests whose
	// replies were not streamed (their decode time unknown, so they count no stay;
	// counted as nothing, they would make the stay short) keep the pool's requests
	// short-lived on the whole, so that waiting for one of rank 1's slots costs less
	// than computing the document again. Rank 1 then runs sixteen, seen full, with two
	// more waiting for a slot, and ranks 0 and 2 fifteen each; then `ended` more
	// replies decode there for stayMS each and end. When replies decode for ten
	// seconds, rank 1's slots free one every 625 ms or so, fewer than it has been
	// sent, and its backlog outlasts a copy: a question on the document goes to
	// another rank, where a copy is made. When eight decode for 100 ms, its backlog
	// clears well before a copy is made, and the question stays on the holder. When
	// only two end, after a second, while the other 46 decode on, the stay is longer than
	// the two show, and the document is copied.
	cfg := trustedRanks
	for _, tc := range []struct {
		stayMS, ended int
		holder        bool
	}{{10000, 8, false}, {100, 8, true}, {1000, 2, false}} {
		t.Run(fmt.Sprintf("%d ended after %d ms", tc.ended, tc.stayMS), func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(37))
				doc := prose(rng, 40000)
				computeChatOn(h, doc+prose(rng, 400), "1", 500)
				h.advance(10000)
				held, others := backlogRank1(h, rng, tc.ended, tc.stayMS)
				_, rank, decision := h.route(post("/v1/chat/completions", chat(doc+prose(rng, 400))))
				assert.Equal(t, tc.holder, rank == "1", "rank %s, %s", rank, decision)
				for _, id := range append(held, others...) {
					h.endStream(id)
				}
			})
		})
	}
}

// TestAColdPrefixIsCopiedOntoHalfTheIdleRanksInFilter: in a fresh pool of eight
// ranks, some of them busy with other documents left in prefill, eight requests on a
// document (8000 tokens, 1000 of their own, 20 ms apart) are sent and left in
// prefill. No first chunk has come back anywhere: each finds the document's holders
// still computing it, and copies it onto an idle rank while its holders stay at most
// half of the ranks the other documents leave, rounded up: four of eight, three with
// three ranks busy, two with four or five, one with six; four of sixteen too, the
// eight places a prefix may have being its room there. Rounded down once another
// document has taken an idle rank since the first request: one with four ranks busy
// before and one after. Once a first chunk has timed the pool's rate (20 tokens a
// ms), a second request 200 ms after the first (4000 of the document done) stays with
// the document.
func TestAColdPrefixIsCopiedOntoHalfTheIdleRanksInFilter(t *testing.T) {
	const cfg = `{"trust_client_dp_rank":true,"balance":{"fair_share_multiplier":100},
		"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":%d}]}}}`
	for _, tc := range []struct {
		name     string
		ranks    int
		rated    bool // a short prompt was computed on rank 7 first
		busy     int  // other documents left in prefill on the last ranks first
		later    int  // and on idle ranks after the document's first request
		requests int
		gapMS    int
		holders  int
	}{
		{"a cold pool", 8, false, 0, 0, 8, 20, 4},
		{"three ranks busy", 8, false, 3, 0, 8, 20, 3},
		{"four ranks busy", 8, false, 4, 0, 8, 20, 2},
		{"five ranks busy", 8, false, 5, 0, 8, 20, 2},
		{"six ranks busy", 8, false, 6, 0, 8, 20, 1},
		{"four ranks busy and one since", 8, false, 4, 1, 8, 20, 1},
		{"a cold pool of sixteen", 16, false, 0, 0, 8, 20, 4},
		{"a rate known", 8, true, 0, 0, 2, 200, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, fmt.Sprintf(cfg, tc.ranks))
				rng := rand.New(rand.NewSource(47))
				doc := prose(rng, 32000)
				var open []uint32
				if tc.rated {
					computeOn(t, h, prose(rng, 4000), "7", 50)
				}
				busy := map[string]bool{}
				for i := 0; i < tc.busy; i++ {
					rank := fmt.Sprint(7 - i)
					open = append(open, openOn(t, h, prose(rng, 32000), rank, false))
					busy[rank] = true
				}
				holders := map[string]bool{}
				for i := 0; i < tc.requests; i++ {
					id, rank, decision := routed(h, doc+prose(rng, 4000))
					open = append(open, id)
					assert.False(t, busy[rank], "request %d went behind another document (%s)", i, decision)
					if !holders[rank] && i > 0 {
						assert.Equal(t, "load", decision, "request %d copies the document", i)
					}
					holders[rank] = true
					h.advance(tc.gapMS)
					for r := 7 - tc.busy; i == 0 && len(busy) < tc.busy+tc.later; r-- {
						if rank := fmt.Sprint(r); !holders[rank] {
							open = append(open, openOn(t, h, prose(rng, 32000), rank, false))
							busy[rank] = true
						}
					}
				}
				for _, id := range open {
					h.endStream(id)
				}
				assert.Len(t, holders, tc.holders)
			})
		})
	}
}

// docOnRank0 starts a pool of four trusted ranks without a binding cap and has a
// document of 8000 tokens computed on rank 0 in 200 ms (40 tokens a ms); it returns
// the host, the random source the test goes on with, and the document.
func docOnRank0(t *testing.T, vm types.VMContext, seed int64) (*host, *rand.Rand, string) {
	const cfg = `{"trust_client_dp_rank":true,"balance":{"fair_share_multiplier":100},
		"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":4}]}}}`
	h := startHost(t, vm, cfg)
	rng := rand.New(rand.NewSource(seed))
	doc := prose(rng, 32000)
	computeOn(t, h, doc, "0", 200)
	return h, rng, doc
}

// TestACopyKeepsOffTargetsDrawingMoreThanTheirShareInFilter: a document (8000
// tokens) is computed on rank 0 of four in 200 ms (40 tokens a ms), and short prompts
// are computed on ranks 1–3, 40 on each, one after the other. Then another prompt is
// left in prefill on rank 0 and a request on the document queued behind it: the
// document is queued for, and the next request on it is weighed for a copy. With the
// short prompts sent to every rank alike, it is copied to another rank. With ranks 1–3
// drawing more than the pool's share of requests lately, a copy there would hold up
// what they draw while it computes: the request waits on rank 0 instead.
func TestACopyKeepsOffTargetsDrawingMoreThanTheirShareInFilter(t *testing.T) {
	for _, tc := range []struct {
		name    string
		onRank0 bool // the short prompts go to rank 0 too
		copied  bool
	}{
		{"every rank drawing alike", true, true},
		{"the other ranks drawing more", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h, rng, doc := docOnRank0(t, vm, 48)
				for i := 0; i < 40; i++ {
					for _, rank := range []string{"0", "1", "2", "3"} {
						if rank != "0" || tc.onRank0 {
							computeOn(t, h, prose(rng, 160), rank, 1)
						}
					}
				}
				open := []uint32{openOn(t, h, prose(rng, 40000), "0", false), openOn(t, h, doc+prose(rng, 4000), "0", false)}
				weighCopy(t, h, rng, doc, open, tc.copied)
			})
		})
	}
}

// TestACopyGoesToAFasterTargetDrawingItsShareInFilter: as above, but rank 1 computes
// its short prompts twice as fast as the others and is sent twice as many, and ranks
// 2 and 3 each have a prompt of 4000 tokens in prefill. Rank 1 draws more than the
// pool's mean, but no more than its share at its rate: the document is copied there.
func TestACopyGoesToAFasterTargetDrawingItsShareInFilter(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h, rng, doc := docOnRank0(t, vm, 49)
		for i := 0; i < 40; i++ {
			for _, rank := range []string{"0", "1", "1", "2", "3"} {
				ms := 4
				if rank == "1" {
					ms = 2
				}
				computeOn(t, h, prose(rng, 320), rank, ms)
			}
		}
		open := []uint32{openOn(t, h, prose(rng, 16000), "2", false), openOn(t, h, prose(rng, 16000), "3", false),
			openOn(t, h, prose(rng, 40000), "0", false), openOn(t, h, doc+prose(rng, 4000), "0", false)}
		id, rank, decision := routed(h, doc+prose(rng, 4000))
		for _, id := range append(open, id) {
			h.endStream(id)
		}
		assert.Equal(t, "1", rank, "the document is copied to the faster rank")
		assert.Equal(t, "load", decision)
	})
}

// backlogRank1 runs rank 1 out of its slots (fillRank1) in a pool whose requests are
// short-lived on the whole: first a thousand requests on ranks 0 and 2 whose replies
// were not streamed (their decode time unknown, they count no stay), then ended
// replies that decode there for stayMS, and last a request decided while rank 1 is
// out of slots, which records the sighting. It returns fillRank1's open streams.
func backlogRank1(h *host, rng *rand.Rand, ended, stayMS int) (held, others []uint32) {
	for i := 0; i < 1000; i++ {
		id, _ := h.send(post("/v1/chat/completions", chat("hi"), [2]string{"x-data-parallel-rank", fmt.Sprint(i % 2 * 2)}))
		h.respond(id, 200)
	}
	held, others = fillRank1(h, rng)
	var decoded []uint32
	for i := 0; i < ended; i++ {
		decoded = append(decoded, decodingOn(h, prose(rng, 100), fmt.Sprint(i%2*2)))
	}
	h.advance(stayMS)
	for _, id := range decoded {
		h.endStream(id)
	}
	h.route(post("/v1/chat/completions", chat(prose(rng, 100))))
	return held, others
}

func TestAPrefixWhoseQuestionsComeFasterThanItsHoldersSlotsFreeIsCopied(t *testing.T) {
	// As TestAPrefixWhoseHoldersSlotBacklogOutlastsACopyIsCopied, with a document of
	// 60 000 tokens computed in four seconds and replies that decoded for one: rank
	// 1's slots free about four a second, and at what it was sent over the last
	// minute its backlog would clear before a copy of the document is made elsewhere.
	// Then questions on the document come twenty a second, each to rank 1, whose
	// backlog grows. Once half its slots' worth of requests wait there (the seventh
	// question), the questions of the last second say it is sent faster than its
	// slots free, and the next question makes a copy; a shorter backlog waits for
	// the slots, whatever the pace of the questions.
	for _, tc := range []struct {
		questions int
		copyAt    int // the question sent elsewhere (-1: none)
	}{{8, 6}, {6, -1}} {
		t.Run(fmt.Sprint(tc.questions), func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, trustedRanks)
				rng := rand.New(rand.NewSource(37))
				doc := prose(rng, 240000)
				computeOn(t, h, doc+prose(rng, 400), "1", 4000)
				h.advance(10000)
				held, others := backlogRank1(h, rng, 8, 1000)
				copyAt := -1
				var open []uint32
				for i := 0; i < tc.questions; i++ {
					h.advance(50)
					id, rank, decision := routed(h, doc+prose(rng, 400))
					open = append(open, id)
					if rank != "1" && copyAt < 0 {
						copyAt = i
						assert.Equal(t, "load", decision, "question %d makes a copy", i)
					}
				}
				assert.Equal(t, tc.copyAt, copyAt)
				for _, id := range append(append(held, others...), open...) {
					h.endStream(id)
				}
			})
		})
	}
}

// whileACopyIsComputed runs a case with a copy of a document still computed and one
// with the copy done. Each starts a pool of three trusted ranks, computes a document
// of 60 000 tokens on rank 1 in four seconds, runs busy (its streams left open,
// rank 0 free), sends a copy of the document to rank 0 and, 10 ms later (the copy's
// first chunk back or not), a question on it: the question is a continuation on
// rank 1 while the copy is computed, on rank 0 once it is done.
func whileACopyIsComputed(t *testing.T, seed int64, busy func(h *host, rng *rand.Rand) (open []uint32)) {
	for _, tc := range []struct {
		copyDone bool
		rank     string
	}{{false, "1"}, {true, "0"}} {
		t.Run(fmt.Sprint("copy done ", tc.copyDone), func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, trustedRanks)
				rng := rand.New(rand.NewSource(seed))
				doc := prose(rng, 240000)
				computeOn(t, h, doc+prose(rng, 400), "1", 4000)
				open := busy(h, rng)
				copied := openOn(t, h, doc+prose(rng, 400), "0", false)
				h.advance(10)
				if tc.copyDone {
					h.firstChunk(copied)
				}
				id, rank, decision := routed(h, doc+prose(rng, 400))
				assert.Equal(t, tc.rank, rank, "decided %s", decision)
				assert.Equal(t, "continuation", decision)
				for _, id := range append(append(open, copied), id) {
					h.endStream(id)
				}
			})
		})
	}
}

func TestANewHolderStillComputingTheDocumentKeepsNoQuestionFromHoldersAtTheirSlots(t *testing.T) {
	// Rank 1 is out of running slots with two requests waiting for one
	// (backlogRank1: replies decode for a second, so a slot frees about every 60
	// ms), and rank 0's replies end. The question finds two holders: rank 0, whose
	// queue (the copy) is worth less than the document it caches, and rank 1, at its
	// slots. While the copy's four seconds of prefill are still ahead, the question
	// waits for one of rank 1's slots instead.
	whileACopyIsComputed(t, 41, func(h *host, rng *rand.Rand) (open []uint32) {
		h.advance(10000)
		held, others := backlogRank1(h, rng, 8, 1000)
		for i, id := range others {
			if i%2 == 0 { // rank 0's
				h.endStream(id)
			} else {
				open = append(open, id)
			}
		}
		return append(open, held...)
	})
}

func TestANewHolderStillComputingTheDocumentKeepsNoQuestionFromHoldersAtTheCap(t *testing.T) {
	// As above, with rank 1 at the fair-share cap instead of its slots: ten replies
	// decode there (the cap is 8 with eleven requests in flight on three ranks).
	// While the copy on rank 0 is still computed, the question goes to rank 1 all the
	// same, charged for the cap.
	whileACopyIsComputed(t, 43, func(h *host, rng *rand.Rand) (open []uint32) {
		for i := 0; i < 10; i++ {
			open = append(open, decodingOn(h, prose(rng, 400), "1"))
		}
		return open
	})
}
