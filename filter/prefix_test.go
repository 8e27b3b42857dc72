package main

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/shareddata"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func prose(rng *rand.Rand, n int) string {
	var b strings.Builder
	for b.Len() < n {
		fmt.Fprintf(&b, "word%d ", rng.Intn(100000))
	}
	return b.String()[:n]
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

func chatBody(msgs []message) string {
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	return string(b)
}

func completionBody(prompt any) string {
	b, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt})
	return string(b)
}

// TestChatsWithoutIDsFollowTheirHistoryInFilter: six chats without ids over three
// endpoints, each turn back to its first turn's endpoint. The cache is stated: route
// answers every request at once, and first chunks that come back that soon after a
// request with a copy to use would teach a cache from times no engine gives.
func TestChatsWithoutIDsFollowTheirHistoryInFilter(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"prefix":{"target_cache_tokens":1000000},"pools":{"decode":{"endpoints":[
	{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"},{"address":"10.0.0.3:8000"}]}}}`)
		rng := rand.New(rand.NewSource(1))
		const chats = 6
		hist := make([][]message, chats)
		home := make([]string, chats)
		for turn := 0; turn < 5; turn++ {
			for c := 0; c < chats; c++ {
				if turn == 0 {
					hist[c] = []message{{"system", prose(rng, 3000)}}
				} else {
					hist[c] = append(hist[c], message{"assistant", prose(rng, 300)})
				}
				hist[c] = append(hist[c], message{"user", prose(rng, 200)})
				dest, _, dec := h.route(post("/v1/chat/completions", chatBody(hist[c])))
				if turn == 0 {
					home[c] = dest
					continue
				}
				assert.Equal(t, "continuation", dec, "chat %d turn %d", c, turn)
				assert.Equal(t, home[c], dest, "chat %d turn %d", c, turn)
			}
		}
		assert.Equal(t, uint64(24), h.counter("kvroute_decision_continuation"))
	})
}

func TestSharedDocumentAttractsItsQuestionsInFilter(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		rng := rand.New(rand.NewSource(2))
		doc := prose(rng, 30000)
		home, _, _ := h.route(post("/v1/completions", completionBody(doc+"\nQ: summarise it")))
		for q := 0; q < 8; q++ {
			h.route(post("/v1/completions", completionBody(prose(rng, 2000)))) // other traffic
			dest, _, dec := h.route(post("/v1/completions", completionBody(doc+fmt.Sprintf("\nQ%d: %s", q, prose(rng, 300)))))
			assert.Contains(t, []string{"continuation", "prefix"}, dec)
			assert.Equal(t, home, dest, "question %d", q)
		}
	})
}

func TestSharedSystemPromptUnderTheGateSpreadsInFilter(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, `{"prefix":{"match_rate_threshold":0.2},"pools":{"decode":{"endpoints":[
			{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"},{"address":"10.0.0.3:8000"}]}}}`)
		rng := rand.New(rand.NewSource(3))
		system := prose(rng, 400)
		seen := map[string]int{}
		var held []uint32
		for i := 0; i < 24; i++ {
			id, _ := h.send(post("/v1/chat/completions", chatBody([]message{{"system", system}, {"user", prose(rng, 4000)}})))
			dest, _ := h.header(id, "x-gateway-destination-endpoint")
			dec, _ := h.header(id, "x-kvroute-decision")
			assert.Equal(t, "load", dec)
			seen[dest]++
			held = append(held, id)
		}
		assert.Equal(t, map[string]int{"10.0.0.1:8000": 8, "10.0.0.2:8000": 8, "10.0.0.3:8000": 8}, seen)
		for _, id := range held {
			h.respond(id, 200)
		}
	})
}

func TestContinuationOf300kCharacterPromptInFilter(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		rng := rand.New(rand.NewSource(4))
		long := prose(rng, 300_000)
		home, _, _ := h.route(post("/v1/chat/completions", chatBody([]message{{"user", long}})))
		for i := 0; i < 4; i++ {
			h.route(post("/v1/chat/completions", chatBody([]message{{"user", prose(rng, 5000)}})))
		}
		dest, _, dec := h.route(post("/v1/chat/completions", chatBody([]message{{"user", long}, {"assistant", "ok"}, {"user", "and then?"}})))
		assert.Equal(t, "continuation", dec)
		assert.Equal(t, home, dest)
	})
}

