package main

import (
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/internal/shareddata"
	"github.com/kvroute/kvroute/routing"
	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/discovery"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
)

// Discovered endpoints (docs/behaviour.md, Discovered endpoints): every
// discovery.interval_ms the VM that holds a pool's discovery lease asks the pool's
// source for its endpoints — Envoy's admin /clusters through discovery.cluster, or an
// endpoint list at discovery.path — and publishes a good answer for every VM, which
// applies it at its next decision. A failed, timed-out or unusable answer publishes
// nothing (the last good set stays) and counts kvroute_discovery_failures. Polls run
// on the tick, never on a request.

// discoveryPoll is one discovered pool's poller in this VM.
type discoveryPoll struct {
	router   *routing.Router // of the pool's fleet
	prefill  bool
	pool     string // for the log: the pool, after its fleet's model when it has one
	cfg      config.DiscoveryConfig
	path     string
	lease    *state.Lease
	last     int64 // when this VM last tried
	inFlight bool  // a poll was sent and has not answered
	sentAt   int64
	failing  bool // the last poll failed: the next failure logs only at debug
}

// discoveryTimeoutMS bounds one poll: the admin may take a while to write a large
// answer, and a poll that outlives its interval only delays the next one.
func discoveryTimeoutMS(intervalMS int64) int64 { return min(max(intervalMS, 1000), 10000) }

func (p *pluginContext) initDiscovery() {
	for _, f := range p.fleets.All() {
		cfg := f.Config
		for _, pool := range []struct {
			prefill bool
			name    string
			d       *config.DiscoveryConfig
		}{{false, "decode", cfg.Pools.Decode.Discovery}, {true, "prefill", cfg.Pools.Prefill.Discovery}} {
			if pool.d == nil {
				continue
			}
			path := pool.d.Path
			if pool.d.Source == config.DiscoveryEnvoyAdmin {
				path = discovery.EnvoyAdminPath(pool.d.ServiceCluster)
			}
			label := pool.name
			if f.Index >= 0 {
				label = "model " + strconv.Quote(f.Name) + " " + pool.name
			}
			// The lease lives in the fleet's namespace: each fleet's pool is polled
			// by one VM at a time.
			p.discovery = append(p.discovery, &discoveryPoll{
				router: f.Router, prefill: pool.prefill, pool: label, cfg: *pool.d, path: path,
				lease: discovery.NewDiscoveryLease(shareddata.Store{}, cfg.State.Namespace, pool.name, cfg.State.MaxCASRetries),
				last:  -pool.d.IntervalMS,
			})
		}
	}
}

// discoveryTick applies a set another VM published (so gauges and scrapes follow the
// fleet without traffic) and sends the polls that are due.
func (p *pluginContext) discoveryTick(now int64) {
	if len(p.discovery) == 0 {
		return
	}
	for _, d := range p.discovery {
		d.router.RefreshDiscovered() // a fleet with two discovered pools refreshes twice: cheap
	}
	p.followTargets()
	for _, d := range p.discovery {
		p.poll(d, now)
	}
}

func (p *pluginContext) poll(d *discoveryPoll, now int64) {
	timeout := discoveryTimeoutMS(d.cfg.IntervalMS)
	if now-d.last < d.cfg.IntervalMS && now >= d.last {
		return
	}
	if d.inFlight && now-d.sentAt < 2*timeout && now >= d.sentAt {
		return // Envoy answers every call, if only with its timeout
	}
	d.last = now
	held, err := d.lease.TryAcquire(vmID, now, 3*d.cfg.IntervalMS+timeout)
	if err != nil {
		p.metrics.stateConflicts.Increment(1)
		return
	}
	if !held {
		return
	}
	headers := [][2]string{
		{":method", "GET"},
		{":path", d.path},
		{":authority", discoveryAuthority(d.cfg.Cluster)},
		{"accept", "application/json"},
	}
	_, err = proxywasm.DispatchHttpCall(d.cfg.Cluster, headers, nil, nil, uint32(timeout),
		func(_, bodySize, _ int) { p.onDiscovery(d, bodySize) })
	if err != nil {
		p.discoveryFailed(d, "not sent via cluster %q: %v", d.cfg.Cluster, err)
		return
	}
	d.inFlight, d.sentAt = true, now
}

