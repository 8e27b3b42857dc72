package validate

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	metricsv3 "github.com/envoyproxy/go-control-plane/envoy/config/metrics/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kvroute/kvroute/routing"
	"github.com/kvroute/kvroute/routing/config"
)

// envoyDefaultBufferLimit is Envoy's per-connection buffer limit when none is set.
const envoyDefaultBufferLimit = 1 << 20

// minStreamingTimeout is the shortest whole-request route timeout accepted (0, no
// timeout, is accepted too): Envoy's default of 15 s cuts streamed completions.
const minStreamingTimeout = 10 * time.Minute

// CheckBootstrap validates one Envoy bootstrap (as JSON) against Envoy's API and then
// against what kvroute needs. It returns the plugin configurations it found.
func CheckBootstrap(src string, js []byte) ([]config.Config, error) {
	b := &bootstrapv3.Bootstrap{}
	if err := UnmarshalEnvoy(js, b, 0); err != nil {
		return nil, fmt.Errorf("%s: Envoy API: %w", src, err)
	}
	c := &bootstrapCheck{src: src, b: b, clusters: map[string]*clusterv3.Cluster{}, routed: map[string]bool{}}
	for _, cl := range b.GetStaticResources().GetClusters() {
		c.clusters[cl.GetName()] = cl
	}
	if a := b.GetAdmin().GetAddress().GetSocketAddress(); a != nil {
		if ip, err := netip.ParseAddr(a.GetAddress()); err != nil || !ip.IsLoopback() {
			c.fail("admin listens on %q: keep the admin interface on a loopback address", a.GetAddress())
		}
	}
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				if hcm, ok := unpack(f.GetTypedConfig()).(*hcmv3.HttpConnectionManager); ok {
					c.checkHCM(l, hcm)
				}
			}
		}
	}
	if !c.wasmSeen {
		c.fail("no HTTP connection manager with the kvroute wasm filter")
	}
	for _, cfg := range c.cfgs {
		if cfg.EngineMetrics.Enabled && c.routed[cfg.EngineMetrics.Cluster] {
			c.fail("engine_metrics.cluster %q is reachable from a route: only the filter may use it", cfg.EngineMetrics.Cluster)
		}
	}
	c.checkAdminNotRouted()
	return c.cfgs, errors.Join(c.errs...)
}

type bootstrapCheck struct {
	src      string
	b        *bootstrapv3.Bootstrap
	clusters map[string]*clusterv3.Cluster
	routed   map[string]bool
	cfgs     []config.Config
	wasmSeen bool // a wasm filter was found, whether or not its configuration parsed
	errs     []error

	adminClusters []string // discovery clusters that reach the admin interface
}

func (c *bootstrapCheck) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("%s: %s", c.src, fmt.Sprintf(format, args...)))
}

