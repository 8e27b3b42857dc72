package main

import (
	"sort"
	"strconv"
)

// consistentHash places each request on a hash ring (Karger et al., "Consistent
// hashing and random trees", STOC 1997) keyed by its explicit conversation id, or,
// without one, by its first 512-token block of prompt text, so the turns of one
// conversation (and prompts sharing a first block) land together whatever the load.
// Each target has 160 virtual nodes, the count SGLang's and vLLM's routers use for
// --policy consistent_hash (sgl-router src/policies/consistent_hash.rs:
// VIRTUAL_NODES_PER_WORKER = 160, key "{worker_url}:{i}").
type consistentHash struct {
	ring []ringPoint
}

type ringPoint struct {
	hash   uint64
	target int
}

const virtualNodesPerTarget = 160

func newConsistentHash(cfg FleetConfig) *consistentHash { return newConsistentHashSalted(cfg, 0) }

// newConsistentHashSalted builds the ring with another hash function (salt > 0): the
// placement of a replay's draw, as another deployment's worker URLs would give.
func newConsistentHashSalted(cfg FleetConfig, salt uint64) *consistentHash {
	p := &consistentHash{}
	for t := 0; t < cfg.Targets(); t++ {
		for v := 0; v < virtualNodesPerTarget; v++ {
			p.ring = append(p.ring, ringPoint{hashString(0x7269_6e67+salt*0x9e3779b97f4a7c15, cfg.TargetName(t)+":"+strconv.Itoa(v)), t})
		}
	}
	sort.Slice(p.ring, func(i, j int) bool { return p.ring[i].hash < p.ring[j].hash })
	return p
}

func (p *consistentHash) Name() string { return "consistent-hash" }

func (p *consistentHash) Choose(r *Request, f *Fleet) int {
	key := r.FirstKey
	if r.Conversation != "" {
		key = hashString(0x636f6e76, r.Conversation)
	}
	i := sort.Search(len(p.ring), func(i int) bool { return p.ring[i].hash >= key })
	// Points of targets not in the fleet are passed over: the ring of the targets
	// that are. (No fleet: every target.)
	n := len(p.ring)
	if f != nil {
		n = f.N()
	}
	for k := 0; k < len(p.ring); k++ {
		if t := p.ring[(i+k)%len(p.ring)].target; t < n {
			return t
		}
	}
	return 0
}

func (p *consistentHash) Done(*Request, int) {}
