package main

import (
	"fmt"
	"math/rand"
	"strconv"
	"testing"

	"github.com/kvroute/kvroute/routing/prefix"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewConversationsGoToTheTargetsThatWorkedLeast(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		rng := rand.New(rand.NewSource(21))
		// A long prompt without an id is computed on one target and done: nothing is
		// queued anywhere, but that target has worked lately and the others have not.
		busy, _, _ := h.route(post("/v1/chat/completions", chat(prose(rng, 8000))))
		var got []string
		for c := 0; c < 4; c++ {
			dest, _, decision := h.route(post("/v1/chat/completions", chat("hi"), [2]string{"x-session-id", fmt.Sprint("q", c)}))
			assert.Equal(t, "new-conversation", decision)
			got = append(got, dest)
		}
		assert.NotContains(t, got, busy)
		assert.NotEqual(t, got[0], got[1], "the cursor still rotates over the quiet ones")
	})
}

func TestStickyTurnOverTheCapStaysWhileItsCacheIsWorthTheWait(t *testing.T) {
	// One endpoint of three ranks, the rank trusted so each request can be put where
	// the test wants it: a system prompt cached on rank 1, a conversation begun on
	// rank 0, and rank 0 at the cap with two long replies decoding. By the cost
	// alone rank 1 (the system prompt, no decode load) looks cheaper; the soft cap
	// keeps the turn home while the charge and the queue are less than its cache.
	cfg := trustedRanks
	for _, tc := range []struct {
		name     string
		queued   int // characters of prompt queued at home, without a first chunk
		decision string
	}{{"nothing queued", 0, "sticky"}, {"a long queue", 160000, "overflow"}} {
		t.Run(tc.name, func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(22))
				system := prose(rng, 16000)
				_, rank, _ := h.route(post("/v1/chat/completions", chat(system+prose(rng, 800)), [2]string{"x-data-parallel-rank", "1"}))
				require.Equal(t, "1", rank)
				conv := [2]string{"x-session-id", "c"}
				first := system + prose(rng, 800)
				_, rank, decision := h.route(post("/v1/chat/completions", chat(first), conv, [2]string{"x-data-parallel-rank", "0"}))
				require.Equal(t, "new-conversation", decision)
				require.Equal(t, "0", rank)
				held := h.decodeOnRank0(rng, 2, 40000)
				if tc.queued > 0 {
					id, _ := h.send(post("/v1/chat/completions", chat(prose(rng, tc.queued)), [2]string{"x-data-parallel-rank", "0"}))
					held = append(held, id)
				}
				_, rank, decision = h.route(post("/v1/chat/completions", chat(first+prose(rng, 400)), conv))
				assert.Equal(t, tc.decision, decision)
				assert.Equal(t, tc.decision == "sticky", rank == "0", "rank %s", rank)
				for _, id := range held {
					h.respond(id, 200)
				}
			})
		})
	}
}

func TestContinuationLeavesAHolderFarOverTheCap(t *testing.T) {
	// One endpoint of three ranks, the rank trusted so the load can be put on rank 0:
	// a 4000-token prompt without an id is computed there, then requests decode there
	// (their prefill over). Its continuation stays while the holder is just at the cap,
	// and is computed elsewhere once the cap's charge outweighs the cached prompt.
	cfg := trustedRanks
	for _, tc := range []struct {
		name     string
		decoding int
		decision string
	}{{"at the cap", 2, "continuation"}, {"far over it", 40, "load"}} {
		t.Run(tc.name, func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(23))
				prompt := prose(rng, 16000)
				_, rank, _ := h.route(post("/v1/chat/completions", chat(prompt), [2]string{"x-data-parallel-rank", "0"}))
				require.Equal(t, "0", rank)
				held := h.decodeOnRank0(rng, tc.decoding, 8000)
				_, rank, decision := h.route(post("/v1/chat/completions", chat(prompt+prose(rng, 400))))
				assert.Equal(t, tc.decision, decision)
				assert.Equal(t, tc.decision == "continuation", rank == "0", "rank %s", rank)
				for _, id := range held {
					h.respond(id, 200)
				}
			})
		})
	}
}

// decodeOnRank0 sends n requests of chars characters of prose to rank 0 and delivers
// their first chunks: their prefill is over, their replies still decoding. It returns
// their ids, for the test to end them.
func (h *host) decodeOnRank0(rng *rand.Rand, n, chars int) []uint32 {
	var held []uint32
	for i := 0; i < n; i++ {
		id, _ := h.send(post("/v1/chat/completions", chat(prose(rng, chars)), [2]string{"x-data-parallel-rank", "0"}))
		h.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
		h.CallOnResponseBody(id, []byte("data: {}\n\n"), false)
		held = append(held, id)
	}
	return held
}

