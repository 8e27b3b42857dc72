package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/routing/extract"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
)

const mooncakeSample = `{"timestamp": 0, "input_length": 1000, "output_length": 6, "hash_ids": [0, 1]}
{"timestamp": 40, "input_length": 1500, "output_length": 4, "hash_ids": [0, 1, 2]}

{"timestamp": 100, "input_length": 300, "output_length": 9, "hash_ids": [7]}
`

func TestReadMooncake(t *testing.T) {
	recs, err := ReadMooncake(strings.NewReader(mooncakeSample), 0)
	require.NoError(t, err)
	require.Len(t, recs, 3)
	assert.Equal(t, MooncakeRecord{Timestamp: 40, InputLength: 1500, OutputLength: 4, HashIDs: []uint64{0, 1, 2}}, recs[1])

	recs, err = ReadMooncake(strings.NewReader(mooncakeSample), 2)
	require.NoError(t, err)
	assert.Len(t, recs, 2)

	_, err = ReadMooncake(strings.NewReader(`{"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [0, 1]}`), 0)
	assert.ErrorContains(t, err, "2 hash_ids for input_length 1100 (want 3)")
	_, err = ReadMooncake(strings.NewReader(`{"timestamp": 0,`), 0)
	assert.ErrorContains(t, err, "mooncake line 1")
}

func TestMooncakeRequestsShareTextAsTheyShareBlocks(t *testing.T) {
	recs, err := ReadMooncake(strings.NewReader(mooncakeSample), 0)
	require.NoError(t, err)
	reqs := MooncakeRequests(recs, 4, 2)
	require.Len(t, reqs, 3)
	a, b, c := reqs[0].Text(), reqs[1].Text(), reqs[2].Text()
	assert.Len(t, a, 4000, "input_length × chars_per_token")
	assert.Len(t, b, 6000)
	assert.Len(t, c, 1200)
	assert.Equal(t, a, b[:4000], "ids 0, 1 are the same 4000 characters in both prompts")
	assert.NotEqual(t, a[:100], c[:100])
	assert.Equal(t, reqs[0].Text(), a, "text is regenerated identically")
	assert.Equal(t, 20.0, reqs[1].ArrivalMS, "40 ms at speed 2")
	assert.Equal(t, []uint64{0, 1, 2}, reqs[1].Blocks)
	assert.Equal(t, 512, reqs[1].BlockTokens)

	body := reqs[1].Body()
	require.True(t, gjson.ValidBytes(body))
	v := gjson.ParseBytes(body)
	assert.Equal(t, "mooncake", v.Get("model").String())
	assert.Equal(t, string(b), v.Get("prompt").String())
	assert.Equal(t, int64(4), v.Get("max_tokens").Int())
	assert.Equal(t, "/v1/completions", reqs[1].Path)

	prepare(reqs, 2048)
	full := reqs[0].Full64()
	assert.Len(t, full, 62)
	assert.True(t, reqs[0].Partial, "4000 bytes end in a partial chunk")
	assert.Equal(t, full, reqs[1].Chain64[:62], "the chain hashes of the shared text agree")
	assert.NotEqual(t, reqs[0].Chain64[62], reqs[1].Chain64[62], "a partial chunk is not the full one")
	assert.Equal(t, reqs[0].FirstKey, reqs[1].FirstKey)
	assert.NotEqual(t, reqs[0].FirstKey, reqs[2].FirstKey)
}

func TestFillWordsIsPlainText(t *testing.T) {
	b := make([]byte, 5000)
	fillWords(b, 42)
	for _, c := range b {
		require.True(t, c == ' ' || (c >= 'a' && c <= 'z'), "byte %q", c)
	}
	words := strings.Fields(string(b))
	assert.Greater(t, len(words), 5000/12)
	other := make([]byte, 5000)
	fillWords(other, 43)
	assert.NotEqual(t, b[:64], other[:64])
}

func TestChainHashes(t *testing.T) {
	text := []byte(strings.Repeat("abcdefgh", 20)) // 160 bytes
	full := chainHashes(text, 64, false, "m")
	withPartial := chainHashes(text, 64, true, "m")
	assert.Len(t, full, 2)
	assert.Len(t, withPartial, 3)
	assert.Equal(t, full, withPartial[:2])
	// Equal chunks at different positions hash differently (the chain covers the past).
	assert.NotEqual(t, full[0], full[1])
	// Another seed (model) changes every hash.
	assert.NotEqual(t, full[0], chainHashes(text, 64, false, "other")[0])
}

