package main

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/kvroute/kvroute/routing/extract"
	"github.com/tidwall/gjson"
)

// OpenAIRecord is one line of an OpenAI request trace:
//
//	{"timestamp_ms": 1200, "path": "/v1/chat/completions", "headers": {"x-session-id": "c1"},
//	 "body": {...the request body...}, "output_tokens": 180}
//
// headers and output_tokens are optional (output_tokens falls back to the body's
// max_completion_tokens or max_tokens, then to 128).
type OpenAIRecord struct {
	TimestampMS  float64
	Path         string
	Headers      [][2]string
	Body         []byte
	OutputTokens int
}

// conversationHeaders and conversationBodyFields are where the baselines that honour
// an explicit conversation id look for one: kvroute's defaults.
var (
	conversationHeaders    = []string{"x-session-id", "x-correlation-id", "x-session-affinity", "x-multi-turn-session-id"}
	conversationBodyFields = []string{"conversation_params.conversation_id", "prompt_cache_key", "conversation"}
)

// ReadOpenAI reads an OpenAI request JSONL trace. limit > 0 keeps the first limit lines.
func ReadOpenAI(r io.Reader, limit int) ([]OpenAIRecord, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	var out []OpenAIRecord
	line := 0
	for sc.Scan() {
		line++
		b := trimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if !gjson.ValidBytes(b) {
			return nil, fmt.Errorf("openai line %d: not JSON", line)
		}
		v := gjson.ParseBytes(b)
		body := v.Get("body")
		if !body.IsObject() {
			return nil, fmt.Errorf("openai line %d: body is not an object", line)
		}
		rec := OpenAIRecord{
			TimestampMS: v.Get("timestamp_ms").Float(),
			Path:        v.Get("path").String(),
			Body:        []byte(body.Raw),
		}
		if rec.Path == "" {
			rec.Path = "/v1/chat/completions"
		}
		v.Get("headers").ForEach(func(k, h gjson.Result) bool {
			rec.Headers = append(rec.Headers, [2]string{strings.ToLower(k.String()), h.String()})
			return true
		})
		switch {
		case v.Get("output_tokens").Exists():
			rec.OutputTokens = int(v.Get("output_tokens").Int())
		case body.Get("max_completion_tokens").Exists():
			rec.OutputTokens = int(body.Get("max_completion_tokens").Int())
		case body.Get("max_tokens").Exists():
			rec.OutputTokens = int(body.Get("max_tokens").Int())
		default:
			rec.OutputTokens = 128
		}
		out = append(out, rec)
		if limit > 0 && len(out) >= limit {
			break
		}
	}
	return out, sc.Err()
}

// OpenAIRequests turns records into requests. Hit accounting hashes the canonical
// prompt in 64-character blocks as a chain (the replayer's own hashing, not
// kvroute's), so each block is 64/charsPerToken tokens. Requests are put in arrival
// order.
func OpenAIRequests(recs []OpenAIRecord, charsPerToken int, speed float64) []*Request {
	sorted := make([]int, len(recs))
	for i := range sorted {
		sorted[i] = i
	}
	sort.SliceStable(sorted, func(a, b int) bool { return recs[sorted[a]].TimestampMS < recs[sorted[b]].TimestampMS })
	out := make([]*Request, len(recs))
	t0 := 0.0
	if len(recs) > 0 {
		t0 = recs[sorted[0]].TimestampMS
	}
	for i, k := range sorted {
		rec := &recs[k]
		body := gjson.ParseBytes(rec.Body)
		text, tokens, model := canonicalPrompt(rec.Path, rec.Body, charsPerToken)
		r := &Request{
			Index:        i,
			ArrivalMS:    (rec.TimestampMS - t0) / speed,
			Path:         rec.Path,
			Model:        model,
			Headers:      rec.Headers,
			Conversation: conversationID(rec.Headers, body),
			InputTokens:  tokens,
			OutputTokens: rec.OutputTokens,
			BlockTokens:  max(1, 64/charsPerToken),
		}
		r.text = func() []byte { return text }
		r.body = func() []byte { return rec.Body }
		out[i] = r
	}
	return out
}

// useChainAsBlocks makes the 64-byte chain hashes the accounting blocks (OpenAI
// traces: there are no block ids in the trace).
func useChainAsBlocks(reqs []*Request) {
	for _, r := range reqs {
		r.Blocks = r.Chain64
	}
}

func conversationID(headers [][2]string, body gjson.Result) string {
	for _, name := range conversationHeaders {
		for _, h := range headers {
			if h[0] == name && h[1] != "" {
				return h[1]
			}
		}
	}
	for _, path := range conversationBodyFields {
		v := body.Get(path)
		if v.IsObject() {
			v = v.Get("id")
		}
		if (v.Type == gjson.String && v.Str != "") || v.Type == gjson.Number {
			return v.String()
		}
	}
	return ""
}

// canonicalPrompt is the prompt text the routers hash and its token estimate: kvroute's
// own canonical prompt (extract.Extract, docs/behaviour.md, Reading the request), so
// the hit accounting and the baselines hash exactly what the filter hashes. A body the
// filter cannot read has no prompt (kvroute fails open on it) and one token.
func canonicalPrompt(path string, body []byte, charsPerToken int) (text []byte, tokens int, model string) {
	var req extract.Request
	opt := extract.ExtractOptions{CharsPerToken: charsPerToken}
	if err := extract.Extract(extract.APIForPath(path), body, opt, &req); err != nil {
		return nil, 1, ""
	}
	return req.Prompt, max(req.Tokens, 1), req.Model
}
