package discovery

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/hashx"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/tidwall/gjson"
)

// Discovered endpoints (docs/behaviour.md, Discovered endpoints): one VM at a time holds
// a pool's DiscoveryLease and polls the pool's source; ParseEnvoyAdminClusters or
// ParseEndpointList turns the answer into a DiscoveredSet; EndpointBoard keeps the last
// good set in shared data, versioned, for every VM to apply at its next decision.

// DiscoveredEndpoint is one endpoint a source reported. DPSize 0 means the source named
// none: the pool's discovery.dp_size applies.
type DiscoveredEndpoint struct {
	Address     string // host:port
	DPSize      int
	DPRankStart int
}

// Bounds of a poll's answer: far above any fleet, and small enough that a hostile or
// broken source cannot make a VM hold more than a few MiB of targets.
const (
	MaxDiscoveredEndpoints = 65536
	MaxDiscoveryBodyBytes  = 64 << 20
)

// ErrDiscoveryAnswer wraps every reason a poll's answer is not used.
var ErrDiscoveryAnswer = errors.New("kvroute: unusable discovery answer")

func discoveryErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrDiscoveryAnswer}, args...)...)
}

// EnvoyAdminPath is the admin query for one cluster's hosts: /clusters in JSON, with the
// filter Envoy 1.38 added (an RE2 regex on the cluster name). Older Envoys ignore the
// unknown parameter and answer every cluster; ParseEnvoyAdminClusters picks the one by
// name either way, so the same query serves both.
func EnvoyAdminPath(serviceCluster string) string {
	return "/clusters?format=json&filter=" + queryEscape("^"+regexpQuote(serviceCluster)+"$")
}

// regexpQuote escapes RE2's metacharacters (regexp.QuoteMeta, without linking regexp).
func regexpQuote(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(`\.+*?()|[]{}^$`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// queryEscape percent-encodes everything but RFC 3986's unreserved characters.
func queryEscape(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-._~", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// ParseEnvoyAdminClusters reads Envoy's GET /clusters?format=json (envoy.admin.v3.Clusters
// as Envoy's admin writes it: proto field names, enums by name, false booleans left out)
// and returns the eligible hosts of the cluster named serviceCluster, sorted by address.
//
// A host is left out when Envoy would not send it new requests: its eds_health_status is
// UNHEALTHY, DRAINING or TIMEOUT, or one of failed_active_health_check,
// failed_outlier_check, excluded_via_immediate_hc_fail, active_hc_timeout is set, or it
// is pending_dynamic_removal (the control plane removed it; Envoy keeps it only until
// its connections drain). DEGRADED hosts stay eligible, as Envoy keeps routing to them.
// Hosts that are not IP sockets (pipes, internal listeners) are skipped.
//
// An answer that is not JSON, has no cluster_statuses, or lacks the cluster is an error:
// the caller keeps its last good set. A cluster without hosts is an empty set.
func ParseEnvoyAdminClusters(body []byte, serviceCluster string) ([]DiscoveredEndpoint, error) {
	if !gjson.ValidBytes(body) {
		return nil, discoveryErr("not JSON")
	}
	// Read in place: the answer can be megabytes, and only the addresses are kept
	// (each built into a new string).
	statuses := gjson.Get(unsafe.String(unsafe.SliceData(body), len(body)), "cluster_statuses")
	if !statuses.IsArray() {
		return nil, discoveryErr("no cluster_statuses array")
	}
	var hosts gjson.Result
	found := false
	statuses.ForEach(func(_, c gjson.Result) bool {
		if !c.IsObject() {
			return true
		}
		var name, hs gjson.Result
		c.ForEach(func(k, v gjson.Result) bool {
			switch k.Str {
			case "name":
				name = v
			case "host_statuses":
				hs = v
			}
			return true
		})
		if name.Type == gjson.String && name.Str == serviceCluster {
			hosts, found = hs, true
			return false
		}
		return true
	})
	if !found {
		return nil, discoveryErr("cluster %s not in the answer", config.Quote(serviceCluster))
	}
	out := []DiscoveredEndpoint{}
	if !hosts.Exists() {
		return out, nil // proto3 JSON leaves out an empty host list
	}
	if !hosts.IsArray() {
		return nil, discoveryErr("host_statuses is not an array")
	}
	var err error
	hosts.ForEach(func(_, h gjson.Result) bool {
		addr, eligible, ok := adminHost(h)
		if !ok || !eligible {
			return true
		}
		if len(out) >= MaxDiscoveredEndpoints {
			err = discoveryErr("more than %d hosts", MaxDiscoveredEndpoints)
			return false
		}
		out = append(out, DiscoveredEndpoint{Address: addr})
		return true
	})
	if err != nil {
		return nil, err
	}
	return normalizeDiscovered(out), nil
}

// adminHost reads one HostStatus: its IP:port, whether it may take new requests, and
// whether it is an IP socket at all.
func adminHost(h gjson.Result) (addr string, eligible, ok bool) {
	if !h.IsObject() {
		return "", false, false
	}
	var sock, health gjson.Result
	h.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "address":
			sock = v.Get("socket_address")
		case "health_status":
			health = v
		}
		return true
	})
	if !sock.IsObject() {
		return "", false, false
	}
	ip, port := sock.Get("address"), sock.Get("port_value")
	if ip.Type != gjson.String || port.Type != gjson.Number {
		return "", false, false
	}
	addr = joinHostPort(ip.Str, port.Raw)
	if config.HostPort("", addr) != nil {
		return "", false, false
	}
	eligible = true
	if health.IsObject() {
		health.ForEach(func(k, v gjson.Result) bool {
			switch k.Str {
			case "eds_health_status":
				switch v.Str {
				case "UNHEALTHY", "DRAINING", "TIMEOUT":
					eligible = false
				}
			case "failed_active_health_check", "failed_outlier_check", "excluded_via_immediate_hc_fail",
				"active_hc_timeout", "pending_dynamic_removal":
				if v.Type == gjson.True {
					eligible = false
				}
			}
			return eligible
		})
	}
	return addr, eligible, true
}

