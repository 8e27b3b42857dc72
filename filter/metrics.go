package main

import (
	"strings"

	"github.com/kvroute/kvroute/routing"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
)

// metrics are kvroute's Envoy stats (docs/metrics.md), all defined at plugin start so
// dashboards show zeros before the first request.
type metrics struct {
	// Counted on every request: added up in the VM and handed to Envoy on the tick,
	// one host call per counter a tick instead of two a request.
	requestsRouted  batchedCounter
	decisions       []batchedCounter // by routing.Kind
	pdDisaggregated batchedCounter
	pdDirect        batchedCounter
	// Summed over routed requests with a parsed body: their ratio is the prefix
	// hit rate.
	promptTokens  batchedCounter
	matchedTokens batchedCounter

	// Rare: counted at once.
	pdPrefillFailure  proxywasm.MetricCounter
	parseErrors       proxywasm.MetricCounter
	stateConflicts    proxywasm.MetricCounter
	ejections         proxywasm.MetricCounter
	failOpen          proxywasm.MetricCounter
	scrapeFailures    proxywasm.MetricCounter
	discoveryFailures proxywasm.MetricCounter

	decisionTime proxywasm.MetricHistogram // microseconds from body in to headers out, one decision in decisionTimeEvery
	decided      uint64                    // decisions this VM made, for sampling decisionTime

	activeRequests *ledgerGauge
	targets        map[uint64]*targetGauges // by target id, decode and prefill

	models        []modelMetrics // per fleet of models, in order
	modelNotFound proxywasm.MetricCounter

	names []string // the stat names built at run time, kept (keepName)
}

// keepName keeps a stat name built at run time referenced for the plugin's life.
// Envoy copies a name it is given; the SDK's host emulator, which every wasm test
// runs on, keys its stats by the guest's own bytes, which the collector would reuse
// once the name was dropped, and the stat would no longer be found by its name.
func (m *metrics) keepName(name string) string {
	m.names = append(m.names, name)
	return name
}

func defineMetrics(decode, prefill []routing.Target) *metrics {
	m := &metrics{
		requestsRouted:    batchedCounter{c: proxywasm.DefineCounterMetric("kvroute_requests_routed")},
		pdDisaggregated:   batchedCounter{c: proxywasm.DefineCounterMetric("kvroute_pd_disaggregated")},
		pdDirect:          batchedCounter{c: proxywasm.DefineCounterMetric("kvroute_pd_direct")},
		promptTokens:      batchedCounter{c: proxywasm.DefineCounterMetric("kvroute_prompt_tokens")},
		matchedTokens:     batchedCounter{c: proxywasm.DefineCounterMetric("kvroute_prefix_matched_tokens")},
		pdPrefillFailure:  proxywasm.DefineCounterMetric("kvroute_pd_prefill_failures"),
		parseErrors:       proxywasm.DefineCounterMetric("kvroute_parse_errors"),
		stateConflicts:    proxywasm.DefineCounterMetric("kvroute_state_conflicts"),
		ejections:         proxywasm.DefineCounterMetric("kvroute_endpoint_ejections"),
		failOpen:          proxywasm.DefineCounterMetric("kvroute_fail_open"),
		scrapeFailures:    proxywasm.DefineCounterMetric("kvroute_engine_scrape_failures"),
		discoveryFailures: proxywasm.DefineCounterMetric("kvroute_discovery_failures"),
		modelNotFound:     proxywasm.DefineCounterMetric("kvroute_model_not_found"),
		decisionTime:      proxywasm.DefineHistogramMetric("kvroute_decision_time_us"),
		activeRequests:    &ledgerGauge{g: proxywasm.DefineGaugeMetric("kvroute_active_requests")},
		targets:           map[uint64]*targetGauges{},
	}
	for _, k := range routing.Kinds() {
		name := "kvroute_decision_" + strings.ReplaceAll(k.String(), "-", "_")
		m.decisions = append(m.decisions, batchedCounter{c: proxywasm.DefineCounterMetric(m.keepName(name))})
	}
	m.followTargets(decode, prefill)
	return m
}