func TestFirstTurnLeavesATargetOutOfRunningSlots(t *testing.T) {
	// One endpoint of three ranks, the rank trusted: a system prompt computed and done
	// on rank 1 (so its rate is known), sixteen streamed replies decoding there, then
	// requests sent there that have had no first chunk a second later, though their
	// prefill is a few tokens. Two of them wait for a running slot: a new conversation
	// that shares the prompt goes elsewhere. One alone may be a slow prompt, and
	// without the sixteen the replies may just not be streamed: the cached prompt keeps
	// the turn. Ranks 0 and 2 were sent as many requests lately, so rank 1 carries no
	// more than its share (a holder over its share running sixteen loses new
	// conversations anyway: TestFirstTurnsLeaveAHolderOverItsShareAtTheSlots), and
	// long enough that neither is idle (TestFirstTurnsCopyOntoAnIdleRank).
	cfg := trustedRanks
	for _, tc := range []struct {
		running, waiting int
		holder           bool
	}{{16, 2, false}, {16, 1, true}, {15, 3, true}} {
		t.Run(fmt.Sprint(tc.running, " running, ", tc.waiting, " waiting"), func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(23))
				system := prose(rng, 16000)
				rank1 := [2]string{"x-data-parallel-rank", "1"}
				computeChatOn(h, system+prose(rng, 800), "1", 100)
				for _, r := range []string{"0", "2"} {
					for i := 0; i < tc.running+tc.waiting; i++ {
						computeChatOn(h, prose(rng, 600), r, 0)
					}
				}
				var held []uint32
				for i := 0; i < tc.running+tc.waiting; i++ {
					id, _ := h.send(post("/v1/chat/completions", chat(prose(rng, 100)), rank1))
					h.stream(id)
					if i < tc.running {
						h.firstChunk(id)
					}
					held = append(held, id)
				}
				h.advance(1000)
				_, rank, decision := h.route(post("/v1/chat/completions", chat(system+prose(rng, 800)), [2]string{"x-session-id", "c"}))
				assert.Equal(t, "new-conversation", decision)
				assert.Equal(t, tc.holder, rank == "1", "rank %s", rank)
				for _, id := range held {
					h.endStream(id)
				}
			})
		})
	}
}

func TestTheRunningSlotsSeen(t *testing.T) {
	// As above, in a pool that has served for ten seconds (ranks 0 and 2 each
	// computed a long prompt, so that every rate is known): sixteen decoding on rank
	// 1 and two waiting for a slot there, seen full by a request. Then two replies
	// end, the two waiting get their slots, and two more sent there start at once:
	// rank 1 is not full now, but runs eighteen, more than the sixteen it was seen
	// full at: a request whose prompt only rank 1 caches goes elsewhere, as the wait
	// for a slot there, with every request sent at once, is long. With fourteen in
	// flight there it takes rank 1. So for new conversations and for requests
	// without an id alike. Ranks 0 and 2 run fifteen each, so that rank 1 stays under
	// the fair-share cap.
	cfg := trustedRanks
	for _, ids := range []bool{true, false} {
		t.Run(fmt.Sprint("conversation ids ", ids), func(t *testing.T) { slotsSeenCase(t, cfg, ids) })
	}
}

func TestASlotWaitInAPoolsFirstSecondCountsThatSecond(t *testing.T) {
	// As TestTheRunningSlotsSeen, but a second after the pool's first request: rank 1,
	// seen full at sixteen, runs eighteen. Its requests in flight were sent over that
	// second, so a request stays about a second there and one of sixteen slots frees
	// every ~70 ms: three slots' wait costs less than computing again the prompt only
	// rank 1 caches, and it keeps the request. Counted as if the sends spanned a
	// half-life, the wait would be some fifty times as long, and the request would
	// leave. Forty short replies have just ended on the other ranks: the decode stay
	// is short, and rank 1's backlog is no reason to copy the prompt.
	cfg := trustedRanks
	for _, ids := range []bool{true, false} {
		t.Run(fmt.Sprint("conversation ids ", ids), func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(23))
				system := systemOnRank1(h, rng)
				for _, r := range []string{"0", "2"} {
					computeChatOn(h, prose(rng, 16800), r, 100)
				}
				held, others := fillRank1(h, rng)
				for i := 0; i < 40; i++ {
					h.endStream(decodingOn(h, prose(rng, 100), fmt.Sprint(i%2*2)))
				}
				h.route(post("/v1/chat/completions", chat(prose(rng, 100)))) // the sighting
				held = rank1RunsEighteen(h, rng, held)
				var headers [][2]string
				if ids {
					headers = append(headers, [2]string{"x-session-id", "a"})
				}
				_, rank, decision := h.route(post("/v1/chat/completions", chat(system+prose(rng, 800)), headers...))
				assert.Equal(t, "1", rank, decision)
				for _, id := range append(held, others...) {
					h.endStream(id)
				}
			})
		})
	}
}

func slotsSeenCase(t *testing.T, cfg string, ids bool) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, cfg)
		rng := rand.New(rand.NewSource(23))
		var systems []string
		for i := 0; i < 3; i++ {
			systems = append(systems, prose(rng, 16000))
			computeChatOn(h, systems[i]+prose(rng, 800), "1", 100)
		}
		for _, r := range []string{"0", "2"} {
			computeChatOn(h, prose(rng, 16800), r, 100)
		}
		h.advance(10000)
		held, others := fillRank1(h, rng)
		newConversation := func(system, session string) string {
			if !ids {
				_, rank, _ := h.route(post("/v1/chat/completions", chat(system+prose(rng, 800))))
				return rank
			}
			_, rank, decision := h.route(post("/v1/chat/completions", chat(system+prose(rng, 800)), [2]string{"x-session-id", session}))
			assert.Equal(t, "new-conversation", decision)
			return rank
		}
		assert.NotEqual(t, "1", newConversation(systems[0], "a"), "full now")
		held = rank1RunsEighteen(h, rng, held)
		h.advance(100)
		assert.NotEqual(t, "1", newConversation(systems[1], "b"), "more in flight than seen full")
		for _, id := range held[14:] {
			h.endStream(id)
		}
		assert.Equal(t, "1", newConversation(systems[2], "c"), "under the count seen")
		for _, id := range append(held[:14], others...) {
			h.endStream(id)
		}
	})
}