func joinHostPort(host, port string) string {
	if strings.IndexByte(host, ':') >= 0 {
		return "[" + host + "]:" + port
	}
	return host + ":" + port
}

// ParseEndpointList reads an endpoint list served for the "http" source:
//
//	{"endpoints": [{"address": "10.0.0.1:8000", "dp_size": 2, "dp_rank_start": 0}, ...]}
//
// An element may instead give the host and port apart, as llm-d's endpoint files do:
// {"address": "10.0.0.1", "port": 8000}. A bare array of elements is read as the list.
// Other members are ignored, so a controller may add its own. dp_size (1 .. 1024) and
// dp_rank_start (0 .. 65535) are optional. A malformed element makes the whole answer
// unusable: a list that is wrong in part is not trusted in part. Duplicates collapse to
// their first occurrence; the result is sorted by address.
func ParseEndpointList(body []byte) ([]DiscoveredEndpoint, error) {
	if !gjson.ValidBytes(body) {
		return nil, discoveryErr("not JSON")
	}
	root := gjson.Parse(unsafe.String(unsafe.SliceData(body), len(body)))
	list := root
	if root.IsObject() {
		list = root.Get("endpoints")
	}
	if !list.IsArray() {
		return nil, discoveryErr(`want {"endpoints": [...]}`)
	}
	out := []DiscoveredEndpoint{}
	var err error
	i := 0
	list.ForEach(func(_, el gjson.Result) bool {
		where := "endpoints[" + strconv.Itoa(i) + "]"
		i++
		if len(out) >= MaxDiscoveredEndpoints {
			err = discoveryErr("more than %d endpoints", MaxDiscoveredEndpoints)
			return false
		}
		var e DiscoveredEndpoint
		e, err = listElement(where, el)
		if err != nil {
			return false
		}
		out = append(out, e)
		return true
	})
	if err != nil {
		return nil, err
	}
	return normalizeDiscovered(out), nil
}