// The per-target gauges' families: each target's gauge is <family>.<endpoint>.rank_<r>.
const (
	TargetActiveRequests = "kvroute_target_active_requests"
	TargetCacheTokens    = "kvroute_target_cache_tokens"
	TargetPrefillRate    = "kvroute_target_prefill_tokens_per_second"
)

// TargetGaugeFamilies are the per-target gauges every decode target has. A prefill
// target has all but the rate, which kvroute times on decode targets only.
var TargetGaugeFamilies = []string{TargetActiveRequests, TargetCacheTokens, TargetPrefillRate}

// targetGauges are one target's gauges, set from the shared ledger.
type targetGauges struct {
	active *ledgerGauge // requests sent and not yet ended (on a prefill target: their prefill)
	cache  *ledgerGauge // the prefix cache decisions take it to hold, in tokens (0: unknown)
	rate   *ledgerGauge // its observed prefill rate, in tokens a second (0: none yet); nil on a prefill-only target
}

func (m *metrics) defineTargetGauges(t routing.Target, decode bool) *targetGauges {
	g := &targetGauges{active: m.targetGauge(TargetActiveRequests, t), cache: m.targetGauge(TargetCacheTokens, t)}
	if decode {
		g.rate = m.targetGauge(TargetPrefillRate, t)
	}
	return g
}

func (m *metrics) targetGauge(family string, t routing.Target) *ledgerGauge {
	return &ledgerGauge{g: proxywasm.DefineGaugeMetric(m.keepName(TargetGaugeName(family, t)))}
}

// TargetGaugeName is <family>.<endpoint>.rank_<r>, with the endpoint's '.' and ':'
// written as '_' so stats_tags can lift both into labels.
func TargetGaugeName(family string, t routing.Target) string {
	ep := strings.NewReplacer(".", "_", ":", "_").Replace(t.Address)
	return family + "." + ep + ".rank_" + t.RankText
}

// setTargetLoad sets a target's gauges to the ledger's figures.
func (m *metrics) setTargetLoad(id uint64, l routing.Load) {
	if g, ok := m.targets[id]; ok {
		g.active.set(l.Requests)
		g.cache.set(l.Cache)
		if g.rate != nil {
			g.rate.set(l.PrefillRate())
		}
	}
}

// decisionTimeEvery is how many decisions share one observation of
// kvroute_decision_time_us: a histogram record is a host call, which on every request
// would cost about what the decision itself does, and one in 16 describes the
// distribution as well at any rate a gateway sees.
const decisionTimeEvery = 16

// timeDecision says whether the decision about to be made is the one of its
// decisionTimeEvery that is timed.
func (m *metrics) timeDecision() bool {
	m.decided++
	return m.decided%decisionTimeEvery == 1
}

// ledgerGauge is a gauge that every VM sets to the same figure, read from the shared
// ledger. A VM writes it only when the figure moved since it last did: the VMs' views
// of the ledger converge within a tick, and so does the gauge.
type ledgerGauge struct {
	g       proxywasm.MetricGauge
	last    int64
	written bool
}

// set makes the gauge v through the ABI's only gauge write, an increment.
func (lg *ledgerGauge) set(v int64) {
	if lg.written && v == lg.last {
		return
	}
	if d := v - lg.g.Value(); d != 0 {
		lg.g.Add(d)
	}
	lg.last, lg.written = v, true
}

// batchedCounter is a counter whose increments wait in the VM until flush.
type batchedCounter struct {
	c proxywasm.MetricCounter
	n uint64
}

func (b *batchedCounter) add() { b.n++ }

func (b *batchedCounter) addN(n int) {
	if n > 0 {
		b.n += uint64(n)
	}
}

func (b *batchedCounter) flush() {
	if b.n > 0 {
		b.c.Increment(b.n)
		b.n = 0
	}
}

// flushCounters hands the VM's counts to Envoy; the tick calls it.
func (m *metrics) flushCounters() {
	m.requestsRouted.flush()
	for i := range m.decisions {
		m.decisions[i].flush()
	}
	m.pdDisaggregated.flush()
	m.pdDirect.flush()
	m.promptTokens.flush()
	m.matchedTokens.flush()
	m.flushModelCounters()
}
