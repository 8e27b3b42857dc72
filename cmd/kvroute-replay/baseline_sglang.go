package main

// sglangCacheAware is the published rule of SGLang's router --policy cache_aware
// (github.com/sgl-project/sglang, sgl-router/src/policies/cache_aware.rs,
// CacheAwarePolicy::select_worker; defaults from sgl-router/py_src/sglang_router/
// router_args.py: cache_threshold 0.3, balance_abs_threshold 64,
// balance_rel_threshold 1.5, max_tree_size 2^26):
//
//  1. The load of a worker is its count of in-flight requests. The system is
//     imbalanced when max − min > balance_abs_threshold AND max > min ×
//     balance_rel_threshold; then the request goes to the least-loaded worker
//     (the first of equals) and its text is still inserted into that worker's tree.
//  2. Otherwise the approximate radix tree (raw text per worker, built from the
//     requests the router sent, never from the engines) gives the worker with the
//     longest prefix match. If matched chars / request chars > cache_threshold the
//     request goes there, else to the worker with the smallest tree (most free
//     cache, as the router guesses it). The text is inserted into the chosen
//     worker's tree.
//  3. A background thread evicts least-recently-used leaves from a worker's tree
//     beyond max_tree_size characters.
//
// Modelling choices: the character tree is kept at 64-byte granularity (chain hashes
// of 64-byte chunks; a match is a whole number of chunks, within 63 characters of
// the character-level match, immaterial against a 0.3 threshold), and eviction runs
// on insert instead of every eviction_interval_secs (2^26 characters per worker is
// never reached by the shipped traces). When several workers share the longest
// match the most recent one wins (the Rust tree returns an arbitrary one).
type sglangCacheAware struct {
	cacheThreshold float64
	absThreshold   int
	relThreshold   float64
	trees          []*LRU // per target: 64-byte chunk hashes of the text routed there
	tieStart       int    // where the search for the smallest tree starts (a replay's draw)
}

const sglangChunk = 64

func newSGLangCacheAware(n int) *sglangCacheAware {
	p := &sglangCacheAware{cacheThreshold: 0.3, absThreshold: 64, relThreshold: 1.5}
	for i := 0; i < n; i++ {
		p.trees = append(p.trees, NewLRU((1<<26)/sglangChunk))
	}
	return p
}

func (p *sglangCacheAware) Name() string { return "sglang-cache-aware" }

func (p *sglangCacheAware) Choose(r *Request, f *Fleet) int {
	chunks := r.Full64()
	maxLoad, minLoad, minIdx := -1, -1, 0
	for i := 0; i < f.N(); i++ {
		l := f.InFlight(i)
		if l > maxLoad {
			maxLoad = l
		}
		if minLoad < 0 || l < minLoad {
			minLoad, minIdx = l, i
		}
	}
	if maxLoad-minLoad > p.absThreshold && float64(maxLoad) > float64(minLoad)*p.relThreshold {
		p.insert(minIdx, chunks)
		return minIdx
	}
	matched, best := p.prefixMatch(chunks, f.N())
	choice := best
	rate := 0.0
	if r.TextLen > 0 {
		rate = float64(matched*sglangChunk) / float64(r.TextLen)
	}
	if rate <= p.cacheThreshold {
		choice = p.smallestTree(f.N())
	}
	p.insert(choice, chunks)
	return choice
}

// prefixMatch returns the longest match in chunks over all trees and the tree that
// holds it (the most recently touched of equals), over the n workers in the fleet.
func (p *sglangCacheAware) prefixMatch(chunks []uint64, n int) (matched, tree int) {
	cands := make([]int, n)
	for i := range cands {
		cands[i] = i
	}
	next := make([]int, 0, len(p.trees))
	for k, h := range chunks {
		next = next[:0]
		for _, t := range cands {
			if p.trees[t].Contains(h) {
				next = append(next, t)
			}
		}
		if len(next) == 0 {
			break
		}
		cands, next = next, cands
		matched = k + 1
	}
	if matched == 0 {
		return 0, 0
	}
	best, bestStamp := cands[0], uint64(0)
	for _, t := range cands {
		if s, _ := p.trees[t].Stamp(chunks[matched-1]); s > bestStamp {
			best, bestStamp = t, s
		}
	}
	return matched, best
}

// smallestTree is the worker of the n in the fleet with the fewest characters in its
// tree, the first of equals counting from tieStart (Rust's min_by_key over a HashMap
// has no fixed order).
func (p *sglangCacheAware) smallestTree(n int) int {
	best := p.tieStart % n
	for k := 1; k < n; k++ {
		i := (p.tieStart + k) % n
		if p.trees[i].Len() < p.trees[best].Len() {
			best = i
		}
	}
	return best
}

// insert records the text's chunks under tree t, prefix most recent (the tree evicts
// leaves first).
func (p *sglangCacheAware) insert(t int, chunks []uint64) {
	for i := len(chunks) - 1; i >= 0; i-- {
		p.trees[t].Touch(chunks[i])
	}
}

func (p *sglangCacheAware) Done(*Request, int) {}
