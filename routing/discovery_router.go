package routing

import (
	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/discovery"
	"github.com/kvroute/kvroute/routing/state"
)

// poolDiscovery is what a Router keeps of a discovered pool: the board it reads, the
// generation it last applied, and the endpoints it applied.
type poolDiscovery struct {
	board   *discovery.EndpointBoard
	dpSize  int    // discovery.dp_size: for endpoints that name none
	applied uint64 // generation of the set in use; 0: the static endpoints
	eps     []config.Endpoint
	changes uint64 // sets applied
}

func newPoolDiscovery(store state.Store, ns, pool string, p config.Pool, retries int) *poolDiscovery {
	return &poolDiscovery{
		board:  discovery.NewEndpointBoard(store, ns, pool, *p.Discovery, retries),
		dpSize: p.Discovery.DPSize,
		eps:    p.Endpoints,
	}
}

// inUse reports whether the pool may route at all, now or once discovery answers: its
// ledger and prefix index are kept in step with the other VMs while it does.
func (ps *poolState) inUse() bool { return len(ps.targets.Targets) > 0 || ps.disc != nil }

// applyDiscovered brings every discovered pool to the set in shared data, if its
// generation moved since this VM last applied one. It costs one nine-byte read per
// discovered pool; the set itself is read only when it changed. A read that fails
// keeps the targets in use. It reports whether any pool's targets changed.
func (r *Router) applyDiscovered() bool {
	changed := false
	for _, ps := range [2]*poolState{r.decode, r.prefill} {
		d := ps.disc
		if d == nil {
			continue
		}
		gen, err := d.board.Generation()
		if err != nil || gen == d.applied || gen == 0 {
			continue
		}
		setGen, eps, ok, err := d.board.Read()
		if err != nil || !ok || setGen == d.applied {
			continue
		}
		d.applied = setGen
		d.changes++
		d.eps = d.endpoints(eps)
		ps.setTargets(d.eps)
		changed = true
	}
	return changed
}

// endpoints turns a discovered set into the pool's endpoints.
func (d *poolDiscovery) endpoints(eps []discovery.DiscoveredEndpoint) []config.Endpoint {
	out := make([]config.Endpoint, len(eps))
	for i, e := range eps {
		dp := e.DPSize
		if dp == 0 {
			dp = d.dpSize
		}
		out[i] = config.Endpoint{Address: e.Address, DPSize: dp, DPRankStart: e.DPRankStart}
	}
	return out
}

// RefreshDiscovered applies a newer discovered set, as the next decision would; the
// tick calls it so that gauges and scrapes follow the fleet without traffic. It reports
// whether the targets changed.
func (r *Router) RefreshDiscovered() bool { return r.applyDiscovered() }

// PublishDiscovered stores a good poll of a pool's source for every VM, and applies it
// here at once. A pool without discovery ignores it.
func (r *Router) PublishDiscovered(prefill bool, eps []discovery.DiscoveredEndpoint) error {
	ps := r.decode
	if prefill {
		ps = r.prefill
	}
	if ps.disc == nil {
		return nil
	}
	_, err := ps.disc.board.Publish(eps)
	r.applyDiscovered()
	return err
}

// Endpoints returns the endpoints a pool routes to now: the static ones, or the last
// discovered set this VM applied.
func (r *Router) Endpoints(prefill bool) []config.Endpoint {
	ps := r.decode
	if prefill {
		ps = r.prefill
	}
	if ps.disc != nil {
		return ps.disc.eps
	}
	if prefill {
		return r.cfg.Pools.Prefill.Endpoints
	}
	return r.cfg.Pools.Decode.Endpoints
}

// DiscoveryChanges counts the discovered sets this Router has applied, over both pools:
// when it moves, the target lists changed.
func (r *Router) DiscoveryChanges() uint64 {
	var n uint64
	for _, ps := range [2]*poolState{r.decode, r.prefill} {
		if ps.disc != nil {
			n += ps.disc.changes
		}
	}
	return n
}

// HasEndpoints reports whether the decode pool has an endpoint now, static or as last
// discovered (a newer discovered set is applied first).
func (r *Router) HasEndpoints() bool {
	r.applyDiscovered()
	return len(r.decode.targets.Targets) > 0
}

// InUse reports whether the Router may route at all, now or once discovery answers: a
// default fleet left empty beside models never does, and needs no tick work.
func (r *Router) InUse() bool { return r.decode.inUse() }