func TestATurnLeavesATargetAtTheRunningSlotsSeen(t *testing.T) {
	// A conversation placed on rank 1, which then runs sixteen and has two waiting
	// for a slot, seen full by a request. Its next turn, whose history is short,
	// leaves for a target with room (overflow); with fifteen in flight on rank 1 a
	// turn of another conversation placed there stays.
	cfg := trustedRanks
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, cfg)
		rng := rand.New(rand.NewSource(29))
		rank1 := [2]string{"x-data-parallel-rank", "1"}
		history := map[string]string{}
		turn := func(session string, headers ...[2]string) (rank, decision string) {
			history[session] += prose(rng, 400)
			_, rank, decision = h.route(post("/v1/chat/completions", chat(history[session]),
				append(headers, [2]string{"x-session-id", session})...))
			return rank, decision
		}
		for _, s := range []string{"a", "b"} {
			rank, _ := turn(s, rank1)
			require.Equal(t, "1", rank)
		}
		held, others := fillRank1(h, rng)
		rank, decision := turn("a")
		assert.Equal(t, "overflow", decision)
		assert.NotEqual(t, "1", rank)
		for _, id := range held[15:] {
			h.endStream(id)
		}
		rank, decision = turn("b")
		assert.Equal(t, "sticky", decision, "under the count seen")
		assert.Equal(t, "1", rank)
		for _, id := range append(held[:15], others...) {
			h.endStream(id)
		}
	})
}

// rank1RunsEighteen takes rank 1 as fillRank1 left it (held) past its sighting: two of
// its replies end, its two waiting requests get their first chunks, and two more sent
// there start at once, so it runs eighteen. held[14] and held[15] have ended; the
// rest, and the two new ones, are returned in held's place.
func rank1RunsEighteen(h *host, rng *rand.Rand, held []uint32) []uint32 {
	h.endStream(held[14])
	h.endStream(held[15])
	h.firstChunk(held[16])
	h.firstChunk(held[17])
	return append(append(held[:14:14], held[16:]...), decodingOn(h, prose(rng, 100), "1"), decodingOn(h, prose(rng, 100), "1"))
}

// trustedRanks is one endpoint of three ranks with the rank header trusted: a test
// sends each request to the rank it names.
const trustedRanks = `{"trust_client_dp_rank":true,"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":3}]}}}`

// fillRank1 streams fifteen replies decoding on each of ranks 0 and 2 (others), and
// sixteen decoding on rank 1 with two more sent there still without a first chunk
// (held, in that order), and moves the clock on a second: rank 1 is out of running
// slots.
func fillRank1(h *host, rng *rand.Rand) (held, others []uint32) {
	for i := 0; i < 30; i++ {
		id, _ := h.send(post("/v1/chat/completions", chat(prose(rng, 100)), [2]string{"x-data-parallel-rank", fmt.Sprint(i % 2 * 2)}))
		h.stream(id)
		h.firstChunk(id)
		others = append(others, id)
	}
	for i := 0; i < 18; i++ {
		id, _ := h.send(post("/v1/chat/completions", chat(prose(rng, 100)), [2]string{"x-data-parallel-rank", "1"}))
		h.stream(id)
		if i < 16 {
			h.firstChunk(id)
		}
		held = append(held, id)
	}
	h.advance(1000)
	return held, others
}

func TestAFirstTurnSpreadsRequestsInFlightOnceSlotsBind(t *testing.T) {
	// Rank 1 seen full at sixteen running (fillRank1), then drained: it has worked
	// most lately, and runs none. Rank 0 runs ten, rank 2 fifteen. Once a slot count
	// has been seen, a new conversation whose prompt no rank caches goes where the
	// fewest requests are in flight: rank 1, not the rank that worked least lately.
	cfg := trustedRanks
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, cfg)
		rng := rand.New(rand.NewSource(31))
		held, others := fillRank1(h, rng)
		// A request decided while rank 1 is out of slots records the sighting.
		_, rank, _ := h.route(post("/v1/chat/completions", chat(prose(rng, 100))))
		require.NotEqual(t, "1", rank)
		for _, id := range held {
			h.endStream(id)
		}
		// others alternate between ranks 0 and 2: five of rank 0's fifteen end.
		var left []uint32
		ended := 0
		for i, id := range others {
			if i%2 == 0 && ended < 5 {
				h.endStream(id)
				ended++
				continue
			}
			left = append(left, id)
		}
		h.advance(100)
		_, rank, decision := h.route(post("/v1/chat/completions", chat(prose(rng, 800)), [2]string{"x-session-id", "s"}))
		assert.Equal(t, "new-conversation", decision)
		assert.Equal(t, "1", rank)
		for _, id := range left {
			h.endStream(id)
		}
	})
}

