package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"sync"
)

// MooncakeRecord is one line of a Mooncake trace (github.com/kvcache-ai/Mooncake,
// FAST25-release/traces): arrival time in ms, prompt and output lengths in tokens and
// one hash id per 512-token block of the prompt; equal ids are equal (cacheable)
// prefix blocks.
type MooncakeRecord struct {
	Timestamp    float64  `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// MooncakeBlockTokens is the block size of Mooncake's hash_ids.
const MooncakeBlockTokens = 512

// ReadMooncake reads a Mooncake JSONL trace. limit > 0 keeps the first limit lines.
func ReadMooncake(r io.Reader, limit int) ([]MooncakeRecord, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	var out []MooncakeRecord
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(trimSpace(b)) == 0 {
			continue
		}
		var rec MooncakeRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("mooncake line %d: %v", line, err)
		}
		if rec.InputLength < 0 || rec.OutputLength < 0 {
			return nil, fmt.Errorf("mooncake line %d: negative length", line)
		}
		if want := (rec.InputLength + MooncakeBlockTokens - 1) / MooncakeBlockTokens; len(rec.HashIDs) != want {
			return nil, fmt.Errorf("mooncake line %d: %d hash_ids for input_length %d (want %d)",
				line, len(rec.HashIDs), rec.InputLength, want)
		}
		out = append(out, rec)
		if limit > 0 && len(out) >= limit {
			break
		}
	}
	return out, sc.Err()
}

// blockTexts turns Mooncake hash ids into fixed text blocks: blockTokens ×
// charsPerToken characters of words from a generator seeded by the id. Requests that
// share ids then share a textual prefix exactly as they shared KV blocks. Blocks are
// made once and kept (the whole Mooncake trace has ~44k distinct ids, ~90 MB).
type blockTexts struct {
	size int
	mu   sync.RWMutex
	m    map[uint64][]byte
}

func newBlockTexts(blockTokens, charsPerToken int) *blockTexts {
	return &blockTexts{size: blockTokens * charsPerToken, m: map[uint64][]byte{}}
}

func (b *blockTexts) get(id uint64) []byte {
	b.mu.RLock()
	t, ok := b.m[id]
	b.mu.RUnlock()
	if ok {
		return t
	}
	t = make([]byte, b.size)
	fillWords(t, id)
	b.mu.Lock()
	if old, ok := b.m[id]; ok {
		t = old
	} else {
		b.m[id] = t
	}
	b.mu.Unlock()
	return t
}

// prompt is the text of a request: its blocks in order, cut to inputTokens ×
// charsPerToken characters.
func (b *blockTexts) prompt(ids []uint64, chars int) []byte {
	out := make([]byte, 0, chars)
	for _, id := range ids {
		if len(out) >= chars {
			break
		}
		t := b.get(id)
		out = append(out, t[:min(len(t), chars-len(out))]...)
	}
	return out
}

// MooncakeRequests turns records into requests: POST /v1/completions with
// {"model":"mooncake","prompt":…,"max_tokens":output_length}.
func MooncakeRequests(recs []MooncakeRecord, charsPerToken int, speed float64) []*Request {
	texts := newBlockTexts(MooncakeBlockTokens, charsPerToken)
	out := make([]*Request, len(recs))
	t0 := 0.0
	if len(recs) > 0 {
		t0 = recs[0].Timestamp
	}
	for i := range recs {
		rec := &recs[i]
		chars := rec.InputLength * charsPerToken
		r := &Request{
			Index:        i,
			ArrivalMS:    (rec.Timestamp - t0) / speed,
			Path:         "/v1/completions",
			Model:        "mooncake",
			InputTokens:  rec.InputLength,
			OutputTokens: rec.OutputLength,
			Blocks:       rec.HashIDs,
			BlockTokens:  MooncakeBlockTokens,
		}
		r.text = func() []byte { return texts.prompt(rec.HashIDs, chars) }
		r.body = func() []byte { return completionBody("mooncake", r.text(), rec.OutputLength) }
		out[i] = r
	}
	return out
}

// completionBody builds a /v1/completions body around prompt, which must need no
// JSON escaping (the generated text is lower-case words and spaces).
func completionBody(model string, prompt []byte, maxTokens int) []byte {
	b := make([]byte, 0, len(prompt)+96)
	b = append(b, `{"model":`...)
	b = strconv.AppendQuote(b, model)
	b = append(b, `,"prompt":"`...)
	b = append(b, prompt...)
	b = append(b, `","max_tokens":`...)
	b = strconv.AppendInt(b, int64(maxTokens), 10)
	b = append(b, `,"stream":true}`...)
	return b
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r' || b[0] == '\n') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r' || b[len(b)-1] == '\n') {
		b = b[:len(b)-1]
	}
	return b
}
