package main

import (
	"github.com/kvroute/kvroute/internal/shareddata"
	"github.com/kvroute/kvroute/routing"
	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/engine"
	"github.com/kvroute/kvroute/routing/extract"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

// pluginContext holds one configuration of the filter in one VM.
type pluginContext struct {
	types.DefaultPluginContext
	cfg     config.Config
	fleets  *routing.Fleets
	router  *routing.Router // the default fleet's: the top-level pools
	metrics *metrics
	routes  nameTable // route path → its extract.API
	owned   []string  // owned header names, stripped from every request
	roles   *headerRoles

	extractOpt  extract.ExtractOptions
	promptBuf   []byte // the canonical prompt of the request being decided
	lastScrape  int64
	scrapeLease *state.Lease

	discovery     []*discoveryPoll
	targetChanges uint64 // the fleets' DiscoveryChanges() when the gauges last followed

	catalogue  []byte                  // the answer to GET /v1/models
	gaugeLoads map[uint64]routing.Load // per target over every fleet, reused by the tick
}

// nowMS is the clock of the filter; Envoy serves it through WASI's clock.
var nowMS = wallClockMS

// tickPeriodMS is how often each VM shares its prefix records with the other VMs
// (and, less often, sweeps expired load).
const tickPeriodMS = 100

func (p *pluginContext) OnPluginStart(size int) types.OnPluginStartStatus {
	data, err := proxywasm.GetPluginConfiguration()
	if err != nil && err != types.ErrorStatusNotFound {
		proxywasm.LogCriticalf("kvroute: cannot read the plugin configuration: %v", err)
		return types.OnPluginStartStatusFailed
	}
	cfg, err := config.ParseConfig(data)
	if err != nil {
		proxywasm.LogCriticalf("kvroute: invalid configuration: %v", err)
		return types.OnPluginStartStatusFailed
	}
	p.cfg = cfg
	p.extractOpt = extract.ExtractOptions{CharsPerToken: cfg.CharsPerToken, BlockTokens: cfg.Prefix.BlockTokens}
	if cfg.Conversation.Enabled {
		p.extractOpt.BodyFields = cfg.Conversation.BodyFields
	}
	p.extractOpt = p.extractOpt.Prepared()
	p.fleets = routing.NewFleets(&p.cfg, shareddata.Store{}, func() int64 { return nowMS() })
	p.router = p.fleets.Default.Router
	p.catalogue = p.fleets.CatalogueBody()
	p.metrics = defineMetrics(p.decodeTargets(), p.prefillTargets())
	p.metrics.defineModelMetrics(p.fleets.Models)
	p.scrapeLease = engine.NewScrapeLease(shareddata.Store{}, cfg.State.Namespace, cfg.State.MaxCASRetries)
	p.initDiscovery()
	p.routes = nameTable{}
	for _, r := range cfg.Routes {
		p.routes.add(r, int(extract.APIForPath(r)))
	}
	h := cfg.Headers
	for _, name := range []string{h.Destination, h.DPRank, h.PrefillDestination, h.PrefillDPRank, h.Decision, h.Model} {
		if name != "" {
			p.owned = append(p.owned, name)
		}
	}
	p.roles = newHeaderRoles(p.owned, cfg.Conversation.Headers, cfg.Conversation.Enabled)
	if err := proxywasm.SetTickPeriodMilliSeconds(tickPeriodMS); err != nil {
		proxywasm.LogWarnf("kvroute: no tick: expired load is only ignored, not swept, and VMs do not share prefix records: %v", err)
	}
	proxywasm.LogInfof("kvroute: started with %d decode and %d prefill targets",
		len(p.router.DecodeTargets()), len(p.router.PrefillTargets()))
	for _, f := range p.fleets.Models {
		proxywasm.LogInfof("kvroute: model %q: %d decode and %d prefill targets",
			f.Name, len(f.Router.DecodeTargets()), len(f.Router.PrefillTargets()))
	}
	return types.OnPluginStartStatusOK
}

func (p *pluginContext) NewHttpContext(contextID uint32) types.HttpContext {
	return &httpContext{plugin: p, clientRank: routing.NoRank, fleet: p.fleets.Default}
}

// OnTick hands the VM's request counts to Envoy, shares prefix records between the
// VMs, writes this VM's batch of load
// changes (dropping expired slots) and reads the others', and sets the gauges from
// the ledger as it now stands.
func (p *pluginContext) OnTick() {
	defer p.recoverFailOpen("tick", nil)
	p.metrics.flushCounters()
	if p.cfg.Prefix.Enabled {
		if err := p.eachRouter((*routing.Router).SyncPrefixes); err != nil {
			p.metrics.stateConflicts.Increment(1)
		}
	}
	p.discoveryTick(nowMS())
	p.scrapeEngines(nowMS())
	if err := p.eachRouter((*routing.Router).FlushLoad); err != nil {
		p.metrics.stateConflicts.Increment(1)
	}
	p.setLoadGauges()
}

// OnPluginDone hands over what still waits for a tick — the counts, and the load
// changes of the VM's batch, which would otherwise count until the lease expires when
// a reconfiguration retires this plugin.
func (p *pluginContext) OnPluginDone() bool {
	defer p.recoverFailOpen("plugin done", nil)
	if p.metrics != nil {
		p.metrics.flushCounters()
	}
	if p.fleets != nil {
		if err := p.eachRouter((*routing.Router).FlushLoad); err != nil && p.metrics != nil {
			p.metrics.stateConflicts.Increment(1)
		}
	}
	return true
}

// recoverFailOpen, deferred by the plugin's callbacks and the prefill callback, turns
// a panic into a counted, logged fail-open; then (if not nil) lets the request go on
// as it is: a prefill callback resumes the request. The request callbacks recover in
// deferred closures of their own, which answer Continue (see failedOpen).
func (p *pluginContext) recoverFailOpen(where string, then func()) {
	if r := recover(); r != nil {
		p.failedOpen(where, r)
		if then != nil {
			then()
		}
	}
}

// failedOpen counts and logs a panic recovered in where. The request callbacks
// recover in a deferred closure of their own and call it: in wasm that spares each
// request a deferred call with arguments and a call of recoverFailOpen per callback.
func (p *pluginContext) failedOpen(where string, r any) {
	if p.metrics != nil {
		p.metrics.failOpen.Increment(1)
	}
	logFailOpen("kvroute: recovered in %s, failing open: %v", where, r)
}