func TestALateTargetRunningFewerThanAnotherIsNotFull(t *testing.T) {
	// As in TestTheRunningSlotsSeen, rank 1 runs sixteen with two late and caches a
	// prompt no other rank does. With rank 0 running seventeen, rank 1 is not at its
	// slot count (the engines of a pool are alike): its late requests are prefill, and
	// a new conversation on the prompt takes rank 1. Without them rank 1 is full.
	cfg := trustedRanks
	for _, busier := range []bool{true, false} {
		t.Run(fmt.Sprint("rank 0 runs more ", busier), func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(37))
				system := prose(rng, 16000)
				computeChatOn(h, system+prose(rng, 800), "1", 100)
				held, others := fillRank1(h, rng)
				if busier {
					for i := 0; i < 2; i++ {
						id, _ := h.send(post("/v1/chat/completions", chat(prose(rng, 100)), [2]string{"x-data-parallel-rank", "0"}))
						h.stream(id)
						h.firstChunk(id)
						others = append(others, id)
					}
				}
				_, rank, decision := h.route(post("/v1/chat/completions", chat(system+prose(rng, 800)), [2]string{"x-session-id", "s"}))
				assert.Equal(t, "new-conversation", decision)
				if busier {
					assert.Equal(t, "1", rank, "late while another runs more")
				} else {
					assert.NotEqual(t, "1", rank, "full")
				}
				for _, id := range append(held, others...) {
					h.endStream(id)
				}
			})
		})
	}
}

// holderOnRank1 starts a host of one endpoint with three trusted ranks: rank 1
// computes a long system prompt and runs running requests past their first chunk,
// ranks 0 and 2 were sent one each, of 10 000 characters: more than half the prompt,
// so neither is idle. It returns where a new conversation on the prompt goes, after
// ending every stream.
func holderOnRank1(t *testing.T, vm types.VMContext, cfg string, seed int64, running int) (rank string) {
	return holderOnRank1Busy(t, vm, cfg, seed, running, false)
}

// holderOnRank1Busy is holderOnRank1; with busy, ranks 0 and 2 are each sent a second
// request as long, so that a halving of the recent work on the way (the compiled
// module's clock moves at every reading, so where the halving falls varies) leaves
// neither idle.
func holderOnRank1Busy(t *testing.T, vm types.VMContext, cfg string, seed int64, running int, busy bool) (rank string) {
	h := startHost(t, vm, cfg)
	rng := rand.New(rand.NewSource(seed))
	system := systemOnRank1(h, rng)
	for _, r := range []string{"0", "2"} {
		computeChatOn(h, prose(rng, 10000), r, 0)
		if busy {
			computeChatOn(h, prose(rng, 10000), r, 0)
		}
	}
	var held []uint32
	for i := 0; i < running; i++ {
		held = append(held, decodingOn(h, prose(rng, 100), "1"))
	}
	h.advance(1000)
	rank = newConversationOn(t, h, rng, system)
	for _, id := range held {
		h.endStream(id)
	}
	return rank
}

// computeChatOn sends a chat of content to rank, and ends it with its first chunk ms
// later.
func computeChatOn(h *host, content, rank string, ms int) {
	id, _ := h.send(post("/v1/chat/completions", chat(content), [2]string{"x-data-parallel-rank", rank}))
	h.stream(id)
	h.advance(ms)
	h.firstChunk(id)
	h.endStream(id)
}

// decodingOn sends a chat of content on rank and streams it past its first chunk: the
// reply is decoding there until the stream it returns ends.
func decodingOn(h *host, content, rank string) uint32 {
	id, _ := h.send(post("/v1/chat/completions", chat(content), [2]string{"x-data-parallel-rank", rank}))
	h.stream(id)
	h.firstChunk(id)
	return id
}

// systemOnRank1 computes a system prompt of 16 000 characters, with a question of 800,
// on rank 1 in 100 ms, and returns the system prompt.
func systemOnRank1(h *host, rng *rand.Rand) string {
	system := prose(rng, 16000)
	computeChatOn(h, system+prose(rng, 800), "1", 100)
	return system
}

// newConversationOn sends the first turn of a conversation on system and returns the
// rank it went to.
func newConversationOn(t *testing.T, h *host, rng *rand.Rand, system string) (rank string) {
	t.Helper()
	_, rank, decision := h.route(post("/v1/chat/completions", chat(system+prose(rng, 800)), [2]string{"x-session-id", "s"}))
	assert.Equal(t, "new-conversation", decision)
	return rank
}

func TestFirstTurnsLeaveAHolderOverItsShareAtTheSlots(t *testing.T) {
	// A new conversation on rank 1's prompt stays there while rank 1 runs fifteen, and
	// computes the prompt again on another rank at sixteen, as many as an engine is
	// taken to have running slots: rank 1 carries more than its share of the pool's
	// requests, and its conversations' later turns would wait there for slots.
	cfg := trustedRanks
	for _, running := range []int{15, 16} {
		t.Run(fmt.Sprint("running ", running), func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				rank := holderOnRank1Busy(t, vm, cfg, 43, running, true)
				assert.Equal(t, running < 16, rank == "1", "rank %s", rank)
			})
		})
	}
}