func (c *bootstrapCheck) checkHCM(l *listenerv3.Listener, hcm *hcmv3.HttpConnectionManager) {
	where := fmt.Sprintf("listener %q", l.GetName())
	// The wasm filter: exactly one, before the router, which is last.
	var wasm *wasmfilterv3.Wasm
	wasmAt, routerAt := -1, -1
	filters := hcm.GetHttpFilters()
	for i, f := range filters {
		switch m := unpack(f.GetTypedConfig()).(type) {
		case *wasmfilterv3.Wasm:
			if wasm != nil {
				c.fail("%s: more than one wasm filter", where)
			}
			wasm, wasmAt = m, i
		default:
			if f.GetName() == "envoy.filters.http.router" {
				if routerAt >= 0 || i != len(filters)-1 {
					c.fail("%s: the router must be the last HTTP filter, and the only one", where)
				}
				routerAt = i
			}
		}
	}
	if wasm == nil {
		c.fail("%s: no kvroute wasm filter", where)
		return
	}
	c.wasmSeen = true
	if routerAt != len(filters)-1 || wasmAt > routerAt {
		c.fail("%s: the router must be the last HTTP filter, after the wasm filter", where)
	}
	cfg, ok := c.checkWasm(where, wasm.GetConfig())
	if !ok {
		return
	}
	c.cfgs = append(c.cfgs, cfg)

	// Owned headers removed before any filter and before route selection.
	removed := map[string]bool{}
	for _, ext := range hcm.GetEarlyHeaderMutationExtensions() {
		if hm, ok := unpack(ext.GetTypedConfig()).(*headermutationv3.HeaderMutation); ok {
			for _, m := range hm.GetMutations() {
				if r := m.GetRemove(); r != "" {
					removed[strings.ToLower(r)] = true
				}
			}
		}
	}
	for _, h := range OwnedHeaders(cfg) {
		if !removed[h] {
			c.fail("%s: early_header_mutation_extensions must remove %q (a client could steer routing when the filter is absent)", where, h)
		}
	}
	if err := trustedRankStripped(cfg, removed); err != nil {
		c.fail("%s: %v", where, err)
	}

	// Buffers: the filter buffers bodies up to max_body_bytes.
	if lim := bufferLimit(l.GetPerConnectionBufferLimitBytes()); lim <= cfg.MaxBodyBytes {
		c.fail("%s: per_connection_buffer_limit_bytes %d must exceed max_body_bytes %d (Envoy answers 413 past it)", where, lim, cfg.MaxBodyBytes)
	}

	// Routes: every cluster exists; at least one honours the destination; none of the
	// ORIGINAL_DST ones can be reached without a destination header.
	honoured := false
	overrideHosts := map[netip.AddrPort]bool{} // hosts of the routed override_host clusters
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for i, r := range vh.GetRoutes() {
			rw := fmt.Sprintf("%s: virtual host %q route %d", where, vh.GetName(), i)
			ra := r.GetRoute()
			if ra == nil {
				continue
			}
			name := ra.GetCluster()
			if name == "" {
				c.fail("%s: routes must name one cluster", rw)
				continue
			}
			c.routed[name] = true
			cl, ok := c.clusters[name]
			if !ok {
				c.fail("%s: cluster %q does not exist", rw, name)
				continue
			}
			if t := ra.GetTimeout(); t == nil || (t.AsDuration() != 0 && t.AsDuration() < minStreamingTimeout) {
				c.fail("%s: set route timeout to 0s (or at least %s): Envoy's default 15s cuts streamed completions", rw, minStreamingTimeout)
			}
			if lim := bufferLimit(cl.GetPerConnectionBufferLimitBytes()); lim <= cfg.MaxBodyBytes {
				c.fail("cluster %q: per_connection_buffer_limit_bytes %d must exceed max_body_bytes %d", name, lim, cfg.MaxBodyBytes)
			}
			switch kind, err := destinationKind(cl, []string{cfg.Headers.Destination}); {
			case err != nil:
				c.fail("cluster %q: %v", name, err)
			case kind == kindOriginalDst:
				honoured = true
				if !matchesHeaderPresent(r.GetMatch(), cfg.Headers.Destination) {
					c.fail("%s: a route to ORIGINAL_DST cluster %q must require the %s header (present_match), or requests without one fail", rw, name, cfg.Headers.Destination)
				}
			case kind == kindOverrideHost:
				honoured = true
				if len(cfg.Models) == 0 {
					c.requireMembers(name, cl, "pools.decode", cfg.Pools.Decode)
				}
				for ap := range clusterMembers(cl) {
					overrideHosts[ap] = true
				}
			}
		}
	}
	if !honoured {
		c.fail("%s: no route goes to a cluster that honours %s (override_host or ORIGINAL_DST with use_http_header)", where, cfg.Headers.Destination)
	}
	if len(cfg.Models) > 0 && len(overrideHosts) > 0 {
		// Each model's routes go to its own cluster: every decode endpoint must be a
		// host of one of them.
		for _, fv := range fleetViews(cfg) {
			for i, e := range fv.cfg.Pools.Decode.Endpoints {
				if ap, err := netip.ParseAddrPort(e.Address); err == nil && !overrideHosts[ap] {
					c.fail("%s: %spools.decode.endpoints[%d] %s is a host of no routed override_host cluster, so override_host would never choose it",
						where, fv.field, i, e.Address)
				}
			}
		}
	}

	for _, fv := range fleetViews(cfg) {
		c.checkFleetClusters(fv)
	}
	c.checkDiscovery(cfg)
	if err := CheckStatsTags(c.b.GetStatsConfig().GetStatsTags(), cfg); err != nil {
		c.fail("stats_tags: %v", err)
	}
}

