package routing

import "strconv"

// Target is one (endpoint, DP rank) pair: the unit every decision, ledger entry and
// mapping is kept for. Its ID is a fingerprint of "address#rank", never a position in
// the config, so reordering or extending the config never misattributes state.
type Target struct {
	ID            uint64
	Address       string
	Rank          int
	DPSize        int    // of its endpoint; the rank header is sent only when > 1
	RankText      string // Rank in decimal, ready for a header
	BootstrapPort int    // sglang prefill endpoints
	Endpoint      int    // index of its endpoint in the pool, for per-endpoint health
}

// TargetID is the stable identity of (address, rank).
func TargetID(address string, rank int) uint64 {
	return FingerprintString(address + "#" + strconv.Itoa(rank))
}

// PoolTargets lists a pool's targets endpoint-first — e0r0, e1r0, e2r0, …, e0r1, e1r1,
// … — so that walking it in order puts consecutive choices on different machines.
type PoolTargets struct {
	Targets   []Target
	Endpoints []string
	byID      targetIndex
}

// NewPoolTargets expands a pool's endpoints into targets.
func NewPoolTargets(p Pool) *PoolTargets {
	pt := &PoolTargets{}
	maxDP := 0
	for _, e := range p.Endpoints {
		pt.Endpoints = append(pt.Endpoints, e.Address)
		if e.DPSize > maxDP {
			maxDP = e.DPSize
		}
	}
	for rank := 0; rank < maxDP; rank++ {
		for i, e := range p.Endpoints {
			dp := e.DPSize
			if dp < 1 {
				dp = 1
			}
			if rank >= dp {
				continue
			}
			bp := e.BootstrapPort
			if bp == 0 {
				bp = DefaultBootstrapPort
			}
			t := Target{
				ID:            TargetID(e.Address, rank),
				Address:       e.Address,
				Rank:          rank,
				DPSize:        dp,
				RankText:      strconv.Itoa(rank),
				BootstrapPort: bp,
				Endpoint:      i,
			}
			pt.Targets = append(pt.Targets, t)
		}
	}
	pt.byID = newTargetIndex(len(pt.Targets))
	for i, t := range pt.Targets {
		pt.byID.put(t.ID, i)
	}
	return pt
}

// Index returns the position of the target with this ID, or -1 when it is not (or no
// longer) configured.
func (pt *PoolTargets) Index(id uint64) int {
	return pt.byID.get(id)
}