func listElement(where string, el gjson.Result) (DiscoveredEndpoint, error) {
	var e DiscoveredEndpoint
	if !el.IsObject() {
		return e, discoveryErr("%s: not an object", where)
	}
	addr, port := el.Get("address"), el.Get("port")
	if addr.Type != gjson.String {
		return e, discoveryErr("%s.address: want a string", where)
	}
	e.Address = strings.Clone(addr.Str) // addr points into the answer
	if port.Exists() {
		n, err := config.Int(where+".port", port, 1, config.PortMax)
		if err != nil {
			return e, discoveryErr("%v", err)
		}
		e.Address = joinHostPort(strings.Trim(addr.Str, "[]"), strconv.FormatInt(n, 10))
	}
	if err := config.HostPort(where+".address", e.Address); err != nil {
		return e, discoveryErr("%v", err)
	}
	if v := el.Get("dp_size"); v.Exists() {
		n, err := config.Int(where+".dp_size", v, 1, config.DPSizeMax)
		if err != nil {
			return e, discoveryErr("%v", err)
		}
		e.DPSize = int(n)
	}
	if v := el.Get("dp_rank_start"); v.Exists() {
		n, err := config.Int(where+".dp_rank_start", v, 0, 65535)
		if err != nil {
			return e, discoveryErr("%v", err)
		}
		e.DPRankStart = int(n)
	}
	return e, nil
}

// normalizeDiscovered sorts by address and drops repeats (the first wins), so every VM
// builds the same target order from the same set and a reordered answer is no change.
func normalizeDiscovered(eps []DiscoveredEndpoint) []DiscoveredEndpoint {
	seen := make(map[string]bool, len(eps))
	out := eps[:0]
	for _, e := range eps {
		key := strings.ToLower(e.Address)
		if seen[key] {
			continue
		}
		seen[key] = true
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b DiscoveredEndpoint) int { return strings.Compare(a.Address, b.Address) })
	return out
}

// EndpointBoard keeps the last good discovered set of one pool in shared data:
// <namespace>/disc/<pool> holds the set, <namespace>/disc/<pool>/gen its generation
// alone, so a VM learns whether the set changed by reading nine bytes.
//
// The set's value: a format byte, the fingerprint of the source it came from (8), the
// generation (8), the endpoint count (4), then per endpoint dp_size (2, 0: the pool's
// default), dp_rank_start (2), the address' length (2) and the address, little-endian.
// The generation key: a format byte and the generation (8). A value of another format,
// of another source (the discovery block changed), or torn reads as no set.
type EndpointBoard struct {
	store   state.Store
	key     string
	genKey  string
	source  uint64
	retries int
}

const (
	endpointBoardFormat = 1
	endpointBoardHeader = 1 + 8 + 8 + 4
	endpointGenSize     = 9
)

// NewEndpointBoard returns the board of one pool, for the source d describes.
func NewEndpointBoard(s state.Store, namespace, pool string, d config.DiscoveryConfig, retries int) *EndpointBoard {
	key := namespace + "/disc/" + pool
	return &EndpointBoard{store: s, key: key, genKey: key + "/gen", retries: retries,
		source: hashx.FingerprintString(d.Source + "\x00" + d.Cluster + "\x00" + d.ServiceCluster + "\x00" + d.Path)}
}

// NewDiscoveryLease returns the lease that makes one VM at a time poll a pool's source:
// the engine scrape's lease mechanism under its own key, as each pool polls on its own
// interval.
func NewDiscoveryLease(s state.Store, namespace, pool string, retries int) *state.Lease {
	return state.NewLease(s, namespace+"/disc/"+pool+"/lease", retries)
}