// checkFleetClusters checks what one fleet (the top-level pools, or one of models)
// needs of the clusters the filter calls itself, and its endpoint addresses.
func (c *bootstrapCheck) checkFleetClusters(fv fleetView) {
	cfg := fv.cfg
	switch cfg.Disaggregation.Mode {
	case config.ModeVLLM, config.ModeTRTLLM, config.ModeSGLang:
		if fv.field != "" || len(cfg.Pools.Decode.Endpoints) > 0 || cfg.Pools.Decode.Discovery != nil {
			c.checkPrefillCluster(fv)
		}
	}
	if cfg.EngineMetrics.Enabled {
		name := cfg.EngineMetrics.Cluster
		if cl, ok := c.clusters[name]; !ok {
			if fv.field == "" {
				c.fail("engine_metrics.cluster %q does not exist", name)
			}
		} else {
			kind, err := destinationKind(cl, []string{cfg.Headers.Destination})
			switch {
			case err != nil:
				c.fail("cluster %q: %v", name, err)
			case kind == kindPlain:
				if fv.field == "" {
					c.fail("engine_metrics.cluster %q must honour the destination header (override_host or ORIGINAL_DST)", name)
				}
			case kind == kindOverrideHost:
				c.requireMembers(name, cl, fv.field+"pools.decode", cfg.Pools.Decode)
				c.requireMembers(name, cl, fv.field+"pools.prefill", cfg.Pools.Prefill)
			}
		}
	}

	// Every endpoint must be an IP:port: both override_host and ORIGINAL_DST match
	// addresses, not names.
	for _, p := range []struct {
		name string
		pool config.Pool
	}{{"pools.decode", cfg.Pools.Decode}, {"pools.prefill", cfg.Pools.Prefill}} {
		for i, e := range p.pool.Endpoints {
			if _, err := netip.ParseAddrPort(e.Address); err != nil {
				c.fail("%s%s.endpoints[%d].address %q: Envoy honours only IP:port destinations", fv.field, p.name, i, e.Address)
			}
		}
	}
}

func (c *bootstrapCheck) checkPrefillCluster(fv fleetView) {
	cfg := fv.cfg
	name := cfg.Disaggregation.PrefillCluster
	cl, ok := c.clusters[name]
	if !ok {
		c.fail("%sdisaggregation.prefill_cluster %q does not exist", fv.field, name)
		return
	}
	kind, err := destinationKind(cl, []string{cfg.Headers.Destination, cfg.Headers.PrefillDestination})
	switch {
	case err != nil:
		c.fail("cluster %q: %v", name, err)
	case kind == kindPlain:
		c.fail("%sdisaggregation.prefill_cluster %q must honour the destination header (override_host or ORIGINAL_DST)", fv.field, name)
	case kind == kindOverrideHost:
		c.requireMembers(name, cl, fv.field+"pools.prefill", cfg.Pools.Prefill)
	}
	if lim := bufferLimit(cl.GetPerConnectionBufferLimitBytes()); lim <= cfg.MaxBodyBytes {
		c.fail("cluster %q: per_connection_buffer_limit_bytes %d must exceed max_body_bytes %d", name, lim, cfg.MaxBodyBytes)
	}
}

// fleetView is the top-level pools or one fleet of models as the filter builds it: a
// Config with the fleet's pools and disaggregation, and the prefix its fields are
// named under ("" or "models[i].").
type fleetView struct {
	field string
	cfg   config.Config
}

func fleetViews(cfg config.Config) []fleetView {
	out := []fleetView{{"", cfg}}
	for i, m := range cfg.Models {
		fc := cfg
		fc.Models = nil
		fc.Pools, fc.Disaggregation = m.Pools, m.Disaggregation
		out = append(out, fleetView{fmt.Sprintf("models[%d].", i), fc})
	}
	return out
}

func (c *bootstrapCheck) checkWasm(where string, pc *wasmv3.PluginConfig) (config.Config, bool) {
	if !pc.GetFailOpen() && pc.GetFailurePolicy() != wasmv3.FailurePolicy_FAIL_OPEN {
		c.fail("%s: the wasm filter must fail open (fail_open: true)", where)
	}
	vm := pc.GetVmConfig()
	if vm.GetRuntime() != "envoy.wasm.runtime.v8" {
		c.fail("%s: vm_config.runtime %q: use envoy.wasm.runtime.v8", where, vm.GetRuntime())
	}
	if f := vm.GetCode().GetLocal().GetFilename(); vm.GetCode().GetRemote() == nil && !strings.HasSuffix(f, ".wasm") {
		c.fail("%s: vm_config.code must load the compiled kvroute .wasm (local filename or remote)", where)
	}
	sv, ok := unpack(pc.GetConfiguration()).(*wrapperspb.StringValue)
	if !ok {
		c.fail("%s: configuration must be a google.protobuf.StringValue holding kvroute's JSON", where)
		return config.Config{}, false
	}
	cfg, err := parsePluginConfig([]byte(sv.GetValue()))
	if err != nil {
		c.fail("%s: plugin configuration: %v", where, err)
		return config.Config{}, false
	}
	return cfg, true
}

