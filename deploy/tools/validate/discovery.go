package validate

import (
	"fmt"
	"net/netip"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"

	"github.com/kvroute/kvroute/routing/config"
)

// istioAdminCluster is the cluster every istio-proxy's bootstrap defines to reach the
// proxy's own admin listener (127.0.0.1:15000): the stats listener on 15090 routes only
// /stats/prometheus to it, so no client reaches anything else of the admin through it.
const istioAdminCluster = "prometheus_stats"

// discoveredPools lists the pools of cfg (the top level's and every fleet's of models)
// that have discovery, with their config path.
func discoveredPools(cfg config.Config) []struct {
	field string
	d     *config.DiscoveryConfig
} {
	var out []struct {
		field string
		d     *config.DiscoveryConfig
	}
	for _, fv := range fleetViews(cfg) {
		for _, p := range []struct {
			field string
			d     *config.DiscoveryConfig
		}{{fv.field + "pools.decode.discovery", fv.cfg.Pools.Decode.Discovery}, {fv.field + "pools.prefill.discovery", fv.cfg.Pools.Prefill.Discovery}} {
			if p.d != nil {
				out = append(out, p)
			}
		}
	}
	return out
}

// checkDiscovery checks a bootstrap's clusters for what a discovered pool needs. With
// envoy_admin: discovery.cluster's only host is the bootstrap's admin address (which
// CheckBootstrap keeps on loopback), and no route reaches it; service_cluster exists,
// a route reaches it, and it honours the destination through override_host (an
// ORIGINAL_DST cluster has no host list to discover: its hosts are made per request).
// With http: discovery.cluster exists.
func (c *bootstrapCheck) checkDiscovery(cfg config.Config) {
	for _, p := range discoveredPools(cfg) {
		name := p.d.Cluster
		cl, ok := c.clusters[name]
		if !ok {
			c.fail("%s.cluster %q does not exist", p.field, name)
			continue
		}
		if p.d.Source != config.DiscoveryEnvoyAdmin {
			continue
		}
		c.adminClusters = append(c.adminClusters, name)
		admin := c.b.GetAdmin().GetAddress().GetSocketAddress()
		ip, err := netip.ParseAddr(admin.GetAddress())
		if admin == nil || err != nil {
			c.fail("%s: source envoy_admin needs the bootstrap's admin on an IP socket address", p.field)
		} else {
			want := netip.AddrPortFrom(ip, uint16(admin.GetPortValue()))
			members := clusterMembers(cl)
			if len(members) != 1 || !members[want] {
				c.fail("%s.cluster %q must have exactly one host, the admin address %s", p.field, name, want)
			}
		}
		svc, ok := c.clusters[p.d.ServiceCluster]
		switch {
		case !ok:
			c.fail("%s.service_cluster %q does not exist", p.field, p.d.ServiceCluster)
		case svc.GetType() == clusterv3.Cluster_ORIGINAL_DST:
			c.fail("%s.service_cluster %q is ORIGINAL_DST: its hosts exist only once requests made them; discover from a cluster with override_host", p.field, p.d.ServiceCluster)
		default:
			kind, err := destinationKind(svc, []string{cfg.Headers.Destination, cfg.Headers.PrefillDestination})
			if err != nil || kind != kindOverrideHost {
				c.fail("%s.service_cluster %q must honour the destination header with override_host", p.field, p.d.ServiceCluster)
			}
		}
	}
}

// checkAdminNotRouted refuses a route to a cluster that reaches Envoy's admin: a
// client could then read and change the proxy (run after every route is seen).
func (c *bootstrapCheck) checkAdminNotRouted() {
	for _, name := range c.adminClusters {
		if c.routed[name] {
			c.fail("discovery cluster %q reaches Envoy's admin and a route reaches it: only the filter may use it", name)
		}
	}
}

// checkIstioDiscovery checks a WasmPlugin's discovered pools against the mesh: with
// envoy_admin, discovery.cluster is the bootstrap's admin cluster (or one an EnvoyFilter
// on the same workloads adds) and service_cluster is a service's outbound cluster with
// override_host; with http, discovery.cluster is a service's outbound cluster.
func checkIstioDiscovery(cfg config.Config, added map[string]bool, need func(what, host string, port uint32, headers ...string),
	needService func(what, host string, port uint32), fail func(string, ...any)) {
	for _, p := range discoveredPools(cfg) {
		if p.d.Source == config.DiscoveryEnvoyAdmin {
			if p.d.Cluster != istioAdminCluster && !added[p.d.Cluster] {
				fail("%s.cluster %q: in Istio use %q, the bootstrap's cluster to the proxy's admin (or add one with an EnvoyFilter)",
					p.field, p.d.Cluster, istioAdminCluster)
			}
			host, port, ok := istioCluster(p.d.ServiceCluster)
			if !ok {
				fail("%s.service_cluster %q: in Istio name the service's cluster, outbound|<port>||<host>", p.field, p.d.ServiceCluster)
				continue
			}
			what := fmt.Sprintf("%s.service_cluster", p.field)
			need(what, host, port, cfg.Headers.Destination, cfg.Headers.PrefillDestination)
			needService(what, host, port)
			continue
		}
		host, port, ok := istioCluster(p.d.Cluster)
		if !ok {
			fail("%s.cluster %q: in Istio name the list server's service cluster, outbound|<port>||<host>", p.field, p.d.Cluster)
			continue
		}
		needService(p.field+".cluster", host, port)
	}
}
