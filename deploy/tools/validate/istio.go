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

	"github.com/kvroute/kvroute/routing"
)

// CheckIstioSet checks a complete set of resources (a rendered kustomization) for what
// kvroute needs in a mesh: each WasmPlugin fails open, names its image and phase and
// parses with kvroute's own config parser; EnvoyFilters on the same workloads make the
// destination header honoured (override_host) on the cluster of every service the
// gateway routes to and of every cluster the plugin calls, remove the owned headers
// early, and raise the buffers above max_body_bytes.
func CheckIstioSet(name string, objs []*Object) ([]routing.Config, error) {
	var errs []error
	fail := func(f string, a ...any) { errs = append(errs, fmt.Errorf("%s: %s", name, fmt.Sprintf(f, a...))) }
	var cfgs []routing.Config
	services := map[string]map[uint32]bool{} // "name.ns" → ports
	for _, o := range objs {
		if o.Service != nil {
			key := o.Meta.Name + "." + o.Meta.Namespace
			services[key] = map[uint32]bool{}
			for _, p := range o.Service.Spec.Ports {
				services[key][uint32(p.Port)] = true
			}
		}
	}
	nPlugins := 0
	for _, o := range objs {
		wp := o.WasmPlugin
		if wp == nil {
			continue
		}
		nPlugins++
		where := fmt.Sprintf("WasmPlugin %s/%s", o.Meta.Namespace, o.Meta.Name)
		if wp.GetFailStrategy() != extensionsv1alpha1.FailStrategy_FAIL_OPEN {
			fail("%s: failStrategy must be FAIL_OPEN", where)
		}
		if u := wp.GetUrl(); !strings.HasPrefix(u, "oci://") && !strings.HasPrefix(u, "https://") && !strings.HasPrefix(u, "file://") {
			fail("%s: url %q: use oci://<registry>/<repository>:<tag> (the image `make image` builds)", where, u)
		}
		if wp.GetPhase() == extensionsv1alpha1.PluginPhase_UNSPECIFIED_PHASE {
			fail("%s: set phase (STATS: after authentication and authorization, before the router)", where)
		}
		if wp.GetType() != extensionsv1alpha1.PluginType_HTTP {
			fail("%s: type must be HTTP", where)
		}
		target, gateways, ok := pluginTarget(wp.GetSelector(), wp.GetTargetRefs(), o.Meta.Namespace)
		if !ok {
			fail("%s: set selector or targetRefs (without them the plugin applies to every workload of the namespace)", where)
		}
		js, err := pluginConfigJSON(wp)
		if err != nil {
			fail("%s: pluginConfig: %v", where, err)
			continue
		}
		cfg, err := routing.ParseConfig(js)
		if err != nil {
			fail("%s: pluginConfig: %v", where, err)
			continue
		}
		cfgs = append(cfgs, cfg)
		for _, p := range []struct {
			name string
			pool routing.Pool
		}{{"pools.decode", cfg.Pools.Decode}, {"pools.prefill", cfg.Pools.Prefill}} {
			for i, e := range p.pool.Endpoints {
				if _, err := netip.ParseAddrPort(e.Address); err != nil {
					fail("%s: pluginConfig.%s.endpoints[%d].address %q: override_host honours only IP:port (pod IPs)", where, p.name, i, e.Address)
				}
			}
		}

		// What the EnvoyFilters on the same workloads provide.
		ovh := map[string][]string{} // "host:port" → headers override_host reads
		added := map[string]bool{}   // clusters EnvoyFilters add
		var clusterBufs []string
		removed := map[string]bool{}
		var listenerBuf int64 = envoyDefaultBufferLimit
		for _, e := range objs {
			ef := e.EnvoyFilter
			if ef == nil || e.Meta.Namespace != o.Meta.Namespace {
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
				merge := p.GetPatch().GetOperation() == networkingv1alpha3.EnvoyFilter_Patch_MERGE
				if p.GetApplyTo() == networkingv1alpha3.EnvoyFilter_CLUSTER && p.GetPatch().GetOperation() == networkingv1alpha3.EnvoyFilter_Patch_ADD {
					if cl := (&clusterv3.Cluster{}); envoyPatchValue(p, cl) {
						added[cl.GetName()] = true
					}
					continue
				}
				switch p.GetApplyTo() {
				case networkingv1alpha3.EnvoyFilter_CLUSTER:
					cm := p.GetMatch().GetCluster()
					cl := &clusterv3.Cluster{}
					if !merge || cm == nil || !envoyPatchValue(p, cl) {
						continue
					}
					key := cm.GetService() + ":" + strconv.Itoa(int(cm.GetPortNumber()))
					if kind, err := destinationKind(cl, []string{cfg.Headers.Destination, cfg.Headers.PrefillDestination}); err == nil && kind == kindOverrideHost {
						ovh[key] = overrideHeaders(cl)
					}
					if bufferLimit(cl.GetPerConnectionBufferLimitBytes()) <= cfg.MaxBodyBytes {
						clusterBufs = append(clusterBufs, key)
					}
				case networkingv1alpha3.EnvoyFilter_LISTENER:
					l := &listenerv3.Listener{}
					if merge && envoyPatchValue(p, l) && l.GetPerConnectionBufferLimitBytes() != nil {
						listenerBuf = bufferLimit(l.GetPerConnectionBufferLimitBytes())
					}
				case networkingv1alpha3.EnvoyFilter_NETWORK_FILTER:
					f := &listenerv3.Filter{}
					if !merge || !envoyPatchValue(p, f) {
						continue
					}
					if hcm, ok := unpack(f.GetTypedConfig()).(*hcmv3.HttpConnectionManager); ok {
						for _, ext := range hcm.GetEarlyHeaderMutationExtensions() {
							if hm, ok := unpack(ext.GetTypedConfig()).(*headermutationv3.HeaderMutation); ok {
								for _, m := range hm.GetMutations() {
									if r := m.GetRemove(); r != "" {
										removed[strings.ToLower(r)] = true
									}
								}
							}
						}
					}
				}
			}
		}
		for _, h := range OwnedHeaders(cfg) {
			if !removed[h] {
				fail("%s: no EnvoyFilter on the same workloads removes %q with an early header mutation (a client could steer routing when the plugin is absent)", where, h)
			}
		}
		if err := trustedRankStripped(cfg, removed); err != nil {
			fail("%s: %v", where, err)
		}
		if listenerBuf <= cfg.MaxBodyBytes {
			fail("%s: no EnvoyFilter raises the listeners' per_connection_buffer_limit_bytes above max_body_bytes %d (Envoy answers 413 past it)", where, cfg.MaxBodyBytes)
		}
		sort.Strings(clusterBufs)
		for _, k := range clusterBufs {
			fail("%s: the cluster patch for %s must raise per_connection_buffer_limit_bytes above max_body_bytes %d", where, k, cfg.MaxBodyBytes)
		}
		need := func(what, host string, port uint32, headers ...string) {
			key := host + ":" + strconv.Itoa(int(port))
			got, ok := ovh[key]
			if !ok {
				fail("%s: %s: no EnvoyFilter sets override_host on the cluster of %s", where, what, key)
				return
			}
			for _, h := range got {
				for _, w := range headers {
					if h == w {
						return
					}
				}
			}
			fail("%s: %s: override_host on %s reads %v, kvroute writes %q", where, what, key, got, headers[0])
		}
		needService := func(what, host string, port uint32) {
			if len(services) == 0 {
				return
			}
			svc := strings.TrimSuffix(host, ".svc.cluster.local")
			if ports, ok := services[svc]; !ok || !ports[port] {
				fail("%s: %s: no Service %s with port %d in this set", where, what, svc, port)
			}
		}

		// Every service the gateway routes to honours the destination.
		routes := 0
		for _, r := range objs {
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
					need(what, host, port, cfg.Headers.Destination)
					needService(what, host, port)
					routes++
				}
			}
		}
		if routes == 0 && len(ovh) == 0 {
			fail("%s: no EnvoyFilter sets override_host (reading %s) on any cluster", where, cfg.Headers.Destination)
		}
		if m := cfg.Disaggregation.Mode; m == routing.ModeVLLM || m == routing.ModeTRTLLM || m == routing.ModeSGLang {
			host, port, ok := istioCluster(cfg.Disaggregation.PrefillCluster)
			if !ok {
				fail("%s: disaggregation.prefill_cluster %q: in Istio name the service's cluster, outbound|<port>||<host>", where, cfg.Disaggregation.PrefillCluster)
			} else {
				need("disaggregation.prefill_cluster", host, port, cfg.Headers.Destination, cfg.Headers.PrefillDestination)
				needService("disaggregation.prefill_cluster", host, port)
			}
		}
		if cfg.EngineMetrics.Enabled {
			host, port, ok := istioCluster(cfg.EngineMetrics.Cluster)
			if !ok {
				fail("%s: engine_metrics.cluster %q: in Istio name the service's cluster, outbound|<port>||<host>", where, cfg.EngineMetrics.Cluster)
			} else {
				need("engine_metrics.cluster", host, port, cfg.Headers.Destination)
				needService("engine_metrics.cluster", host, port)
			}
		}
		checkIstioDiscovery(cfg, added, need, needService, func(f string, a ...any) { fail("%s: %s", where, fmt.Sprintf(f, a...)) })
	}
	if nPlugins == 0 {
		fail("no WasmPlugin")
	}
	return cfgs, errors.Join(errs...)
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
