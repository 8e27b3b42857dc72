package main

import (
	"strings"

	"github.com/kvroute/kvroute/routing"
	"github.com/kvroute/kvroute/routing/config"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
)

// Several models (docs/behaviour.md, Several models): the body's model picks the fleet
// whose Router decides; a model no fleet serves, with no top-level pool to take it, is
// answered here with a 404. Without models there is one fleet, the top-level pools,
// and none of this changes a request.

// catalogueRoute is the path of OpenAI's model list.
const catalogueRoute = "/v1/models"

// pickFleet chooses the fleet for the request's model, counts it and writes the model
// header. It returns false when the model is served by no fleet: the client has had
// its 404.
func (c *httpContext) pickFleet() bool {
	p := c.plugin
	f := p.fleets.Pick(c.req.Model)
	if f == nil {
		p.metrics.modelNotFound.Increment(1)
		c.answered = true
		_ = proxywasm.SendHttpResponse(404, [][2]string{{"content-type", "application/json"}},
			routing.ModelNotFoundBody(c.req.Model), -1)
		return false
	}
	c.fleet = f
	if f.Index >= 0 {
		p.metrics.models[f.Index].requests.add()
		if h := p.cfg.Headers.Model; h != "" {
			replaceRequestHeader(h, f.Name)
		}
	}
	return true
}

// countModelDecision counts the decision against the fleet's own counters.
func (c *httpContext) countModelDecision(k routing.Kind) {
	if i := c.fleet.Index; i >= 0 {
		c.plugin.metrics.models[i].decisions[k].add()
	}
}

// answerCatalogue answers GET /v1/models with the fleets' names, when models are
// configured; without them the request passes to the upstream as before.
func (c *httpContext) answerCatalogue() bool {
	p := c.plugin
	if len(p.fleets.Models) == 0 {
		return false
	}
	_ = proxywasm.SendHttpResponse(200, [][2]string{{"content-type", "application/json"}}, p.catalogue, -1)
	return true
}

// modelMetrics are one fleet's counters: kvroute_model_requests_routed.<name> and
// kvroute_model_decision_<kind>.<name>.
type modelMetrics struct {
	requests  batchedCounter
	decisions []batchedCounter // by routing.Kind
}

// defineModelMetrics defines the counters of every fleet of models, in order.
func (m *metrics) defineModelMetrics(fleets []*routing.Fleet) {
	m.models = make([]modelMetrics, len(fleets))
	for i, f := range fleets {
		tag := "." + config.ModelMetricTag(f.Name)
		m.models[i].requests = batchedCounter{c: proxywasm.DefineCounterMetric(m.keepName("kvroute_model_requests_routed" + tag))}
		for _, k := range routing.Kinds() {
			name := "kvroute_model_decision_" + strings.ReplaceAll(k.String(), "-", "_") + tag
			m.models[i].decisions = append(m.models[i].decisions, batchedCounter{c: proxywasm.DefineCounterMetric(m.keepName(name))})
		}
	}
}

func (m *metrics) flushModelCounters() {
	for i := range m.models {
		m.models[i].requests.flush()
		for j := range m.models[i].decisions {
			m.models[i].decisions[j].flush()
		}
	}
}

// decodeTargets are the decode targets of every fleet (a target two fleets share
// appears twice; its gauge carries the sum).
func (p *pluginContext) decodeTargets() []routing.Target {
	var out []routing.Target
	for _, f := range p.fleets.All() {
		out = append(out, f.Router.DecodeTargets()...)
	}
	return out
}

// prefillTargets are the prefill targets of every fleet.
func (p *pluginContext) prefillTargets() []routing.Target {
	var out []routing.Target
	for _, f := range p.fleets.All() {
		out = append(out, f.Router.PrefillTargets()...)
	}
	return out
}

// setLoadGauges sets the per-target gauges and the total from every fleet's ledger.
func (p *pluginContext) setLoadGauges() {
	if len(p.fleets.Models) == 0 && len(p.router.PrefillTargets()) == 0 {
		p.setRouterGauges(p.router)
		return
	}
	if p.gaugeLoads == nil {
		p.gaugeLoads = map[uint64]routing.Load{}
	}
	clear(p.gaugeLoads)
	var total int64
	for _, f := range p.fleets.All() {
		if !f.Router.InUse() {
			continue
		}
		loads, err := f.Router.Loads()
		if err != nil {
			return
		}
		prefill, err := f.Router.PrefillLoads()
		if err != nil {
			return
		}
		p.addGaugeLoads(f.Router.DecodeTargets(), loads)
		p.addGaugeLoads(f.Router.PrefillTargets(), prefill)
		for _, l := range loads {
			total += l.Requests // every request is on a decode target
		}
	}
	for id, l := range p.gaugeLoads {
		p.metrics.setTargetLoad(id, l)
	}
	p.metrics.activeRequests.set(total)
}

// addGaugeLoads adds one pool's loads to gaugeLoads. A target two fleets or both
// pools share carries the requests of all, and the cache and rate of the load that
// has timed the most of its prefill (a decode target's, since a prefill target is
// never timed).
func (p *pluginContext) addGaugeLoads(targets []routing.Target, loads []routing.Load) {
	for i, t := range targets {
		l, seen := p.gaugeLoads[t.ID]
		requests := l.Requests + loads[i].Requests
		if !seen || loads[i].RateMS > l.RateMS {
			l = loads[i]
		}
		l.Requests = requests
		p.gaugeLoads[t.ID] = l
	}
}

// setRouterGauges is the gauges of a single fleet.
func (p *pluginContext) setRouterGauges(r *routing.Router) {
	loads, err := r.Loads()
	if err != nil {
		return
	}
	var total int64
	for i, t := range r.DecodeTargets() {
		p.metrics.setTargetLoad(t.ID, loads[i])
		total += loads[i].Requests
	}
	p.metrics.activeRequests.set(total)
}

// eachRouter runs fn on every Router that may route: the tick's sharing and flushing.
// It returns the first error.
func (p *pluginContext) eachRouter(fn func(*routing.Router) error) error {
	var first error
	for _, f := range p.fleets.All() {
		if !f.Router.InUse() {
			continue
		}
		if err := fn(f.Router); err != nil && first == nil {
			first = err
		}
	}
	return first
}
