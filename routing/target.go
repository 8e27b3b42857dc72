package routing

import (
	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/hashx"
	"strconv"
)

// Target is one (endpoint, DP rank) pair: the unit every decision, ledger entry and
// mapping is kept for. Its ID is a fingerprint of "address#rank", never a position in
// the config, so reordering or extending the config never misattributes state.
//
// Rank is the worker's own rank, dp_rank_start + r for the endpoint's r-th rank: the
// number the rank header carries, so it names the engine that receives the request.
// The ID hashes that number too: when an operator changes dp_rank_start, a target's
// header, and so the engine it reaches, changes, and its state (conversations, prefix
// blocks, load) must not follow it to an engine that never saw those requests; it
// expires as a removed target's does. With dp_rank_start 0 the IDs are those of r.
type Target struct {
	ID            uint64
	Address       string
	Rank          int    // dp_rank_start + r
	DPSize        int    // of its endpoint; the rank header is sent only when > 1
	RankText      string // Rank in decimal, ready for a header
	BootstrapPort int    // sglang prefill endpoints
	EndpointFP    uint64 // hashx.FingerprintString(Address): the endpoint's key on the health board
}

// TargetID is the stable identity of (address, rank).
func TargetID(address string, rank int) uint64 {
	return hashx.FingerprintString(address + "#" + strconv.Itoa(rank))
}

// PoolTargets lists a pool's targets endpoint-first — e0r0, e1r0, e2r0, …, e0r1, e1r1,
// … — so that walking it in order puts consecutive choices on different machines.
type PoolTargets struct {
	Targets []Target
	byID    targetIndex
}

// NewPoolTargets expands a pool's endpoints into targets.
func NewPoolTargets(p config.Pool) *PoolTargets {
	pt := &PoolTargets{}
	maxDP := 0
	for _, e := range p.Endpoints {
		if e.DPSize > maxDP {
			maxDP = e.DPSize
		}
	}
	for rank := 0; rank < maxDP; rank++ {
		for _, e := range p.Endpoints {
			dp := e.DPSize
			if dp < 1 {
				dp = 1
			}
			if rank >= dp {
				continue
			}
			bp := e.BootstrapPort
			if bp == 0 {
				bp = config.DefaultBootstrapPort
			}
			worker := e.DPRankStart + rank
			t := Target{
				ID:            TargetID(e.Address, worker),
				Address:       e.Address,
				Rank:          worker,
				DPSize:        dp,
				RankText:      strconv.Itoa(worker),
				BootstrapPort: bp,
				EndpointFP:    hashx.FingerprintString(e.Address),
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
