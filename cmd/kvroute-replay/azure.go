package main

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/routing/hashx"
)

// AzureRecord is one row of an Azure LLM inference trace
// (github.com/Azure/AzurePublicDataset, AzureLLMInferenceTrace_*.csv):
// TIMESTAMP,ContextTokens,GeneratedTokens. It has no prefix information.
type AzureRecord struct {
	Time            time.Time
	ContextTokens   int
	GeneratedTokens int
}

// ReadAzure reads an Azure trace CSV. limit > 0 keeps the first limit rows.
func ReadAzure(r io.Reader, limit int) ([]AzureRecord, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = 3
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("azure: %v", err)
	}
	if strings.TrimSpace(strings.TrimPrefix(header[0], "\ufeff")) != "TIMESTAMP" {
		return nil, fmt.Errorf("azure: header %q: want TIMESTAMP,ContextTokens,GeneratedTokens", strings.Join(header, ","))
	}
	var out []AzureRecord
	for row := 2; ; row++ {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("azure row %d: %v", row, err)
		}
		ts, err := parseAzureTime(rec[0])
		if err != nil {
			return nil, fmt.Errorf("azure row %d: %v", row, err)
		}
		ctx, err1 := strconv.Atoi(strings.TrimSpace(rec[1]))
		gen, err2 := strconv.Atoi(strings.TrimSpace(rec[2]))
		if err1 != nil || err2 != nil || ctx < 0 || gen < 0 {
			return nil, fmt.Errorf("azure row %d: bad token counts %q, %q", row, rec[1], rec[2])
		}
		out = append(out, AzureRecord{Time: ts, ContextTokens: ctx, GeneratedTokens: gen})
		if limit > 0 && len(out) >= limit {
			break
		}
	}
	return out, nil
}

// parseAzureTime reads "2023-11-16 18:17:03.9799600" (up to 7 fractional digits).
func parseAzureTime(s string) (time.Time, error) {
	return time.Parse("2006-01-02 15:04:05.999999999", strings.TrimSpace(s))
}

// AzureRequests turns rows into /v1/completions requests with a unique random prompt
// each (nothing is shared, so every router's hit rate is 0 and the trace tests
// balance only). Arrival times are relative to the first row.
func AzureRequests(recs []AzureRecord, charsPerToken int, speed float64) []*Request {
	out := make([]*Request, len(recs))
	var t0 time.Time
	if len(recs) > 0 {
		t0 = recs[0].Time
	}
	for i := range recs {
		rec := &recs[i]
		chars := rec.ContextTokens * charsPerToken
		nBlocks := (rec.ContextTokens + MooncakeBlockTokens - 1) / MooncakeBlockTokens
		blocks := make([]uint64, nBlocks)
		for k := range blocks {
			blocks[k] = hashx.Mix64(uint64(i)<<24 | uint64(k) | 1<<63) // unique per request
		}
		seed := hashx.Mix64(uint64(i) + 0xa2a2)
		r := &Request{
			Index:        i,
			ArrivalMS:    float64(rec.Time.Sub(t0).Microseconds()) / 1000 / speed,
			Path:         "/v1/completions",
			Model:        "azure",
			InputTokens:  rec.ContextTokens,
			OutputTokens: rec.GeneratedTokens,
			Blocks:       blocks,
			BlockTokens:  MooncakeBlockTokens,
		}
		r.text = func() []byte {
			t := make([]byte, chars)
			fillWords(t, seed)
			return t
		}
		r.body = func() []byte { return completionBody("azure", r.text(), rec.GeneratedTokens) }
		out[i] = r
	}
	return out
}