func TestTokenIDPromptsInFilter(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		rng := rand.New(rand.NewSource(5))
		ids := make([]int, 600)
		for i := range ids {
			ids[i] = rng.Intn(128000)
		}
		home, _, _ := h.route(post("/v1/completions", completionBody(ids)))
		for i := 0; i < 3; i++ {
			h.route(post("/v1/completions", completionBody([]int{rng.Intn(9), rng.Intn(9), 1, 2, 3})))
		}
		dest, _, dec := h.route(post("/v1/completions", completionBody(append(append([]int(nil), ids...), 7, 8, 9))))
		assert.Equal(t, "continuation", dec)
		assert.Equal(t, home, dest)
		// An array of token-id arrays hashes its first prompt.
		dest, _, _ = h.route(post("/v1/completions", completionBody([][]int{append(append([]int(nil), ids...), 1), {5, 6}})))
		assert.Equal(t, home, dest)
	})
}

func TestGateBoundaryInFilter(t *testing.T) {
	// 10 blocks of 64 bytes (160 tokens); the first n blocks are shared with an earlier
	// prompt on one target. 1 block is a match rate of exactly 0.1: not above the gate.
	for _, c := range []struct {
		shared int
		want   string
	}{{1, "load"}, {2, "prefix"}} {
		t.Run(fmt.Sprint(c.shared), func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, threeEndpoints)
				rng := rand.New(rand.NewSource(6))
				shared := prose(rng, 64*c.shared)
				seed, _, _ := h.route(post("/v1/completions", completionBody(shared+prose(rng, 64))))
				dest, _, dec := h.route(post("/v1/completions", completionBody(shared+prose(rng, 640-64*c.shared))))
				assert.Equal(t, c.want, dec)
				if c.want == "prefix" {
					assert.Equal(t, seed, dest)
				}
			})
		})
	}
}

func TestSkipBlocksInFilter(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	system := prose(rng, 64*12)
	for _, c := range []struct {
		skip string
		want string
	}{{"0", "continuation"}, {"12", "prefix"}} {
		t.Run(c.skip, func(t *testing.T) {
			bothVMs(t, func(t *testing.T, vm types.VMContext) {
				h := startHost(t, vm, `{"prefix":{"skip_blocks":`+c.skip+`},"pools":{"decode":{"endpoints":[
					{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"},{"address":"10.0.0.3:8000"}]}}}`)
				home, _, _ := h.route(post("/v1/completions", completionBody(system+prose(rng, 64*3))))
				dest, _, dec := h.route(post("/v1/completions", completionBody(system+prose(rng, 64*3))))
				require.Equal(t, c.want, dec)
				assert.Equal(t, home, dest)
			})
		})
	}
}

func TestTickPublishesPrefixRecordsToSharedData(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		rng := rand.New(rand.NewSource(8))
		h.route(post("/v1/completions", completionBody(prose(rng, 2000))))
		_, _, err := (shareddata.Store{}).Get("kvroute/pj/decode/0/head")
		require.Error(t, err, "nothing is published before the tick")
		h.Tick()
		head, _, err := (shareddata.Store{}).Get("kvroute/pj/decode/0/head")
		require.NoError(t, err)
		assert.Len(t, head, 17)
		chunk, _, err := (shareddata.Store{}).Get("kvroute/pj/decode/0/1")
		require.NoError(t, err)
		// 2000 bytes in blocks of 64: 31 blocks, 16 + 7 checkpoints + the last block.
		assert.Equal(t, 17+12*24, len(chunk))
		// Every later tick with news publishes too.
		h.route(post("/v1/completions", completionBody(prose(rng, 2000))))
		h.Tick()
		head, _, err = (shareddata.Store{}).Get("kvroute/pj/decode/0/head")
		require.NoError(t, err)
		assert.Equal(t, byte(2), head[9], "the head names chunk 2")
		assert.Equal(t, uint64(0), h.counter("kvroute_state_conflicts"))
	})
}
