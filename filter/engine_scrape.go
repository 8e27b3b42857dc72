package main

import (
	"strconv"

	"github.com/kvroute/kvroute/routing"
	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/engine"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
)

// Engine metrics (docs/behaviour.md, Engine-reported load): every
// engine_metrics.interval_ms the VM that holds the scrape lease asks every endpoint for
// its Prometheus page, through engine_metrics.cluster with the endpoint in the destination
// header, and publishes the running, waiting and KV figures per DP rank for every VM's
// decisions. A failed or unparsable scrape publishes nothing and counts
// kvroute_engine_scrape_failures: the previous figures age out after
// engine_metrics.stale_ms. Scrapes never touch a request.

// vmID tells the VMs of one Envoy apart for the scrape and discovery leases; it
// comes from routing.NewVMIdentity like the prefix journals' identities.
var vmID uint64 = 1

func (p *pluginContext) scrapeEngines(now int64) {
	cfg := &p.cfg.EngineMetrics
	if !cfg.Enabled || now-p.lastScrape < cfg.IntervalMS && now >= p.lastScrape {
		return
	}
	p.lastScrape = now
	held, err := p.scrapeLease.TryAcquire(vmID, now, 3*cfg.IntervalMS)
	if err != nil {
		p.metrics.stateConflicts.Increment(1)
		return
	}
	if !held {
		return
	}
	for _, f := range p.fleets.All() {
		router := f.Router
		for _, prefill := range []bool{false, true} {
			// The endpoints routed to now: static, or as last discovered.
			for _, e := range router.Endpoints(prefill) {
				prefill, endpoint := prefill, e
				headers := [][2]string{
					{":method", "GET"},
					{":path", cfg.Path},
					{":authority", endpoint.Address},
					{p.cfg.Headers.Destination, endpoint.Address},
				}
				_, err := proxywasm.DispatchHttpCall(cfg.Cluster, headers, nil, nil, uint32(cfg.IntervalMS),
					func(_, bodySize, _ int) { p.onScrape(router, prefill, endpoint, bodySize) })
				if err != nil {
					p.metrics.scrapeFailures.Increment(1)
					proxywasm.LogDebugf("kvroute: scrape of %s via cluster %q not sent: %v", endpoint.Address, cfg.Cluster, err)
				}
			}
		}
	}
}

func (p *pluginContext) onScrape(router *routing.Router, prefill bool, e config.Endpoint, bodySize int) {
	defer p.recoverFailOpen("engine scrape", nil)
	headers, _ := proxywasm.GetHttpCallResponseHeaders()
	status := 0
	for _, kv := range headers {
		if kv[0] == ":status" {
			status, _ = strconv.Atoi(kv[1])
		}
	}
	if status != 200 || bodySize <= 0 {
		// Status 0: no response at all (a timeout, a reset, no such cluster).
		p.metrics.scrapeFailures.Increment(1)
		proxywasm.LogDebugf("kvroute: scrape of %s answered %d", e.Address, status)
		return
	}
	body, err := proxywasm.GetHttpCallResponseBody(0, bodySize)
	if err != nil {
		p.metrics.scrapeFailures.Increment(1)
		return
	}
	figures, err := engine.ParseEngineMetrics(p.cfg.EngineMetrics.Flavor, body, e.DPSize, e.DPRankStart)
	if err != nil {
		p.metrics.scrapeFailures.Increment(1)
		proxywasm.LogDebugf("kvroute: scrape of %s unusable: %v", e.Address, err)
		return
	}
	if err := router.PublishEngineFigures(prefill, e.Address, figures); err != nil {
		p.metrics.stateConflicts.Increment(1)
	}
}
