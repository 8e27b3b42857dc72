package validate

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	extensionsv1alpha1 "istio.io/api/extensions/v1alpha1"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	typev1beta1 "istio.io/api/type/v1beta1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/kvroute/kvroute/routing/config"
)

// CheckIstioSet checks a complete set of resources (a rendered kustomization) for what
// kvroute needs in a mesh: each WasmPlugin fails open, names its image and phase and
// parses with kvroute's own config parser; EnvoyFilters on the same workloads make the
// destination header honoured (override_host) on the cluster of every service the
// gateway routes to and of every cluster the plugin calls, remove the owned headers
// early, and raise the buffers above max_body_bytes.
func CheckIstioSet(name string, objs []*Object) ([]config.Config, error) {
	set := &istioSet{name: name, objs: objs, services: servicePorts(objs)}
	var cfgs []config.Config
	nPlugins := 0
	for _, o := range objs {
		if o.WasmPlugin == nil {
			continue
		}
		nPlugins++
		if cfg, ok := set.checkPlugin(o); ok {
			cfgs = append(cfgs, cfg)
		}
	}
	if nPlugins == 0 {
		set.fail("no WasmPlugin")
	}
	return cfgs, errors.Join(set.errs...)
}

// istioSet is one resource set under check and the problems found in it so far.
type istioSet struct {
	name     string
	objs     []*Object
	services map[string]map[uint32]bool // "name.ns" → ports; empty when the set has no Service
	errs     []error
}

func (s *istioSet) fail(f string, a ...any) {
	s.errs = append(s.errs, fmt.Errorf("%s: %s", s.name, fmt.Sprintf(f, a...)))
}

// servicePorts indexes the set's Services by "name.namespace".
func servicePorts(objs []*Object) map[string]map[uint32]bool {
	services := map[string]map[uint32]bool{}
	for _, o := range objs {
		if o.Service != nil {
			key := o.Meta.Name + "." + o.Meta.Namespace
			services[key] = map[uint32]bool{}
			for _, p := range o.Service.Spec.Ports {
				services[key][uint32(p.Port)] = true
			}
		}
	}
	return services
}

// pluginCheck is the check of one WasmPlugin against the rest of the set.
type pluginCheck struct {
	set   *istioSet
	where string // "WasmPlugin ns/name", the prefix of every problem
	cfg   config.Config
	mesh  meshPatches
}

func (p *pluginCheck) fail(f string, a ...any) {
	p.set.fail("%s: %s", p.where, fmt.Sprintf(f, a...))
}

// checkPlugin checks one WasmPlugin and what the set provides for it, and returns its
// parsed config when the config parses.
func (s *istioSet) checkPlugin(o *Object) (config.Config, bool) {
	wp := o.WasmPlugin
	p := &pluginCheck{set: s, where: fmt.Sprintf("WasmPlugin %s/%s", o.Meta.Namespace, o.Meta.Name)}
	p.checkPluginFields(wp)
	target, gateways, ok := pluginTarget(wp.GetSelector(), wp.GetTargetRefs(), o.Meta.Namespace)
	if !ok {
		p.fail("set selector or targetRefs (without them the plugin applies to every workload of the namespace)")
	}
	cfg, ok := p.parseConfig(wp)
	if !ok {
		return config.Config{}, false
	}
	p.cfg = cfg
	p.checkEndpointAddresses()
	p.mesh = s.meshPatchesFor(o.Meta.Namespace, target, cfg)
	p.checkOwnedHeadersRemoved()
	p.checkBufferLimits()
	if routes := p.checkRoutedServices(gateways); routes == 0 && len(p.mesh.overrideHost) == 0 {
		p.fail("no EnvoyFilter sets override_host (reading %s) on any cluster", cfg.Headers.Destination)
	}
	p.checkPrefillCluster()
	p.checkEngineMetricsCluster()
	checkIstioDiscovery(cfg, p.mesh.addedClusters, p.needOverrideHost, p.needService, p.fail)
	return cfg, true
}

// checkPluginFields checks the WasmPlugin's own fields: fail open, an image URL, a phase
// and the HTTP type.
func (p *pluginCheck) checkPluginFields(wp *extensionsv1alpha1.WasmPlugin) {
	if wp.GetFailStrategy() != extensionsv1alpha1.FailStrategy_FAIL_OPEN {
		p.fail("failStrategy must be FAIL_OPEN")
	}
	if u := wp.GetUrl(); !strings.HasPrefix(u, "oci://") && !strings.HasPrefix(u, "https://") && !strings.HasPrefix(u, "file://") {
		p.fail("url %q: use oci://<registry>/<repository>:<tag> (the image `make image` builds)", u)
	}
	if wp.GetPhase() == extensionsv1alpha1.PluginPhase_UNSPECIFIED_PHASE {
		p.fail("set phase (STATS: after authentication and authorization, before the router)")
	}
	if wp.GetType() != extensionsv1alpha1.PluginType_HTTP {
		p.fail("type must be HTTP")
	}
}