func TestFirstTurnsLeaveASlowHolderAtItsShareByCount(t *testing.T) {
	// Rank 0 computed a long system prompt with a question in slow ms, ranks 1 and 2 a
	// document of the same length in 5 s each, all at once. Rank 0 was then sent 15
	// short chats, the others 4 each: rank 0's 16 requests are under two thirds of the
	// 26, its share with one more holder, and its recent work over a quarter of its
	// stated cache. At a tenth slower a new conversation on the prompt stays on rank
	// 0; at twice as slow its requests count for more than that share, and the prompt
	// is computed again elsewhere. (The wasm runs on a clock of its own, which moves
	// at every reading: the short chats add little to the rates, and the counts keep
	// their order if the first requests' halve.)
	cfg := `{"trust_client_dp_rank":true,"prefix":{"target_cache_tokens":8000},"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":3}]}}}`
	for _, tc := range []struct {
		slow int
		held bool
	}{{5500, true}, {10000, false}} {
		t.Run(fmt.Sprint("rank 0 in ", tc.slow, " ms"), func(t *testing.T) {
			bothFreshVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(89))
				system := prose(rng, 16000)
				var ids []uint32
				for r, p := range []string{system + prose(rng, 800), prose(rng, 16800), prose(rng, 16800)} {
					id, _ := h.send(post("/v1/chat/completions", chat(p), [2]string{"x-data-parallel-rank", fmt.Sprint(r)}))
					h.stream(id)
					ids = append(ids, id)
				}
				h.advance(5000)
				for _, id := range ids[1:] {
					h.firstChunk(id)
					h.endStream(id)
				}
				h.advance(tc.slow - 5000)
				h.firstChunk(ids[0])
				h.endStream(ids[0])
				for r, n := range []int{15, 4, 4} {
					for i := 0; i < n; i++ {
						computeChatOn(h, prose(rng, 40), fmt.Sprint(r), 1)
					}
				}
				h.advance(1000)
				rank := newConversationOn(t, h, rng, system)
				assert.Equal(t, tc.held, rank == "0", "rank %s", rank)
			})
		})
	}
}

func TestFirstTurnsLeaveAHolderThatTurnsItsCacheOver(t *testing.T) {
	// Rank 1 runs four, few for its running slots, and has written about 4 300 tokens
	// lately; with a stated cache of 16 384 tokens that is over a quarter of it, and its
	// conversations' histories would be evicted before their next turns, so a new
	// conversation computes the prompt on another rank. With 20 480 it stays. (The
	// recent work halved between the writes and the turn would be under a quarter:
	// the wasm runs on a clock of its own.)
	for _, cache := range []int{16384, 20480} {
		t.Run(fmt.Sprint("cache ", cache), func(t *testing.T) {
			cfg := fmt.Sprintf(`{"trust_client_dp_rank":true,"prefix":{"target_cache_tokens":%d},`+
				`"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":3}]}}}`, cache)
			bothFreshVMs(t, func(t *testing.T, vm types.VMContext) {
				rank := holderOnRank1(t, vm, cfg, 47, 4)
				assert.Equal(t, cache > 16384, rank == "1", "rank %s", rank)
			})
		})
	}
}

func TestFirstTurnsLeaveAHolderThatLosesHistories(t *testing.T) {
	// Rank 1 computes a long system prompt, then documents whose continuations come
	// back in the whole prompt's time: copies gone that the 1 000 000 tokens stated
	// should have kept. After three, its learned cache is a tenth below the stated
	// one, and it is evicting its conversations' histories already: a new
	// conversation on its prompt is computed on another rank, though rank 1 carries
	// no more than its share with one more holder (7 requests against 3 on each
	// other rank), runs none and has written little. After two it stays.
	cfg := `{"trust_client_dp_rank":true,"prefix":{"target_cache_tokens":1000000},` +
		`"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":3}]}}}`
	for _, gone := range []int{2, 3} {
		t.Run(fmt.Sprint(gone, " copies gone"), func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(59))
				system := systemOnRank1(h, rng)
				for i := 0; i < gone; i++ {
					doc := prose(rng, 32000)
					computeOn(t, h, doc, "1", 200)
					computeOn(t, h, doc+prose(rng, 4000), "1", 225)
				}
				for _, r := range []string{"0", "2"} {
					for i := 0; i < 3; i++ {
						computeOn(t, h, prose(rng, 400), r, 5)
					}
				}
				h.advance(1000)
				rank := newConversationOn(t, h, rng, system)
				assert.Equal(t, gone < 3, rank == "1", "rank %s", rank)
			})
		})
	}
}

