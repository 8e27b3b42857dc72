package main

import "math/rand/v2"

// gieDefaultScorers is the Gateway API Inference Extension endpoint picker with its
// default scheduling profile (github.com/kubernetes-sigs/gateway-api-inference-
// extension, config/charts/inferencepool/templates/epp-config.yaml,
// default-plugins.yaml: queue-scorer weight 2, kv-cache-utilization-scorer weight 2,
// prefix-cache-scorer weight 3, then the max-score picker). Each scorer gives a
// target a score in [0, 1]; the weighted sum is maximised:
//
//   - prefix-cache-scorer (pkg/epp/scheduling/framework/plugins/multi/prefix/
//     plugin.go): the prompt is cut into 64-byte blocks (HashBlockSize), at most 256
//     of them (MaxPrefixBlocksToMatch; a trailing partial block is ignored), hashed
//     as a chain whose first element is the model name's hash. Walking the hashes in
//     order while any server holds the hash, every server that holds it gets +1; the
//     score is that count / number of hashes. After the pick (PreRequest) every hash
//     is added to the chosen server's LRU of 31250 entries (LRUCapacityPerServer).
//   - queue-scorer (plugins/scorer/queue.go): (max − q) / (max − min) over the
//     candidates' waiting-queue sizes q, 1 for all when they are equal.
//   - kv-cache-utilization-scorer (plugins/scorer/kvcache_utilization.go):
//     1 − KV-cache usage.
//   - max-score picker (plugins/picker/max_score_picker.go): shuffle, then the
//     highest score (a random one of equals).
//
// Modelling choice: the engine metrics (waiting requests, KV usage) are read from
// the fleet model exactly, at the instant of the decision. The endpoint picker
// scrapes them every 50 ms (its refresh-metrics-interval default, pkg/epp/server/
// runserver.go), so they are at most 50 ms old there: exact figures are the rule as
// published at its best. A draw of the replay reseeds the picker's shuffle.
type gieDefaultScorers struct {
	indexer   []*LRU // per target
	modelHash map[string]uint64
	rng       *rand.Rand
}

const (
	gieBlockSize       = 64
	gieMaxPrefixBlocks = 256
	gieLRUPerServer    = 31250
	gieWeightPrefix    = 3
	gieWeightQueue     = 2
	gieWeightKVCache   = 2
)

func newGIEDefaultScorers(n int, seed uint64) *gieDefaultScorers {
	p := &gieDefaultScorers{modelHash: map[string]uint64{}, rng: rand.New(rand.NewPCG(seed, 0x676965))}
	for i := 0; i < n; i++ {
		p.indexer = append(p.indexer, NewLRU(gieLRUPerServer))
	}
	return p
}

func (p *gieDefaultScorers) Name() string { return "gie-default-scorers" }

// hashes is GIE's hashPrompt: nil under one block, else the model hash and the chain
// of at most 256 full 64-byte blocks.
func (p *gieDefaultScorers) hashes(r *Request) []uint64 {
	full := r.Full64()
	if len(full) == 0 {
		return nil
	}
	full = full[:min(len(full), gieMaxPrefixBlocks)]
	mh, ok := p.modelHash[r.Model]
	if !ok {
		mh = hashString(0x6d6f64656c, r.Model)
		p.modelHash[r.Model] = mh
	}
	return append([]uint64{mh}, full...)
}

func (p *gieDefaultScorers) Choose(r *Request, f *Fleet) int {
	n := f.N()
	hashes := p.hashes(r)
	// prefix-cache-scorer: matchLongestPrefix
	match := make([]int, n)
	for _, h := range hashes {
		any := false
		for t := 0; t < n; t++ {
			if p.indexer[t].Contains(h) {
				match[t]++
				any = true
			}
		}
		if !any {
			break
		}
	}
	// queue-scorer
	minQ, maxQ := -1, -1
	queue := make([]int, n)
	for t := 0; t < n; t++ {
		queue[t] = f.Waiting(t)
		if minQ < 0 || queue[t] < minQ {
			minQ = queue[t]
		}
		if queue[t] > maxQ {
			maxQ = queue[t]
		}
	}
	// max-score picker: shuffle, then the highest score; a random one of equals.
	order := p.rng.Perm(n)
	best, bestScore := -1, 0.0
	for _, t := range order {
		prefix := 0.0
		if len(hashes) > 0 {
			prefix = float64(match[t]) / float64(len(hashes))
		}
		q := 1.0
		if maxQ != minQ {
			q = float64(maxQ-queue[t]) / float64(maxQ-minQ)
		}
		kv := 1 - f.KVUtilization(t)
		score := gieWeightPrefix*prefix + gieWeightQueue*q + gieWeightKVCache*kv
		if best < 0 || score > bestScore {
			best, bestScore = t, score
		}
	}
	// PreRequest: the indexer learns the choice.
	for _, h := range hashes {
		p.indexer[best].Touch(h)
	}
	return best
}

func (p *gieDefaultScorers) Done(*Request, int) {}