// parseConfig parses pluginConfig with kvroute's own parser.
func (p *pluginCheck) parseConfig(wp *extensionsv1alpha1.WasmPlugin) (config.Config, bool) {
	js, err := pluginConfigJSON(wp)
	if err != nil {
		p.fail("pluginConfig: %v", err)
		return config.Config{}, false
	}
	cfg, err := config.ParseConfig(js)
	if err != nil {
		p.fail("pluginConfig: %v", err)
		return config.Config{}, false
	}
	return cfg, true
}

// checkEndpointAddresses checks that static endpoints are IP:port, the only form
// override_host honours.
func (p *pluginCheck) checkEndpointAddresses() {
	for _, fv := range fleetViews(p.cfg) {
		for _, pool := range []struct {
			name string
			pool config.Pool
		}{{"pools.decode", fv.cfg.Pools.Decode}, {"pools.prefill", fv.cfg.Pools.Prefill}} {
			for i, e := range pool.pool.Endpoints {
				if _, err := netip.ParseAddrPort(e.Address); err != nil {
					p.fail("pluginConfig.%s%s.endpoints[%d].address %q: override_host honours only IP:port (pod IPs)", fv.field, pool.name, i, e.Address)
				}
			}
		}
	}
}

// meshPatches is what the EnvoyFilters on a plugin's workloads provide.
type meshPatches struct {
	overrideHost     map[string][]string // "host:port" → headers override_host reads there
	smallClusterBufs []string            // "host:port" of cluster patches whose buffer is <= max_body_bytes
	removedEarly     map[string]bool     // lower-case headers an early header mutation removes
	addedClusters    map[string]bool     // names of the clusters EnvoyFilters add
	listenerBuf      int64               // the listeners' per-connection buffer limit
}

// meshPatchesFor gathers the MERGE patches (and the clusters ADD patches create) of the EnvoyFilters in namespace ns that
// attach to the same workloads (target) as the plugin.
func (s *istioSet) meshPatchesFor(ns, target string, cfg config.Config) meshPatches {
	m := meshPatches{
		overrideHost:  map[string][]string{},
		removedEarly:  map[string]bool{},
		addedClusters: map[string]bool{},
		listenerBuf:   envoyDefaultBufferLimit,
	}
	for _, e := range s.objs {
		ef := e.EnvoyFilter
		if ef == nil || e.Meta.Namespace != ns {
			continue
		}
		var sel *typev1beta1.WorkloadSelector
		if ws := ef.GetWorkloadSelector(); ws != nil {
			sel = &typev1beta1.WorkloadSelector{MatchLabels: ws.GetLabels()}
		}
		if t, _, _ := pluginTarget(sel, ef.GetTargetRefs(), e.Meta.Namespace); t != target {
			continue
		}
		for _, p := range ef.GetConfigPatches() {
			if p.GetApplyTo() == networkingv1alpha3.EnvoyFilter_CLUSTER && p.GetPatch().GetOperation() == networkingv1alpha3.EnvoyFilter_Patch_ADD {
				if cl := (&clusterv3.Cluster{}); envoyPatchValue(p, cl) {
					m.addedClusters[cl.GetName()] = true
				}
				continue
			}
			if p.GetPatch().GetOperation() != networkingv1alpha3.EnvoyFilter_Patch_MERGE {
				continue
			}
			switch p.GetApplyTo() {
			case networkingv1alpha3.EnvoyFilter_CLUSTER:
				m.addClusterPatch(p, cfg)
			case networkingv1alpha3.EnvoyFilter_LISTENER:
				l := &listenerv3.Listener{}
				if envoyPatchValue(p, l) && l.GetPerConnectionBufferLimitBytes() != nil {
					m.listenerBuf = bufferLimit(l.GetPerConnectionBufferLimitBytes())
				}
			case networkingv1alpha3.EnvoyFilter_NETWORK_FILTER:
				f := &listenerv3.Filter{}
				if envoyPatchValue(p, f) {
					m.addEarlyRemovals(f)
				}
			}
		}
	}
	return m
}

