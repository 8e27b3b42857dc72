package main

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/routing/extract"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tokensOf is the filter's token estimate of a chat body under the default config.
func tokensOf(t *testing.T, body string) int {
	var req extract.Request
	opt := extract.ExtractOptions{CharsPerToken: 4, BlockTokens: 16}.Prepared()
	require.NoError(t, extract.Extract(extract.APIChatCompletions, []byte(body), opt, &req))
	return req.Tokens
}

func TestPromptAndPrefixMatchedTokenCounters(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		rng := rand.New(rand.NewSource(7))
		var sb strings.Builder
		for sb.Len() < 4000 {
			fmt.Fprintf(&sb, "w%d ", rng.Intn(100000))
		}
		history := sb.String()
		first, second := chat(history), chat(history+" and one more question")
		dest1, _, _ := h.route(post("/v1/chat/completions", first))
		assert.Equal(t, uint64(tokensOf(t, first)), h.counter("kvroute_prompt_tokens"))
		assert.Equal(t, uint64(0), h.counter("kvroute_prefix_matched_tokens"), "nothing was cached before")

		dest2, _, decision := h.route(post("/v1/chat/completions", second))
		require.Equal(t, dest1, dest2, decision)
		want := uint64(tokensOf(t, first) + tokensOf(t, second))
		assert.Equal(t, want, h.counter("kvroute_prompt_tokens"))
		matched := h.counter("kvroute_prefix_matched_tokens")
		// The index keeps checkpoints, not every block: a match is at least 7/8 of the
		// shared prefix, which is the first request's whole blocks.
		shared := uint64(tokensOf(t, first)) / 16 * 16
		assert.True(t, matched >= shared*7/8 && matched <= shared, "matched %d of %d shared", matched, shared)

		// A body that is not JSON routes by load and adds no tokens.
		h.route(post("/v1/chat/completions", "not json"))
		assert.Equal(t, want, h.counter("kvroute_prompt_tokens"))
		assert.Equal(t, matched, h.counter("kvroute_prefix_matched_tokens"))
		assert.Equal(t, uint64(3), h.counter("kvroute_requests_routed"))
	})
}

func TestAPromptPastFourThousandBlocksMatchesAlmostAllItShares(t *testing.T) {
	// A document of 8 100 blocks or so (about 130 000 tokens) with two questions of
	// 100 blocks each: past 4 096 blocks the index keeps 32 checkpoints an octave, so
	// the second matches at least 31/32 of the blocks the two share, where 8 an octave
	// would give 7 680.
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		rng := rand.New(rand.NewSource(11))
		doc := prose(rng, 8100*64)
		first, second := chat(doc+prose(rng, 6400)), chat(doc+prose(rng, 6400))
		shared := uint64(tokensOf(t, chat(doc))) / 16
		require.True(t, shared > 7680*32/31 && shared < 8192, "the shared blocks (%d) lie where only the finer grid comes within 1/32", shared)
		dest1, _, _ := h.route(post("/v1/chat/completions", first))
		dest2, _, decision := h.route(post("/v1/chat/completions", second))
		require.Equal(t, dest1, dest2, decision)
		matched := h.counter("kvroute_prefix_matched_tokens") / 16
		assert.True(t, matched >= shared*31/32 && matched <= shared, "matched %d of %d shared blocks", matched, shared)
	})
}

func TestTokenCountersAreHandedOverOnTheTick(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, threeEndpoints)
		h.route(post("/v1/chat/completions", chat("hello there")))
		v, err := h.GetCounterMetric("kvroute_prompt_tokens")
		require.NoError(t, err, "defined at plugin start")
		assert.Equal(t, uint64(0), v, "counted in the VM until the tick")
		assert.NotZero(t, h.counter("kvroute_prompt_tokens"))
	})
}

func TestEngineScrapeFailuresAreCounted(t *testing.T) {
	bothVMs(t, func(t *testing.T, vm types.VMContext) {
		h := startHost(t, vm, engineFleet)
		scrapeRound := func(answer func(id uint32)) {
			h.advance(200)
			h.Tick()
			sc := h.scrapes()
			require.Len(t, sc, 3)
			for _, c := range sc {
				answer(c.CalloutID)
			}
		}
		v, err := h.GetCounterMetric("kvroute_engine_scrape_failures")
		require.NoError(t, err, "defined at plugin start")
		assert.Equal(t, uint64(0), v)
		scrapeRound(func(id uint32) {
			h.CallOnHttpCallResponse(id, [][2]string{{":status", "200"}}, nil, []byte(vllmPage(1, 0)))
		})
		assert.Equal(t, uint64(0), h.counter("kvroute_engine_scrape_failures"), "good pages")
		scrapeRound(func(id uint32) {
			h.CallOnHttpCallResponse(id, [][2]string{{":status", "503"}}, nil, []byte("down"))
		})
		assert.Equal(t, uint64(3), h.counter("kvroute_engine_scrape_failures"), "non-2xx")
		scrapeRound(func(id uint32) {
			// How Envoy reports a timeout or a reset: no headers, no body.
			h.CallOnHttpCallResponse(id, nil, nil, nil)
		})
		assert.Equal(t, uint64(6), h.counter("kvroute_engine_scrape_failures"), "no response")
		scrapeRound(func(id uint32) {
			h.CallOnHttpCallResponse(id, [][2]string{{":status", "200"}}, nil, []byte("not prometheus {{{"))
		})
		assert.Equal(t, uint64(9), h.counter("kvroute_engine_scrape_failures"), "unparsable")
	})
}
