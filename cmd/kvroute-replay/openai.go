package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"sort"
	"strings"

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
		text, tokens := canonicalPrompt(rec.Path, body, charsPerToken)
		r := &Request{
			Index:        i,
			ArrivalMS:    (rec.TimestampMS - t0) / speed,
			Path:         rec.Path,
			Model:        body.Get("model").String(),
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

// canonicalPrompt is the prompt text the routers hash and its token estimate, after
// kvroute's canonical prompt (docs/behaviour.md, Reading the request): chat messages as
// role:text lines, a completions prompt (the first of a batch; token ids as 4 bytes each),
// responses instructions then input.
func canonicalPrompt(path string, body gjson.Result, charsPerToken int) ([]byte, int) {
	var b []byte
	tokens := -1
	switch path {
	case "/v1/chat/completions":
		b = appendMessages(b, body.Get("messages"))
	case "/v1/responses":
		if s := body.Get("instructions"); s.Type == gjson.String {
			b = append(b, "system:"...)
			b = append(b, s.Str...)
		}
		in := body.Get("input")
		if in.Type == gjson.String {
			if len(b) > 0 {
				b = append(b, '\n')
			}
			b = append(b, "user:"...)
			b = append(b, in.Str...)
		} else {
			if len(b) > 0 && len(in.Array()) > 0 {
				b = append(b, '\n')
			}
			b = appendMessages(b, in)
		}
	default: // /v1/completions
		p := body.Get("prompt")
		switch {
		case p.Type == gjson.String:
			b = append(b, p.Str...)
		case p.IsArray():
			items := p.Array()
			if len(items) == 0 {
				break
			}
			switch {
			case items[0].Type == gjson.String:
				b = append(b, items[0].Str...)
				n := 0
				for _, it := range items {
					n += len(it.Str)
				}
				tokens = n / charsPerToken
			case items[0].Type == gjson.Number:
				b = appendTokenIDs(b, items)
				tokens = len(items)
			case items[0].IsArray():
				first := items[0].Array()
				b = appendTokenIDs(b, first)
				tokens = 0
				for _, it := range items {
					tokens += len(it.Array())
				}
			}
		}
	}
	if tokens < 0 {
		tokens = len(b) / charsPerToken
	}
	return b, max(tokens, 1)
}

func appendMessages(b []byte, msgs gjson.Result) []byte {
	first := true
	msgs.ForEach(func(_, m gjson.Result) bool {
		if !first {
			b = append(b, '\n')
		}
		first = false
		b = append(b, m.Get("role").String()...)
		b = append(b, ':')
		c := m.Get("content")
		switch {
		case c.Type == gjson.String:
			b = append(b, c.Str...)
		case c.IsArray():
			c.ForEach(func(_, part gjson.Result) bool {
				if t := part.Get("text"); t.Type == gjson.String {
					b = append(b, t.Str...)
				} else {
					b = append(b, part.Raw...)
				}
				return true
			})
		}
		return true
	})
	return b
}

func appendTokenIDs(b []byte, ids []gjson.Result) []byte {
	var w [4]byte
	for _, id := range ids {
		binary.LittleEndian.PutUint32(w[:], uint32(id.Uint()))
		b = append(b, w[:]...)
	}
	return b
}