func TestReadAzure(t *testing.T) {
	csv := "TIMESTAMP,ContextTokens,GeneratedTokens\n" +
		"2023-11-16 18:17:03.9799600,4808,10\n" +
		"2023-11-16 18:17:04.0319600,3180,8\n" +
		"2023-11-16 18:17:05.5,110,27\n"
	recs, err := ReadAzure(strings.NewReader(csv), 0)
	require.NoError(t, err)
	require.Len(t, recs, 3)
	reqs := AzureRequests(recs, 4, 1)
	assert.Equal(t, 0.0, reqs[0].ArrivalMS)
	assert.InDelta(t, 52.0, reqs[1].ArrivalMS, 1e-6)
	assert.InDelta(t, 1520.04, reqs[2].ArrivalMS, 1e-6)
	assert.Equal(t, 4808, reqs[0].InputTokens)
	assert.Equal(t, 10, reqs[0].OutputTokens)
	assert.Len(t, reqs[0].Blocks, 10)
	assert.Len(t, reqs[0].Text(), 4808*4)
	// Nothing is shared between requests.
	seen := map[uint64]bool{}
	for _, r := range reqs {
		for _, b := range r.Blocks {
			assert.False(t, seen[b])
			seen[b] = true
		}
	}
	assert.NotEqual(t, reqs[0].Text()[:64], reqs[1].Text()[:64])

	_, err = ReadAzure(strings.NewReader("a,b,c\n1,2,3\n"), 0)
	assert.ErrorContains(t, err, "header")
	_, err = ReadAzure(strings.NewReader("TIMESTAMP,ContextTokens,GeneratedTokens\nnot a time,1,2\n"), 0)
	assert.ErrorContains(t, err, "azure row 2")
}

const openaiSample = `{"timestamp_ms": 500, "path": "/v1/chat/completions", "headers": {"X-Session-Id": "c1"}, "body": {"model": "llama", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": " there"}]}], "max_tokens": 50}, "output_tokens": 20}
{"timestamp_ms": 100, "path": "/v1/completions", "body": {"model": "llama", "prompt": "once upon a time", "max_tokens": 7}}
{"timestamp_ms": 900, "path": "/v1/responses", "body": {"model": "llama", "instructions": "Be kind.", "input": "hi", "prompt_cache_key": "c2"}}
{"timestamp_ms": 950, "path": "/v1/completions", "body": {"model": "llama", "prompt": [1, 2, 3, 4, 5]}}
`

func TestReadOpenAI(t *testing.T) {
	recs, err := ReadOpenAI(strings.NewReader(openaiSample), 0)
	require.NoError(t, err)
	require.Len(t, recs, 4)
	assert.Equal(t, [][2]string{{"x-session-id", "c1"}}, recs[0].Headers)
	assert.Equal(t, 20, recs[0].OutputTokens)
	assert.Equal(t, 7, recs[1].OutputTokens, "falls back to max_tokens")
	assert.Equal(t, 128, recs[2].OutputTokens, "then to 128")

	reqs := OpenAIRequests(recs, 4, 1)
	prepare(reqs, 2048)
	useChainAsBlocks(reqs)
	// Put in time order: the completions request (100 ms) first.
	assert.Equal(t, "/v1/completions", reqs[0].Path)
	assert.Equal(t, 0.0, reqs[0].ArrivalMS)
	assert.Equal(t, 400.0, reqs[1].ArrivalMS)
	assert.Equal(t, "once upon a time", string(reqs[0].Text()))

	chat := reqs[1]
	assert.Equal(t, "system:Be brief.\nuser:hello there", string(chat.Text()))
	assert.Equal(t, "c1", chat.Conversation)
	assert.Equal(t, len("system:Be brief.\nuser:hello there")/4, chat.InputTokens)
	assert.Equal(t, 16, chat.BlockTokens, "64-character blocks of 4 characters a token")
	assert.Equal(t, chat.Chain64, chat.Blocks)
	assert.Equal(t, "llama", chat.Model)
	assert.True(t, gjson.ValidBytes(chat.Body()))

	resp := reqs[2]
	assert.Equal(t, "system:Be kind.\nuser:hi", string(resp.Text()))
	assert.Equal(t, "c2", resp.Conversation, "from the prompt_cache_key body field")

	ids := reqs[3]
	assert.Equal(t, 5, ids.InputTokens, "token ids count one each")
	assert.Len(t, ids.Text(), 20)

	_, err = ReadOpenAI(strings.NewReader(`{"body": 3}`), 0)
	assert.ErrorContains(t, err, "body is not an object")
}

// The replay hashes the prompt the filter hashes, including what is not text: a
// message's tool calls and a responses item that is not a message.
func TestOpenAIPromptIsTheFiltersPrompt(t *testing.T) {
	trace := `{"path": "/v1/chat/completions", "body": {"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "t1"}]}, {"role": "user", "content": "go"}]}}
{"timestamp_ms": 1, "path": "/v1/responses", "body": {"input": [{"type": "function_call_output", "output": "42"}, {"role": "user", "content": "ok?"}]}}
{"timestamp_ms": 2, "path": "/v1/completions", "body": {"prompt": {"not": "a prompt"}}}
`
	recs, err := ReadOpenAI(strings.NewReader(trace), 0)
	require.NoError(t, err)
	reqs := OpenAIRequests(recs, 4, 1)
	for i, r := range reqs {
		var want extract.Request
		err := extract.Extract(extract.APIForPath(r.Path), r.Body(), extract.ExtractOptions{CharsPerToken: 4}, &want)
		if i == 2 {
			require.Error(t, err)
			assert.Empty(t, r.Text(), "an unreadable body has no prompt")
			continue
		}
		require.NoError(t, err)
		assert.Equal(t, string(want.Prompt), string(r.Text()), "request %d", i)
		assert.Equal(t, max(want.Tokens, 1), r.InputTokens, "request %d", i)
	}
	assert.Equal(t, `assistant:[{"id": "t1"}]`+"\nuser:go", string(reqs[0].Text()))
}