func (c *bootstrapCheck) requireMembers(name string, cl *clusterv3.Cluster, poolName string, pool config.Pool) {
	members := clusterMembers(cl)
	for i, e := range pool.Endpoints {
		if ap, err := netip.ParseAddrPort(e.Address); err == nil && !members[ap] {
			c.fail("cluster %q: %s.endpoints[%d] %s is not one of its hosts, so override_host would never choose it", name, poolName, i, e.Address)
		}
	}
}

// OwnedHeaders lists the request headers the filter writes (and strips from clients).
// With trust_client_dp_rank the client may send the rank header, so it is left out.
func OwnedHeaders(cfg config.Config) []string {
	hs := []string{cfg.Headers.Destination}
	if !cfg.TrustClientDPRank {
		hs = append(hs, cfg.Headers.DPRank)
	}
	hs = append(hs, cfg.Headers.PrefillDestination, cfg.Headers.PrefillDPRank)
	if cfg.Headers.Decision != "" {
		hs = append(hs, cfg.Headers.Decision)
	}
	if cfg.Headers.Model != "" {
		hs = append(hs, cfg.Headers.Model)
	}
	return hs
}

// trustedRankStripped refuses trust_client_dp_rank while an early header mutation
// removes the rank header: the mutation runs before any filter, so the client's rank
// never reaches kvroute and the setting does nothing.
func trustedRankStripped(cfg config.Config, removed map[string]bool) error {
	if cfg.TrustClientDPRank && removed[cfg.Headers.DPRank] {
		return fmt.Errorf("trust_client_dp_rank is true, but an early header mutation removes %q before the filter runs, "+
			"so no client rank ever arrives: drop that removal (or set trust_client_dp_rank to false)", cfg.Headers.DPRank)
	}
	return nil
}

type destKind int

const (
	kindPlain destKind = iota
	kindOverrideHost
	kindOriginalDst
)

// destinationKind says how a cluster treats the destination header: override_host
// reading one of headers, ORIGINAL_DST taking one of them, or not at all. A cluster
// that honours some other header is an error.
func destinationKind(cl *clusterv3.Cluster, headers []string) (destKind, error) {
	if cl.GetType() == clusterv3.Cluster_ORIGINAL_DST {
		od := cl.GetOriginalDstLbConfig()
		if !od.GetUseHttpHeader() {
			return kindPlain, errors.New("ORIGINAL_DST without use_http_header follows the client's connection, not kvroute")
		}
		h := strings.ToLower(od.GetHttpHeaderName())
		for _, want := range headers {
			if h == want {
				return kindOriginalDst, nil
			}
		}
		return kindPlain, fmt.Errorf("ORIGINAL_DST reads header %q, kvroute writes %q", h, headers[0])
	}
	for _, p := range cl.GetLoadBalancingPolicy().GetPolicies() {
		oh, ok := unpack(p.GetTypedExtensionConfig().GetTypedConfig()).(*overridehostv3.OverrideHost)
		if !ok {
			continue
		}
		var seen []string
		for _, s := range oh.GetOverrideHostSources() {
			h := strings.ToLower(s.GetHeader())
			seen = append(seen, h)
			for _, want := range headers {
				if h == want {
					return kindOverrideHost, nil
				}
			}
		}
		return kindPlain, fmt.Errorf("override_host reads %v, kvroute writes %q", seen, headers[0])
	}
	return kindPlain, nil
}

func clusterMembers(cl *clusterv3.Cluster) map[netip.AddrPort]bool {
	out := map[netip.AddrPort]bool{}
	for _, lle := range cl.GetLoadAssignment().GetEndpoints() {
		for _, le := range lle.GetLbEndpoints() {
			sa := le.GetEndpoint().GetAddress().GetSocketAddress()
			ip, err := netip.ParseAddr(sa.GetAddress())
			if err != nil {
				continue
			}
			out[netip.AddrPortFrom(ip, uint16(sa.GetPortValue()))] = true
		}
	}
	return out
}

func matchesHeaderPresent(m *routev3.RouteMatch, header string) bool {
	for _, h := range m.GetHeaders() {
		if strings.EqualFold(h.GetName(), header) && h.GetPresentMatch() && !h.GetInvertMatch() {
			return true
		}
	}
	return false
}

func bufferLimit(v *wrapperspb.UInt32Value) int64 {
	if v == nil {
		return envoyDefaultBufferLimit
	}
	return int64(v.GetValue())
}