// addClusterPatch records a cluster patch's override_host headers and a buffer limit
// too small for max_body_bytes.
func (m *meshPatches) addClusterPatch(p *networkingv1alpha3.EnvoyFilter_EnvoyConfigObjectPatch, cfg config.Config) {
	cm := p.GetMatch().GetCluster()
	cl := &clusterv3.Cluster{}
	if cm == nil || !envoyPatchValue(p, cl) {
		return
	}
	key := cm.GetService() + ":" + strconv.Itoa(int(cm.GetPortNumber()))
	if kind, err := destinationKind(cl, []string{cfg.Headers.Destination, cfg.Headers.PrefillDestination}); err == nil && kind == kindOverrideHost {
		m.overrideHost[key] = overrideHeaders(cl)
	}
	if bufferLimit(cl.GetPerConnectionBufferLimitBytes()) <= cfg.MaxBodyBytes {
		m.smallClusterBufs = append(m.smallClusterBufs, key)
	}
}

// addEarlyRemovals records the headers an HTTP connection manager's early header
// mutations remove.
func (m *meshPatches) addEarlyRemovals(f *listenerv3.Filter) {
	hcm, ok := unpack(f.GetTypedConfig()).(*hcmv3.HttpConnectionManager)
	if !ok {
		return
	}
	for _, ext := range hcm.GetEarlyHeaderMutationExtensions() {
		if hm, ok := unpack(ext.GetTypedConfig()).(*headermutationv3.HeaderMutation); ok {
			for _, mu := range hm.GetMutations() {
				if r := mu.GetRemove(); r != "" {
					m.removedEarly[strings.ToLower(r)] = true
				}
			}
		}
	}
}

// checkOwnedHeadersRemoved checks that every header kvroute owns is removed before the
// plugin runs, so a client cannot steer routing when the plugin is absent.
func (p *pluginCheck) checkOwnedHeadersRemoved() {
	for _, h := range OwnedHeaders(p.cfg) {
		if !p.mesh.removedEarly[h] {
			p.fail("no EnvoyFilter on the same workloads removes %q with an early header mutation (a client could steer routing when the plugin is absent)", h)
		}
	}
	if err := trustedRankStripped(p.cfg, p.mesh.removedEarly); err != nil {
		p.fail("%v", err)
	}
}

// checkBufferLimits checks that listeners and patched clusters buffer more than
// max_body_bytes.
func (p *pluginCheck) checkBufferLimits() {
	if p.mesh.listenerBuf <= p.cfg.MaxBodyBytes {
		p.fail("no EnvoyFilter raises the listeners' per_connection_buffer_limit_bytes above max_body_bytes %d (Envoy answers 413 past it)", p.cfg.MaxBodyBytes)
	}
	sort.Strings(p.mesh.smallClusterBufs)
	for _, k := range p.mesh.smallClusterBufs {
		p.fail("the cluster patch for %s must raise per_connection_buffer_limit_bytes above max_body_bytes %d", k, p.cfg.MaxBodyBytes)
	}
}

// checkRoutedServices checks that every Service an HTTPRoute on the plugin's gateways
// routes to honours the destination header and exists in the set; it returns how many
// backends it checked.
func (p *pluginCheck) checkRoutedServices(gateways map[string]bool) int {
	routes := 0
	for _, r := range p.set.objs {
		hr := r.HTTPRoute
		if hr == nil || !routeAttaches(hr.Spec.ParentRefs, r.Meta.Namespace, gateways) {
			continue
		}
		for _, rule := range hr.Spec.Rules {
			for _, br := range rule.BackendRefs {
				if br.Kind != nil && *br.Kind != "Service" {
					continue
				}
				ns := r.Meta.Namespace
				if br.Namespace != nil {
					ns = string(*br.Namespace)
				}
				var port uint32
				if br.Port != nil {
					port = uint32(*br.Port)
				}
				host := string(br.Name) + "." + ns + ".svc.cluster.local"
				what := fmt.Sprintf("HTTPRoute %s backend %s", r.Meta.Name, br.Name)
				p.needOverrideHost(what, host, port, p.cfg.Headers.Destination)
				p.needService(what, host, port)
				routes++
			}
		}
	}
	return routes
}

// checkPrefillCluster checks the cluster the plugin sends prefill legs to in the inline
// P/D modes.
func (p *pluginCheck) checkPrefillCluster() {
	cfg := p.cfg
	for _, fv := range fleetViews(cfg) {
		d := fv.cfg.Disaggregation
		topUnused := fv.field == "" && len(cfg.Models) > 0 && len(cfg.Pools.Decode.Endpoints) == 0 && cfg.Pools.Decode.Discovery == nil
		if m := d.Mode; topUnused || m != config.ModeVLLM && m != config.ModeTRTLLM && m != config.ModeSGLang {
			continue
		}
		field := fv.field + "disaggregation.prefill_cluster"
		host, port, ok := istioCluster(d.PrefillCluster)
		if !ok {
			p.fail("%s %q: in Istio name the service's cluster, outbound|<port>||<host>", field, d.PrefillCluster)
			continue
		}
		p.needOverrideHost(field, host, port, cfg.Headers.Destination, cfg.Headers.PrefillDestination)
		p.needService(field, host, port)
	}
}