func encodeEndpointSet(source, gen uint64, eps []DiscoveredEndpoint) []byte {
	size := endpointBoardHeader
	for _, e := range eps {
		size += 6 + len(e.Address)
	}
	out := make([]byte, 1, size)
	out[0] = endpointBoardFormat
	out = binary.LittleEndian.AppendUint64(out, source)
	out = binary.LittleEndian.AppendUint64(out, gen)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(eps)))
	for _, e := range eps {
		out = binary.LittleEndian.AppendUint16(out, uint16(e.DPSize))
		out = binary.LittleEndian.AppendUint16(out, uint16(e.DPRankStart))
		out = binary.LittleEndian.AppendUint16(out, uint16(len(e.Address)))
		out = append(out, e.Address...)
	}
	return out
}

// decodeEndpointSet returns the set's source, generation and endpoints; ok is false for
// a value it cannot read.
func decodeEndpointSet(v []byte) (source, gen uint64, eps []DiscoveredEndpoint, ok bool) {
	if len(v) < endpointBoardHeader || v[0] != endpointBoardFormat {
		return 0, 0, nil, false
	}
	source = binary.LittleEndian.Uint64(v[1:])
	gen = binary.LittleEndian.Uint64(v[9:])
	n := int(binary.LittleEndian.Uint32(v[17:]))
	if n > MaxDiscoveredEndpoints {
		return 0, 0, nil, false
	}
	v = v[endpointBoardHeader:]
	eps = make([]DiscoveredEndpoint, 0, n)
	for i := 0; i < n; i++ {
		if len(v) < 6 {
			return 0, 0, nil, false
		}
		dp := int(binary.LittleEndian.Uint16(v))
		start := int(binary.LittleEndian.Uint16(v[2:]))
		l := int(binary.LittleEndian.Uint16(v[4:]))
		v = v[6:]
		if len(v) < l {
			return 0, 0, nil, false
		}
		eps = append(eps, DiscoveredEndpoint{Address: string(v[:l]), DPSize: dp, DPRankStart: start})
		v = v[l:]
	}
	return source, gen, eps, len(v) == 0
}

// Publish stores eps as the pool's set. An unchanged set writes nothing; a changed one
// takes the next generation. It returns the generation now stored.
func (b *EndpointBoard) Publish(eps []DiscoveredEndpoint) (uint64, error) {
	var gen uint64
	changed := false
	err := state.Update(b.store, b.key, b.retries, func(old []byte) ([]byte, bool) {
		src, oldGen, oldEps, ok := decodeEndpointSet(old)
		if ok && src == b.source && slices.Equal(oldEps, eps) {
			gen, changed = oldGen, false
			return nil, false
		}
		gen, changed = oldGen+1, true
		return encodeEndpointSet(b.source, gen, eps), true
	})
	if err != nil {
		return 0, err
	}
	if !changed {
		return gen, nil
	}
	// Under compare-and-swap as well: a racing publisher's newer generation stays.
	err = state.Update(b.store, b.genKey, b.retries, func(old []byte) ([]byte, bool) {
		if len(old) == endpointGenSize && old[0] == endpointBoardFormat && binary.LittleEndian.Uint64(old[1:]) >= gen {
			return nil, false
		}
		return binary.LittleEndian.AppendUint64([]byte{endpointBoardFormat}, gen), true
	})
	return gen, err
}

// Generation returns the stored generation; 0 when there is none.
func (b *EndpointBoard) Generation() (uint64, error) {
	v, _, err := b.store.Get(b.genKey)
	if err == state.ErrNotFound {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if len(v) != endpointGenSize || v[0] != endpointBoardFormat {
		return 0, nil
	}
	return binary.LittleEndian.Uint64(v[1:]), nil
}

// Read returns the stored set and its generation; ok is false when there is none of
// this source.
func (b *EndpointBoard) Read() (gen uint64, eps []DiscoveredEndpoint, ok bool, err error) {
	v, _, err := b.store.Get(b.key)
	if err == state.ErrNotFound {
		return 0, nil, false, nil
	}
	if err != nil {
		return 0, nil, false, err
	}
	src, gen, eps, ok := decodeEndpointSet(v)
	if !ok || src != b.source {
		return 0, nil, false, nil
	}
	return gen, eps, true, nil
}