func TestFirstTurnsCopyOntoAnIdleRank(t *testing.T) {
	// Rank 1 computes a long system prompt and runs four; it has written about 4 300
	// tokens lately, over a quarter of a stated cache of 16 384 tokens and over an
	// eighth of 32 768. Rank 0 was sent five prompts of about 600 tokens, rank 2 one
	// or two: rank 1 carries more than its own share of the requests (5 of 11 or 12),
	// not more than its share with one more holder. While rank 2's one prompt is
	// short, rank 2 runs nothing and has computed almost nothing: it is idle, and a
	// new conversation on the prompt computes it there, where the holder's load
	// costs at half what it does otherwise (an eighth of the cache, not a quarter);
	// with a cache of 40 000 it stays. While rank 2's prompt is over half the system
	// prompt's length, or rank 2 still runs two short ones (half as many as rank 1),
	// no rank is idle, and the conversation stays on rank 1. (The recent work halves
	// at the end of each span of absolute time: the wasm runs on a clock of its own.)
	for _, tc := range []struct {
		cache, rank2Chars, rank2Running int
		want                            string
	}{{16384, 100, 0, "2"}, {32768, 100, 0, "2"}, {40000, 100, 0, "1"}, {16384, 10000, 0, "1"}, {16384, 100, 2, "1"}} {
		name := fmt.Sprint("cache ", tc.cache, ", rank 2 sent ", tc.rank2Chars, " characters, runs ", tc.rank2Running)
		t.Run(name, func(t *testing.T) {
			cfg := fmt.Sprintf(`{"trust_client_dp_rank":true,"prefix":{"target_cache_tokens":%d},`+
				`"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":3}]}}}`, tc.cache)
			bothFreshVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(61))
				system := systemOnRank1(h, rng)
				for i := 0; i < 5; i++ {
					computeOn(t, h, prose(rng, 2400), "0", 10)
				}
				var held []uint32
				if tc.rank2Running == 0 {
					computeOn(t, h, prose(rng, tc.rank2Chars), "2", 10)
				}
				for i := 0; i < tc.rank2Running; i++ {
					held = append(held, decodingOn(h, prose(rng, tc.rank2Chars), "2"))
				}
				for i := 0; i < 4; i++ {
					held = append(held, decodingOn(h, prose(rng, 100), "1"))
				}
				h.advance(1000)
				assert.Equal(t, tc.want, newConversationOn(t, h, rng, system))
				for _, id := range held {
					h.endStream(id)
				}
			})
		})
	}
}

func TestFirstTurnsCopyOntoTheLastRankOfASmallPool(t *testing.T) {
	// As many ranks as an index entry names. Every rank but 0 computed a long system
	// prompt (over a quarter of its stated cache of 16 384 tokens) and runs four.
	// While rank 0 has computed nothing, it is idle, and a new conversation on the
	// prompt computes it there: the entry that then names every rank counts the
	// prompt as held everywhere, which it is. After 10 000 characters on rank 0 it is
	// not idle, and the conversation stays with a holder.
	ranks := prefix.TargetsPerEntry
	cfg := fmt.Sprintf(`{"trust_client_dp_rank":true,"prefix":{"target_cache_tokens":16384},`+
		`"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":%d}]}}}`, ranks)
	for _, rank0Chars := range []int{0, 10000} {
		t.Run(fmt.Sprint("rank 0 sent ", rank0Chars, " characters"), func(t *testing.T) {
			bothFreshVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(67))
				system := prose(rng, 16000)
				var held []uint32
				for r := 1; r < ranks; r++ {
					computeChatOn(h, system+prose(rng, 800), fmt.Sprint(r), 100)
					for i := 0; i < 4; i++ {
						held = append(held, decodingOn(h, prose(rng, 100), fmt.Sprint(r)))
					}
				}
				if rank0Chars > 0 {
					computeChatOn(h, prose(rng, rank0Chars), "0", 10)
				}
				h.advance(1000)
				rank := newConversationOn(t, h, rng, system)
				assert.Equal(t, rank0Chars == 0, rank == "0", "rank %s", rank)
				for _, id := range held {
					h.endStream(id)
				}
			})
		})
	}
}

func TestFirstTurnsMakeNoMoreHoldersThanCopiesByDemand(t *testing.T) {
	// Four more ranks than twice what an index entry names. The ranks from 1 each
	// computed a long system prompt and run sixteen, over their share and at an
	// engine's running slots; the others were sent one each. A new conversation on
	// the prompt is computed again on a fresh rank while two fewer than an entry
	// names hold it, and not while one fewer does: in a pool that size one more
	// holder would fill the prompt's index entry, which counts it as held by every
	// rank.
	const w = prefix.TargetsPerEntry
	ranks := 2*w + 4
	cfg := fmt.Sprintf(`{"trust_client_dp_rank":true,"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":%d}]}}}`, ranks)
	for _, holders := range []int{w - 2, w - 1} {
		t.Run(fmt.Sprint(holders, " holders"), func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(53))
				onRank := func(r int) [2]string { return [2]string{"x-data-parallel-rank", fmt.Sprint(r)} }
				system := prose(rng, 16000)
				var held []uint32
				for r := 0; r < ranks; r++ {
					holds := r >= 1 && r <= holders
					text := prose(rng, 100)
					if holds {
						text = system + prose(rng, 800)
					}
					computeChatOn(h, text, fmt.Sprint(r), 10)
					for i := 0; holds && i < 16; i++ {
						id, _ := h.send(post("/v1/chat/completions", chat(prose(rng, 100)), onRank(r)))
						h.stream(id)
						h.firstChunk(id)
						held = append(held, id)
					}
				}
				h.advance(1000)
				_, rank, decision := h.route(post("/v1/chat/completions", chat(system+prose(rng, 800)), [2]string{"x-session-id", "s"}))
				assert.Equal(t, "new-conversation", decision)
				n, err := strconv.Atoi(rank)
				require.NoError(t, err)
				assert.Equal(t, holders == w-1, n >= 1 && n <= holders, "rank %s", rank)
				for _, id := range held {
					h.endStream(id)
				}
			})
		})
	}
}