// discoveryAuthority is the host the poll names: an Istio cluster's service host,
// else the cluster's name (Envoy's admin answers any).
func discoveryAuthority(cluster string) string {
	if parts := strings.Split(cluster, "|"); len(parts) == 4 && parts[3] != "" {
		return parts[3]
	}
	return cluster
}

func (p *pluginContext) onDiscovery(d *discoveryPoll, bodySize int) {
	d.inFlight = false
	defer p.recoverFailOpen("discovery", nil)
	status := 0
	headers, _ := proxywasm.GetHttpCallResponseHeaders()
	for _, kv := range headers {
		if kv[0] == ":status" {
			status, _ = strconv.Atoi(kv[1])
		}
	}
	if status != 200 {
		// Status 0: no response at all (a timeout, a reset, no such cluster).
		p.discoveryFailed(d, "answered %d", status)
		return
	}
	if bodySize > discovery.MaxDiscoveryBodyBytes {
		p.discoveryFailed(d, "answer of %d bytes, more than %d", bodySize, discovery.MaxDiscoveryBodyBytes)
		return
	}
	var body []byte
	if bodySize > 0 {
		var err error
		if body, err = proxywasm.GetHttpCallResponseBody(0, bodySize); err != nil {
			p.discoveryFailed(d, "answer unreadable: %v", err)
			return
		}
	}
	var eps []discovery.DiscoveredEndpoint
	var err error
	if d.cfg.Source == config.DiscoveryEnvoyAdmin {
		eps, err = discovery.ParseEnvoyAdminClusters(body, d.cfg.ServiceCluster)
	} else {
		eps, err = discovery.ParseEndpointList(body)
	}
	if err != nil {
		p.discoveryFailed(d, "%v", err)
		return
	}
	if d.failing {
		proxywasm.LogInfof("kvroute: %s discovery answers again: %d endpoints", d.pool, len(eps))
		d.failing = false
	}
	if err := d.router.PublishDiscovered(d.prefill, eps); err != nil {
		p.metrics.stateConflicts.Increment(1)
	}
	p.followTargets()
}

// discoveryFailed counts a failed poll. The first of a run is a warning; repeats are
// debug lines, so a source that stays down does not fill the log.
func (p *pluginContext) discoveryFailed(d *discoveryPoll, format string, args ...any) {
	p.metrics.discoveryFailures.Increment(1)
	format = "kvroute: " + d.pool + " discovery keeps its last endpoints: " + format
	if d.failing {
		proxywasm.LogDebugf(format, args...)
		return
	}
	d.failing = true
	proxywasm.LogWarnf(format, args...)
}

// followTargets defines the gauges of targets that joined and zeroes those of targets
// that left, when the router's targets changed since it last looked.
func (p *pluginContext) followTargets() {
	var n uint64
	for _, f := range p.fleets.All() {
		n += f.Router.DiscoveryChanges()
	}
	if n == p.targetChanges {
		return
	}
	p.targetChanges = n
	p.metrics.followTargets(p.decodeTargets(), p.prefillTargets())
}

// maxTargetGauges bounds the targets one plugin defines gauges for: Envoy keeps a
// defined stat for the VM's life, and pod addresses churn with every rollout.
const maxTargetGauges = 4096

// followTargets makes the per-target gauges those of the decode and prefill targets:
// new targets get theirs (until maxTargetGauges), targets no longer there are set to
// zero. A target in both pools has the decode target's gauges.
func (m *metrics) followTargets(decode, prefill []routing.Target) {
	present := make(map[uint64]bool, len(decode)+len(prefill))
	define := func(targets []routing.Target, decodes bool) {
		for _, t := range targets {
			present[t.ID] = true
			g, ok := m.targets[t.ID]
			switch {
			case !ok && len(m.targets) < maxTargetGauges:
				m.targets[t.ID] = m.defineTargetGauges(t, decodes)
			case ok && decodes && g.rate == nil: // a prefill target now decodes too
				g.rate = m.targetGauge(TargetPrefillRate, t)
			}
		}
	}
	define(decode, true)
	define(prefill, false)
	for id := range m.targets {
		if !present[id] {
			m.setTargetLoad(id, routing.Load{})
		}
	}
}