// checkEngineMetricsCluster checks the cluster the plugin scrapes engine metrics through.
func (p *pluginCheck) checkEngineMetricsCluster() {
	if !p.cfg.EngineMetrics.Enabled {
		return
	}
	host, port, ok := istioCluster(p.cfg.EngineMetrics.Cluster)
	if !ok {
		p.fail("engine_metrics.cluster %q: in Istio name the service's cluster, outbound|<port>||<host>", p.cfg.EngineMetrics.Cluster)
		return
	}
	p.needOverrideHost("engine_metrics.cluster", host, port, p.cfg.Headers.Destination)
	p.needService("engine_metrics.cluster", host, port)
}

// needOverrideHost checks that the cluster of host:port has override_host reading one of
// headers (the first is the one kvroute writes).
func (p *pluginCheck) needOverrideHost(what, host string, port uint32, headers ...string) {
	key := host + ":" + strconv.Itoa(int(port))
	got, ok := p.mesh.overrideHost[key]
	if !ok {
		p.fail("%s: no EnvoyFilter sets override_host on the cluster of %s", what, key)
		return
	}
	for _, h := range got {
		for _, w := range headers {
			if h == w {
				return
			}
		}
	}
	p.fail("%s: override_host on %s reads %v, kvroute writes %q", what, key, got, headers[0])
}

// needService checks that the set has a Service with host's name and port, when the set
// has Services at all.
func (p *pluginCheck) needService(what, host string, port uint32) {
	if len(p.set.services) == 0 {
		return
	}
	svc := strings.TrimSuffix(host, ".svc.cluster.local")
	if ports, ok := p.set.services[svc]; !ok || !ports[port] {
		p.fail("%s: no Service %s with port %d in this set", what, svc, port)
	}
}

// pluginTarget names the workloads a policy attaches to, and the gateways among them
// ("ns/name").
func pluginTarget(sel *typev1beta1.WorkloadSelector, refs []*typev1beta1.PolicyTargetReference, ns string) (string, map[string]bool, bool) {
	gateways := map[string]bool{}
	if len(refs) > 0 {
		var keys []string
		for _, r := range refs {
			rns := r.GetNamespace()
			if rns == "" {
				rns = ns
			}
			keys = append(keys, r.GetGroup()+"/"+r.GetKind()+"/"+rns+"/"+r.GetName())
			if r.GetKind() == "Gateway" {
				gateways[rns+"/"+r.GetName()] = true
			}
		}
		sort.Strings(keys)
		return "refs:" + strings.Join(keys, ","), gateways, true
	}
	if len(sel.GetMatchLabels()) > 0 {
		var keys []string
		for k, v := range sel.GetMatchLabels() {
			keys = append(keys, k+"="+v)
		}
		sort.Strings(keys)
		return "selector:" + strings.Join(keys, ","), gateways, true
	}
	return "namespace", gateways, false
}

func routeAttaches(parents []gatewayv1.ParentReference, ns string, gateways map[string]bool) bool {
	for _, p := range parents {
		pns := ns
		if p.Namespace != nil {
			pns = string(*p.Namespace)
		}
		if (p.Kind == nil || *p.Kind == "Gateway") && gateways[pns+"/"+string(p.Name)] {
			return true
		}
	}
	return false
}

// istioCluster parses Istio's outbound cluster name outbound|<port>|<subset>|<host>.
func istioCluster(name string) (string, uint32, bool) {
	parts := strings.Split(name, "|")
	if len(parts) != 4 || parts[0] != "outbound" || parts[3] == "" {
		return "", 0, false
	}
	port, err := strconv.ParseUint(parts[1], 10, 16)
	if err != nil || port == 0 {
		return "", 0, false
	}
	return parts[3], uint32(port), true
}

func overrideHeaders(cl *clusterv3.Cluster) []string {
	var out []string
	for _, p := range cl.GetLoadBalancingPolicy().GetPolicies() {
		if oh, ok := unpack(p.GetTypedExtensionConfig().GetTypedConfig()).(*overridehostv3.OverrideHost); ok {
			for _, s := range oh.GetOverrideHostSources() {
				out = append(out, strings.ToLower(s.GetHeader()))
			}
		}
	}
	return out
}