func TestATurnWhoseHistoryEveryRankHoldsLeavesAtTheSlotCount(t *testing.T) {
	// A conversation placed on rank 1 whose history is mostly a long system prompt
	// that every rank has computed. Ranks 0 and 2 were sent 1 000 short requests
	// over the last 66 s, so a slot frees often (with many more, a slot's wait would
	// cost less than leaving, and the turn would stay by the cost too). Rank 1 then runs
	// sixteen with two waiting for a slot, and is seen full. The wait for two slots is
	// less than computing what rank 1 caches again, so an outright keep would hold
	// the turn; but elsewhere the turn computes only its own words, which costs less
	// still, and it leaves (overflow).
	cfg := trustedRanks
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, cfg)
		rng := rand.New(rand.NewSource(59))
		system := prose(rng, 16000)
		for _, r := range []string{"0", "2"} {
			computeChatOn(h, system+prose(rng, 400), r, 100)
		}
		for i := 0; i < 1000; i++ {
			computeChatOn(h, "hi", fmt.Sprint(i%2*2), 0)
			h.advance(66)
		}
		history := system + prose(rng, 400)
		_, rank, _ := h.route(post("/v1/chat/completions", chat(history),
			[2]string{"x-data-parallel-rank", "1"}, [2]string{"x-session-id", "a"}))
		require.Equal(t, "1", rank)
		held, others := fillRank1(h, rng)
		// A request decided while rank 1 is out of slots records the sighting.
		h.route(post("/v1/chat/completions", chat(prose(rng, 100))))
		_, rank, decision := h.route(post("/v1/chat/completions", chat(history+prose(rng, 400)), [2]string{"x-session-id", "a"}))
		assert.Equal(t, "overflow", decision)
		assert.NotEqual(t, "1", rank)
		for _, id := range append(held, others...) {
			h.endStream(id)
		}
	})
}

func TestNewConversationsSpreadByTheTimeTheirWorkTookInFilter(t *testing.T) {
	// Each of three ranks is sent 8 000 tokens at once (their recent work counts from
	// the same instant), rank 2 computing them in twice the time of the others: its
	// work counts twice as long, and new conversations go to ranks 0 and 1. When all
	// three took the same time, all three take them.
	cfg := trustedRanks
	for _, slow := range []int{1000, 2000} {
		t.Run(fmt.Sprint("rank 2 in ", slow, " ms"), func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(61))
				var ids []uint32
				for _, r := range []string{"0", "1", "2"} {
					ids = append(ids, openOn(t, h, prose(rng, 32000), r, false))
				}
				h.advance(1000)
				for _, id := range ids[:2] {
					h.firstChunk(id)
					h.endStream(id)
				}
				h.advance(slow - 1000)
				h.firstChunk(ids[2])
				h.endStream(ids[2])
				h.advance(1000)
				used := map[string]bool{}
				for i := 0; i < 6; i++ {
					_, rank, decision := h.route(post("/v1/chat/completions", chat(prose(rng, 200)), [2]string{"x-session-id", fmt.Sprint("s", i)}))
					require.Equal(t, "new-conversation", decision)
					used[rank] = true
				}
				assert.Equal(t, slow == 1000, used["2"], "ranks used %v", used)
				assert.True(t, used["0"] && used["1"], "ranks used %v", used)
			})
		})
	}
}

func TestNewConversationsOnACachedPromptCountRecentRequestsInFilter(t *testing.T) {
	// Ranks 0 and 1 computed a long system prompt with a question. Rank 0 was then
	// sent the same again, cached whole; ranks 1 and 2 three documents of 20 000
	// characters each. With two questions, rank 0 has worked least and a new
	// conversation on the prompt goes there; with forty, its requests at the pool's
	// mean work count more than rank 1's work, and the conversation goes to rank 1.
	// (The recent work halves at the end of each span of absolute time: the wasm runs
	// on a clock of its own.)
	cfg := trustedRanks
	for _, tc := range []struct {
		questions int
		want      string
	}{{2, "0"}, {40, "1"}} {
		t.Run(fmt.Sprint(tc.questions, " questions on rank 0"), func(t *testing.T) {
			bothFreshVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(73))
				system := prose(rng, 16000)
				question := prose(rng, 800)
				for _, r := range []string{"0", "1"} {
					computeChatOn(h, system+question, r, 100)
				}
				for i := 0; i < tc.questions; i++ {
					computeChatOn(h, system+question, "0", 5)
				}
				for _, r := range []string{"1", "2"} {
					for i := 0; i < 3; i++ {
						computeChatOn(h, prose(rng, 20000), r, 100)
					}
				}
				h.advance(1000)
				assert.Equal(t, tc.want, newConversationOn(t, h, rng, system))
			})
		})
	}
}