func TestSniffFormatAndLoadTrace(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(data), 0o644))
		return p
	}
	for name, tc := range map[string]struct{ data, kind string }{
		"m.jsonl": {mooncakeSample, "mooncake"},
		"a.csv":   {"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,48,10\n", "azure"},
		"o.jsonl": {openaiSample, "openai"},
	} {
		reqs, kind, err := loadTrace(write(name, tc.data), "auto", 0, 4, 1)
		require.NoError(t, err, name)
		assert.Equal(t, tc.kind, kind)
		assert.NotEmpty(t, reqs)
		for _, r := range reqs {
			assert.NotEmpty(t, r.Blocks, "%s: every request has accounting blocks", name)
		}
	}
	_, _, err := loadTrace(write("x.txt", "hello"), "auto", 0, 4, 1)
	assert.ErrorContains(t, err, "cannot tell the trace format")
	_, _, err = loadTrace(write("late.jsonl", `{"timestamp": 10, "input_length": 1, "output_length": 1, "hash_ids": [1]}
{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [2]}`), "mooncake", 0, 4, 1)
	assert.ErrorContains(t, err, "time order")
}

func TestReplayConfigSetsTheFleet(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "c.json")
	require.NoError(t, os.WriteFile(p, []byte(`{"balance": {"load_weight": 2}, "pools": {"decode": {"endpoints": [{"address": "x:1"}]}}}`), 0o644))
	out, err := replayConfig(p, FleetConfig{Endpoints: 2, DPSize: 4})
	require.NoError(t, err)
	v := gjson.ParseBytes(out)
	assert.Equal(t, 2.0, v.Get("balance.load_weight").Float())
	assert.Equal(t, `[{"address":"10.0.0.1:8000","dp_size":4},{"address":"10.0.0.2:8000","dp_size":4}]`,
		v.Get("pools.decode.endpoints").Raw)

	require.NoError(t, os.WriteFile(p, []byte(`{"headers": {"destination": "x-dest"}}`), 0o644))
	_, err = replayConfig(p, FleetConfig{Endpoints: 1, DPSize: 1})
	assert.ErrorContains(t, err, "headers.destination")
}

func TestReportBars(t *testing.T) {
	res := func(name string, hits int, ttft ...float64) *Result {
		return &Result{Policy: name, HitBlocks: int64(hits), TotalBlocks: 100, TTFT: ttft, MeanInFlight: []float64{1, 1}}
	}
	// Two draws at x1: kvroute's TTFT mean (233 in both) is the lowest on the mean
	// over the draws although baseline a beats it in draw 0 (133); its p99 (400) ties
	// the others' means, which is not the lowest.
	cells := []*Cell{
		{Speed: 1, Draw: 0, KVRoute: res("kvroute (wasm)", 96, 100, 200, 400), Baselines: []*Result{res("a", 90, 50, 150, 200), res("b", 97, 200, 200, 300)}},
		{Speed: 1, Draw: 1, KVRoute: res("kvroute (wasm)", 94, 100, 200, 400), Baselines: []*Result{res("a", 90, 300, 400, 600), res("b", 97, 200, 200, 500)}},
	}
	rep := &Report{OracleLRU: 1.0, OracleInfinite: 1.0, BlockTokens: 512, Speed: 1, Draws: 2, Cells: cells,
		KVRoute: cells[0].KVRoute, Baselines: cells[0].Baselines,
		Fleet: FleetConfig{Endpoints: 3, DPSize: 1, CacheTokens: 512 * 10}}
	bars := rep.Bars()
	require.Len(t, bars, 3)
	assert.True(t, bars[0].Pass, bars[0].Text)
	assert.False(t, bars[1].Pass, bars[1].Text)
	assert.True(t, bars[2].Pass, bars[2].Text) // hit 0.95 of the oracle
	assert.Contains(t, bars[2].Text, "0.9500")

	var buf bytes.Buffer
	rep.WriteText(&buf)
	assert.Contains(t, buf.String(), "FAIL  x1, 2 draw(s): kvroute's TTFT p99 is the lowest")
	assert.Contains(t, buf.String(), "283 [133-433]", "a draw's range is printed")
	buf.Reset()
	require.NoError(t, rep.WriteSVG(&buf))
	assert.True(t, strings.HasPrefix(buf.String(), "<svg"))
	assert.NotContains(t, buf.String(), "<=", "text is escaped")

	rep.OracleInfinite, rep.OracleLRU = 0, 0
	for _, b := range rep.Bars() {
		if strings.Contains(b.Text, "hit rate") {
			assert.True(t, b.NA, b.Text)
		}
	}
}