// TargetGaugeFamilies are the per-target gauges the filter defines for every decode
// target, and all but the rate for every prefill target (filter/metrics.go).
var TargetGaugeFamilies = []string{
	"kvroute_target_active_requests",
	"kvroute_target_cache_tokens",
	"kvroute_target_prefill_tokens_per_second",
}

// TargetGaugeName is the Envoy stat name of a target's gauge of family, as the filter
// defines it with Envoy's "wasmcustom." prefix for wasm-defined stats.
func TargetGaugeName(family string, t routing.Target) (name, endpointLabel string) {
	ep := strings.NewReplacer(".", "_", ":", "_").Replace(t.Address)
	return "wasmcustom." + family + "." + ep + ".rank_" + t.RankText, ep
}

// ExtractTags applies Envoy's regex tag extraction to a stat name: for each specifier
// whose regex matches, the first capture group is cut from the name and the second
// (or the first, when there is no second) is the tag's value. Every regex sees the
// full original name.
func ExtractTags(name string, specs []*metricsv3.TagSpecifier) (string, map[string]string, error) {
	tags := map[string]string{}
	cut := make([]bool, len(name))
	for _, s := range specs {
		if s.GetRegex() == "" {
			continue
		}
		re, err := regexp.Compile(s.GetRegex())
		if err != nil {
			return "", nil, fmt.Errorf("tag %q: %w", s.GetTagName(), err)
		}
		m := re.FindStringSubmatchIndex(name)
		if m == nil || len(m) < 4 || m[2] < 0 {
			continue
		}
		val := name[m[2]:m[3]]
		if len(m) >= 6 && m[4] >= 0 {
			val = name[m[4]:m[5]]
		}
		tags[s.GetTagName()] = val
		for i := m[2]; i < m[3]; i++ {
			cut[i] = true
		}
	}
	var b strings.Builder
	for i := range name {
		if !cut[i] {
			b.WriteByte(name[i])
		}
	}
	return b.String(), tags, nil
}

// CheckStatsTags requires the stats tags to turn every target's gauges (decode and
// prefill) into kvroute_target_<gauge>{kvroute_endpoint=...,kvroute_rank=...} and to
// leave the other kvroute stats alone.
func CheckStatsTags(specs []*metricsv3.TagSpecifier, cfg config.Config) error {
	var errs []error
	var targets []routing.Target
	for _, fv := range fleetViews(cfg) {
		targets = append(targets, routing.NewPoolTargets(fv.cfg.Pools.Decode).Targets...)
		targets = append(targets, routing.NewPoolTargets(fv.cfg.Pools.Prefill).Targets...)
	}
	for i, m := range cfg.Models {
		// Per-model counters carry the model as a label, like the filter names them.
		tag := config.ModelMetricTag(m.Names[0])
		for _, base := range []string{"wasmcustom.kvroute_model_requests_routed", "wasmcustom.kvroute_model_decision_sticky"} {
			name := base + "." + tag
			got, tags, err := ExtractTags(name, specs)
			if err != nil {
				return err
			}
			if want := map[string]string{"kvroute_model": tag}; got != base || !sameTags(tags, want) {
				errs = append(errs, fmt.Errorf("models[%d]: %s becomes %s%s, want %s%s", i, name, got, fmtTags(tags), base, fmtTags(want)))
			}
		}
	}
	for _, t := range targets {
		for _, family := range TargetGaugeFamilies {
			name, ep := TargetGaugeName(family, t)
			got, tags, err := ExtractTags(name, specs)
			if err != nil {
				return err
			}
			want := map[string]string{"kvroute_endpoint": ep, "kvroute_rank": strconv.Itoa(t.Rank)}
			if got != "wasmcustom."+family || !sameTags(tags, want) {
				errs = append(errs, fmt.Errorf("%s becomes %s%s, want wasmcustom.%s%s",
					name, got, fmtTags(tags), family, fmtTags(want)))
			}
		}
	}
	for _, plain := range []string{"wasmcustom.kvroute_requests_routed", "wasmcustom.kvroute_active_requests", "wasmcustom.kvroute_decision_sticky"} {
		if got, tags, err := ExtractTags(plain, specs); err == nil && (got != plain || len(tags) != 0) {
			errs = append(errs, fmt.Errorf("%s is changed to %s%s", plain, got, fmtTags(tags)))
		}
	}
	return errors.Join(errs...)
}

func sameTags(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func fmtTags(t map[string]string) string {
	var ks []string
	for k := range t {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var parts []string
	for _, k := range ks {
		parts = append(parts, fmt.Sprintf("%s=%q", k, t[k]))
	}
	return "{" + strings.Join(parts, ",") + "}"
}