func TestNewConversationsOnACachedPromptCountRequestsAtTheRanksRateInFilter(t *testing.T) {
	// Ranks 0 and 1 computed a long system prompt with a question, rank 1 in a second
	// and rank 0 in slow ms; rank 2 six documents of the same length, a second each.
	// Rank 0 was then sent the same again 19 times, cached whole, and rank 1 20 times.
	// At twice rank 1's time rank 0's requests count for more, and a new conversation
	// on the prompt goes to rank 1; at a tenth more the rates are taken as the same,
	// and it goes to rank 0, with the fewer requests. (The wasm runs on a clock of its
	// own.)
	cfg := trustedRanks
	for _, tc := range []struct {
		slow int
		want string
	}{{2000, "1"}, {1100, "0"}} {
		t.Run(fmt.Sprint("rank 0 in ", tc.slow, " ms"), func(t *testing.T) {
			bothFreshVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(83))
				system := prose(rng, 16000)
				question := prose(rng, 800)
				computeChatOn(h, system+question, "0", tc.slow)
				computeChatOn(h, system+question, "1", 1000)
				for i := 0; i < 6; i++ {
					computeChatOn(h, prose(rng, 16800), "2", 1000)
				}
				for r, n := range []int{19, 20} {
					for i := 0; i < n; i++ {
						computeChatOn(h, system+question, fmt.Sprint(r), 5)
					}
				}
				h.advance(1000)
				assert.Equal(t, tc.want, newConversationOn(t, h, rng, system))
			})
		})
	}
}

func TestAFirstTurnPayingForACopySpreadsByWorkInFilter(t *testing.T) {
	// Rank 0 computed a long system prompt and 80 short documents, and runs sixteen:
	// over its share, at an engine's running slots, so a new conversation on the
	// prompt computes it elsewhere. Rank 1 was sent one short question forty times
	// (cached after the first), rank 2 two documents of 8 000 characters. The copy
	// goes to rank 1, which has worked least, though its requests at the pool's mean
	// work would count more than rank 2's work. (The wasm runs on a clock of its own.)
	cfg := trustedRanks
	bothFreshVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, cfg)
		rng := rand.New(rand.NewSource(79))
		system := prose(rng, 16000)
		computeChatOn(h, system+prose(rng, 800), "0", 100)
		for i := 0; i < 80; i++ {
			computeChatOn(h, prose(rng, 400), "0", 2)
		}
		var held []uint32
		for i := 0; i < 16; i++ {
			held = append(held, decodingOn(h, prose(rng, 100), "0"))
		}
		question := prose(rng, 100)
		for i := 0; i < 40; i++ {
			computeChatOn(h, question, "1", 1)
		}
		for i := 0; i < 2; i++ {
			computeChatOn(h, prose(rng, 8000), "2", 50)
		}
		h.advance(1000)
		assert.Equal(t, "1", newConversationOn(t, h, rng, system))
		for _, id := range held {
			h.endStream(id)
		}
	})
}

func TestALateFirstChunkShowsATargetOutOfRunningSlots(t *testing.T) {
	// Rank 1, its rate known, runs sixteen streamed replies; a seventeenth request of a
	// few tokens is sent there and its first chunk comes a second later, when a
	// prefill that small was due in ms: it waited for a running slot, so rank 1 runs
	// all its slots at seventeen. Then rank 1 drains: it has worked most lately and
	// runs none, rank 0 runs ten and rank 2 fifteen. Once a slot count has been seen, a
	// new conversation whose prompt no rank caches goes where the fewest requests are
	// in flight (TestAFirstTurnSpreadsRequestsInFlightOnceSlotsBind): rank 1. Its
	// first chunk on time, or a few ms late, says nothing of the slots, nor does a
	// late one with fewer than sixteen running (more likely a slow engine step than a
	// slot): the conversation goes to rank 0, which has worked least lately.
	cfg := trustedRanks
	for _, tc := range []struct {
		running, lateMS int
		seen            bool
	}{{16, 1000, true}, {16, 20, false}, {16, 0, false}, {14, 1000, false}} {
		t.Run(fmt.Sprint(tc.running, " running, ", tc.lateMS, " ms"), func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, cfg)
				rng := rand.New(rand.NewSource(31))
				computeChatOn(h, prose(rng, 16800), "1", 100)
				var others, rank1 []uint32
				for i := 0; i < 25; i++ {
					rank := "2"
					if i < 20 && i%2 == 0 {
						rank = "0"
					}
					others = append(others, decodingOn(h, prose(rng, 100), rank))
				}
				for i := 0; i < tc.running; i++ {
					rank1 = append(rank1, decodingOn(h, prose(rng, 100), "1"))
				}
				id, _ := h.send(post("/v1/chat/completions", chat(prose(rng, 100)), [2]string{"x-data-parallel-rank", "1"}))
				h.stream(id)
				h.advance(tc.lateMS)
				h.firstChunk(id)
				for _, id := range append(rank1, id) {
					h.endStream(id)
				}
				h.advance(100)
				_, rank, decision := h.route(post("/v1/chat/completions", chat(prose(rng, 800)), [2]string{"x-session-id", "s"}))
				assert.Equal(t, "new-conversation", decision)
				want := "0"
				if tc.seen {
					want = "1"
				}
				assert.Equal(t, want, rank)
				for _, id := range others {
					h.endStream(id)
				}
			})
		})
	}
}
