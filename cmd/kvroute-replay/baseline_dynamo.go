package main

import "math/rand/v2"

// dynamoKV is NVIDIA Dynamo's KV router with its defaults (github.com/ai-dynamo/dynamo,
// docs/router/kv_cache_routing.md and lib/kv-router/src/scheduling/selector.rs,
// DefaultWorkerSelector: kv_overlap_score_weight 1, router_temperature 0, KV events
// on). For each worker it computes
//
//	logit = overlap_score_weight × prefill_tokens / block_size + decode_blocks
//
// and takes the lowest, a random one of equals (temperature 0). prefill_tokens is
// what the worker would have to prefill with the request there: the prefill of the
// requests it holds that have not returned their first token, plus the request's
// tokens past its cached prefix on that worker. decode_blocks is the worker's active
// blocks with the request's added: the distinct blocks of its requests in flight
// (a prefix they share counts once; ActiveSequences keeps them by hash), freed at
// completion. The router learns of a prefill's end at the first token
// (MarkPrefillCompleted).
//
// Modelling choice: KV events give the router each worker's cached blocks; here the
// cached prefix is read from the fleet model exactly, as GIE's queues are, in the
// trace's blocks (which stand for the engine's). A draw of the replay reseeds the
// tie-break.
type dynamoKV struct {
	prefill   []int              // per worker: prefill tokens of requests before their first token
	active    []map[uint64]int   // per worker: block → requests in flight holding it
	pending   map[int]dynamoSent // request index → its prefill and worker, until its first token
	rng       *rand.Rand
	overlapWt float64
}

// dynamoSent is a request's prefill as the router charged it to its worker.
type dynamoSent struct {
	worker, tokens int
}

func newDynamoKV(n int, seed uint64) *dynamoKV {
	p := &dynamoKV{pending: map[int]dynamoSent{}, rng: rand.New(rand.NewPCG(seed, 0x64796e)), overlapWt: 1}
	for i := 0; i < n; i++ {
		p.prefill = append(p.prefill, 0)
		p.active = append(p.active, map[uint64]int{})
	}
	return p
}

func (p *dynamoKV) Name() string { return "dynamo-kv" }

func (p *dynamoKV) Choose(r *Request, f *Fleet) int {
	bt := max(r.BlockTokens, 1)
	var ties []int
	best := 0.0
	for w := 0; w < f.N(); w++ {
		own := p.own(r, f, w)
		newBlocks := 0
		for _, b := range r.Blocks {
			if p.active[w][b] == 0 {
				newBlocks++
			}
		}
		logit := p.overlapWt*float64(p.prefill[w]+own)/float64(bt) + float64(len(p.active[w])+newBlocks)
		switch {
		case ties == nil || logit < best:
			best, ties = logit, append(ties[:0], w)
		case logit == best:
			ties = append(ties, w)
		}
	}
	w := ties[p.rng.IntN(len(ties))]
	own := p.own(r, f, w)
	p.prefill[w] += own
	p.pending[r.Index] = dynamoSent{worker: w, tokens: own}
	for _, b := range r.Blocks {
		p.active[w][b]++
	}
	return w
}

// own is the tokens of r that worker w would prefill: those past the prefix it caches.
func (p *dynamoKV) own(r *Request, f *Fleet, w int) int {
	cached := 0
	for _, b := range r.Blocks {
		if !f.CacheHolds(w, b) {
			break
		}
		cached++
	}
	return max(r.InputTokens-cached*max(r.BlockTokens, 1), 0)
}

// FirstToken is MarkPrefillCompleted: the request's prefill leaves its worker's load.
func (p *dynamoKV) FirstToken(r *Request, _ int) {
	if s, ok := p.pending[r.Index]; ok {
		p.prefill[s.worker] -= s.tokens
		delete(p.pending, r.Index)
	}
}

// Done is Free: the request's blocks leave its worker's active set.
func (p *dynamoKV) Done(r *Request, w int) {
	p.FirstToken(r, w)
	for _, b := range r.Blocks {
		if p.active[w][b]--; p.active[w][b] <= 0 {
			delete(p.active[w], b)
		}
	}
}
