package config

// ParseConfig turns the plugin configuration JSON (Envoy's `configuration`, Istio's
// `pluginConfig`) into a Config (reference: docs/configuration.md). Every absent field
// keeps its DefaultConfig value; a present field replaces it (arrays are replaced whole,
// never merged).
//
// The configuration is refused, with one error line "<field path>: <what was wrong>",
// on the first of these found (fields in document order, then the cross-field rules):
//
//   - input that is not JSON, or whose top level is not an object (empty or
//     whitespace-only input is read as {});
//   - an unknown field at any level, a field given twice in one object, or null as a value;
//   - a wrong JSON type. Booleans must be true or false. Integers may be written 8, 8.0
//     or 8e0 (Istio hands pluginConfig through protobuf doubles), but a fraction such as
//     1.5 is refused, and so is anything beyond ±2^53 or int64;
//   - a value out of range:
//
//     routes                               non-empty array of paths: each starts with "/",
//                                          printable ASCII, no space, "?" or "#"; no duplicates
//     max_body_bytes                       1 .. 1<<30
//     chars_per_token                      1 .. 64
//     pools.decode.endpoints               at least 1 endpoint unless the pool has discovery
//                                          (addresses unique per pool)
//     pools.prefill.endpoints              0 or more endpoints (addresses unique per pool)
//     endpoints[i].address                 required; host:port — host a DNS name (labels of
//                                          1..63 of [A-Za-z0-9_-], ≤ 253 chars), an IPv4
//                                          address, or a bracketed IPv6 address [::1]; port
//                                          1 .. 65535 in decimal without leading zeros
//     endpoints[i].dp_size                 1 .. 1024 (default 1)
//     endpoints[i].dp_rank_start           0 .. 65535 (default 0; a vLLM engine identity
//                                          is two bytes)
//     endpoints[i].bootstrap_port          1 .. 65535, prefill pool only
//     pools.<pool>.discovery.source        envoy_admin | http
//     pools.<pool>.discovery.cluster       non-empty, no whitespace or control characters
//     ....discovery.service_cluster        the same; required with envoy_admin, refused with http
//     ....discovery.path                   as engine_metrics.path; required with http,
//                                          refused with envoy_admin
//     ....discovery.dp_size                1 .. 1024
//     ....discovery.interval_ms            100 .. 3,600,000
//     conversation.headers                 header names (RFC 9110 token), lower-cased, unique
//     conversation.body_fields             non-empty gjson paths, unique
//     conversation.max_sessions            1 .. 100,000,000
//     conversation.first_turn              round_robin | least_loaded | hash | score
//     prefix.block_tokens                  1 .. 65536
//     prefix.match_rate_threshold          0 .. 1 (inclusive)
//     prefix.continuation_threshold        (0 .. 1]
//     prefix.skip_blocks                   0 .. 1<<20
//     prefix.capacity_blocks               1 .. 1<<26
//     prefix.target_cache_tokens           0 .. 1<<40 (0: unknown)
//     balance.load_metric                  requests | tokens
//     balance.load_weight                  0 .. 1000
//     balance.fair_share_multiplier        1 .. 1000 (below 1 the cap would refuse fair shares)
//     disaggregation.mode                  off | sidecar | vllm | trtllm | sglang
//     disaggregation.threshold_tokens      0 .. 1<<30
//     disaggregation.prefill_cluster       non-empty, no whitespace or control characters
//     disaggregation.prefill_timeout_ms    1 .. 3,600,000
//     health.failure_statuses              HTTP statuses 100 .. 599, unique (may be empty)
//     health.failure_threshold             1 .. 1000
//     health.cooldown_ms                   0 .. 86,400,000
//     engine_metrics.flavor                vllm | sglang | trtllm
//     engine_metrics.cluster               non-empty, no whitespace or control characters
//     engine_metrics.path                  starts with "/", printable ASCII, no space
//     engine_metrics.interval_ms           100 .. 3,600,000
//     engine_metrics.stale_ms              interval_ms .. 86,400,000
//     state.namespace                      1 .. 64 characters of [A-Za-z0-9_.-]
//     state.max_cas_retries                1 .. 1000
//     state.lease_ms                       1000 .. 86,400,000
//     models                               array of fleets, read after every other
//                                          top-level field (a fleet's disaggregation
//                                          starts from the top-level one)
//     models[i].names                      required, at least one name; each non-empty,
//                                          ≤ 256 bytes, no control characters, "*" only
//                                          as the last character (a prefix); names[0]
//                                          exact and no other fleet's names[0] written
//                                          alike in stat names (ModelMetricTag); no
//                                          name twice across all fleets
//     models[i].pools                      required; as pools (decode needs an endpoint
//                                          or discovery)
//     models[i].disaggregation             as disaggregation; its mode other than off
//                                          needs the fleet's own prefill pool
//     headers.*                            header names (RFC 9110 token), lower-cased;
//                                          headers.decision and headers.model may be ""
//                                          (disables them), the others must be set
//
//   - the cross-field rules: pools.decode.endpoints holds at least one endpoint unless
//     the pool has discovery or models is non-empty; when the top-level decode pool
//     serves, a disaggregation.mode other than off needs at least one
//     prefill endpoint or prefill discovery (reported on pools.prefill.endpoints); engine_metrics.stale_ms >= engine_metrics.interval_ms
//     (reported on stale_ms, also when only interval_ms was set); the filter's own header
//     names (headers.*) are distinct from each other and from every conversation.headers
//     entry, and none is a header the filter must never strip (host, content-length,
//     content-type, transfer-encoding, connection, keep-alive, upgrade, te, trailer,
//     proxy-connection, authorization, cookie, x-request-id) — reported on the later
//     headers.* field in the order destination, dp_rank, prefill_destination,
//     prefill_dp_rank, decision, model.
//
// Field paths name array elements by index (pools.decode.endpoints[1].address); an
// error about the whole document is reported on "configuration".

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// Bounds of the configuration; see the table above.
const (
	cfgMaxBodyBytesMax      = 1 << 30
	cfgCharsPerTokenMax     = 64
	cfgDPSizeMax            = 1024
	cfgDPRankStartMax       = 65535
	cfgPortMax              = 65535
	cfgMaxSessionsMax       = 100_000_000
	cfgBlockTokensMax       = 65536
	cfgSkipBlocksMax        = 1 << 20
	cfgCapacityBlocksMax    = 1 << 26
	cfgTargetCacheTokensMax = 1 << 40
	cfgWeightMax            = 1000
	cfgThresholdTokensMax   = 1 << 30
	cfgPrefillTimeoutMSMax  = 3_600_000
	cfgFailureThresholdMax  = 1000
	cfgDayMS                = 86_400_000
	cfgIntervalMSMin        = 100
	cfgIntervalMSMax        = 3_600_000
	cfgNamespaceMax         = 64
	cfgCASRetriesMax        = 1000
	cfgLeaseMSMin           = 1000
	cfgQuoteMax             = 64 // longest user value quoted whole in an error
)

// cfgReservedHeaders are request headers the filter must never own: it strips its own
// headers from every request.
var cfgReservedHeaders = map[string]bool{
	"host": true, "content-length": true, "content-type": true, "transfer-encoding": true,
	"connection": true, "keep-alive": true, "upgrade": true, "te": true, "trailer": true,
	"proxy-connection": true, "authorization": true, "cookie": true, "x-request-id": true,
}

// ConfigError is a refused configuration: the path of the field and what was wrong.
type ConfigError struct {
	Field  string // e.g. "pools.decode.endpoints[1].address"; "" is the whole document
	Reason string
}

func (e *ConfigError) Error() string {
	f := e.Field
	if f == "" {
		f = "configuration"
	}
	return f + ": " + e.Reason
}

func cfgErr(path, format string, args ...any) error {
	return &ConfigError{Field: path, Reason: fmt.Sprintf(format, args...)}
}

// ParseConfig parses the plugin configuration JSON (Envoy `configuration` / Istio
// `pluginConfig`) into a Config with defaults (DefaultConfig) for every absent field,
// and validates it. The error, if any, is a *ConfigError naming the first bad field.
func ParseConfig(data []byte) (Config, error) {
	c, err := parseConfig(data)
	if err != nil {
		return Config{}, err
	}
	return c, nil
}

func parseConfig(data []byte) (Config, error) {
	c := DefaultConfig()
	data = bytes.Trim(data, " \t\r\n")
	if len(data) == 0 {
		data = []byte("{}")
	}
	if !gjson.ValidBytes(data) {
		return c, cfgErr("", "not valid JSON")
	}
	root := gjson.ParseBytes(data)
	if !root.IsObject() {
		return c, cfgErr("", "must be a JSON object, got %s", cfgTypeName(root))
	}
	var models gjson.Result // read after the rest: a fleet inherits disaggregation
	err := cfgObject("", root, cfgFields{
		"routes":               cfgRoutes(&c.Routes),
		"max_body_bytes":       cfgInt64Field(&c.MaxBodyBytes, 1, cfgMaxBodyBytesMax),
		"chars_per_token":      cfgIntField(&c.CharsPerToken, 1, cfgCharsPerTokenMax),
		"trust_client_dp_rank": cfgBoolField(&c.TrustClientDPRank),
		"pools": cfgObjectField(cfgFields{
			"decode":  cfgPoolField(&c.Pools.Decode, false),
			"prefill": cfgPoolField(&c.Pools.Prefill, true),
		}),
		"models": func(p string, v gjson.Result) error {
			if !v.IsArray() {
				return cfgErr(p, "must be an array, got %s", cfgTypeName(v))
			}
			models = v
			return nil
		},
		"conversation": cfgObjectField(cfgFields{
			"enabled":      cfgBoolField(&c.Conversation.Enabled),
			"headers":      cfgHeaderList(&c.Conversation.Headers),
			"body_fields":  cfgBodyFields(&c.Conversation.BodyFields),
			"max_sessions": cfgIntField(&c.Conversation.MaxSessions, 1, cfgMaxSessionsMax),
			"first_turn": cfgEnumField(&c.Conversation.FirstTurn,
				FirstTurnRoundRobin, FirstTurnLeastLoaded, FirstTurnHash, FirstTurnScore),
		}),
		"prefix": cfgObjectField(cfgFields{
			"enabled":                cfgBoolField(&c.Prefix.Enabled),
			"block_tokens":           cfgIntField(&c.Prefix.BlockTokens, 1, cfgBlockTokensMax),
			"match_rate_threshold":   cfgFloatField(&c.Prefix.MatchRateThreshold, 0, false, 1),
			"continuation_threshold": cfgFloatField(&c.Prefix.ContinuationThreshold, 0, true, 1),
			"skip_blocks":            cfgIntField(&c.Prefix.SkipBlocks, 0, cfgSkipBlocksMax),
			"capacity_blocks":        cfgIntField(&c.Prefix.CapacityBlocks, 1, cfgCapacityBlocksMax),
			"target_cache_tokens":    cfgInt64Field(&c.Prefix.TargetCacheTokens, 0, cfgTargetCacheTokensMax),
		}),
		"balance": cfgObjectField(cfgFields{
			"load_metric":           cfgEnumField(&c.Balance.LoadMetric, LoadMetricRequests, LoadMetricTokens),
			"load_weight":           cfgFloatField(&c.Balance.LoadWeight, 0, false, cfgWeightMax),
			"fair_share_multiplier": cfgFloatField(&c.Balance.FairShareMultiplier, 1, false, cfgWeightMax),
		}),
		"disaggregation": cfgDisaggregationField(&c.Disaggregation),
		"health": cfgObjectField(cfgFields{
			"failure_statuses":  cfgStatusList(&c.Health.FailureStatuses),
			"failure_threshold": cfgIntField(&c.Health.FailureThreshold, 1, cfgFailureThresholdMax),
			"cooldown_ms":       cfgInt64Field(&c.Health.CooldownMS, 0, cfgDayMS),
		}),
		"engine_metrics": cfgObjectField(cfgFields{
			"enabled":     cfgBoolField(&c.EngineMetrics.Enabled),
			"flavor":      cfgEnumField(&c.EngineMetrics.Flavor, FlavorVLLM, FlavorSGLang, FlavorTRTLLM),
			"cluster":     cfgClusterField(&c.EngineMetrics.Cluster),
			"path":        cfgPathField(&c.EngineMetrics.Path),
			"interval_ms": cfgInt64Field(&c.EngineMetrics.IntervalMS, cfgIntervalMSMin, cfgIntervalMSMax),
			"stale_ms":    cfgInt64Field(&c.EngineMetrics.StaleMS, 1, cfgDayMS),
		}),
		"state": cfgObjectField(cfgFields{
			"namespace":       cfgNamespaceField(&c.State.Namespace),
			"max_cas_retries": cfgIntField(&c.State.MaxCASRetries, 1, cfgCASRetriesMax),
			"lease_ms":        cfgInt64Field(&c.State.LeaseMS, cfgLeaseMSMin, cfgDayMS),
		}),
		"headers": cfgObjectField(cfgFields{
			"destination":         cfgHeaderField(&c.Headers.Destination, false),
			"dp_rank":             cfgHeaderField(&c.Headers.DPRank, false),
			"prefill_destination": cfgHeaderField(&c.Headers.PrefillDestination, false),
			"prefill_dp_rank":     cfgHeaderField(&c.Headers.PrefillDPRank, false),
			"decision":            cfgHeaderField(&c.Headers.Decision, true),
			"model":               cfgHeaderField(&c.Headers.Model, true),
		}),
	})
	if err != nil {
		return c, err
	}
	if models.Exists() {
		if c.Models, err = cfgModels("models", models, c.Disaggregation); err != nil {
			return c, err
		}
	}
	return c, cfgCrossCheck(&c)
}

// cfgCrossCheck applies the rules that involve more than one field.
func cfgCrossCheck(c *Config) error {
	topLevel := len(c.Pools.Decode.Endpoints) > 0 || c.Pools.Decode.Discovery != nil
	if !topLevel && len(c.Models) == 0 {
		return cfgErr("pools.decode.endpoints", "must hold at least one endpoint (or set pools.decode.discovery, or models)")
	}
	// Top-level pools left empty beside models serve nothing, so need no prefill pool.
	if topLevel && c.Disaggregation.Mode != ModeOff && len(c.Pools.Prefill.Endpoints) == 0 && c.Pools.Prefill.Discovery == nil {
		return cfgErr("pools.prefill.endpoints",
			"disaggregation.mode %q needs at least one prefill endpoint (or pools.prefill.discovery)", c.Disaggregation.Mode)
	}
	if c.EngineMetrics.StaleMS < c.EngineMetrics.IntervalMS {
		return cfgErr("engine_metrics.stale_ms", "must be >= engine_metrics.interval_ms (%d), got %d",
			c.EngineMetrics.IntervalMS, c.EngineMetrics.StaleMS)
	}
	owned := []struct{ field, name string }{
		{"headers.destination", c.Headers.Destination},
		{"headers.dp_rank", c.Headers.DPRank},
		{"headers.prefill_destination", c.Headers.PrefillDestination},
		{"headers.prefill_dp_rank", c.Headers.PrefillDPRank},
		{"headers.decision", c.Headers.Decision},
		{"headers.model", c.Headers.Model},
	}
	for i, h := range owned {
		if h.name == "" {
			continue // only headers.decision and headers.model may be empty
		}
		if cfgReservedHeaders[h.name] {
			return cfgErr(h.field, "%s is a header the filter must not strip", cfgQuote(h.name))
		}
		for _, prev := range owned[:i] {
			if prev.name == h.name {
				return cfgErr(h.field, "%s is already used by %s", cfgQuote(h.name), prev.field)
			}
		}
		for _, ch := range c.Conversation.Headers {
			if ch == h.name {
				return cfgErr(h.field, "%s is also in conversation.headers (the filter strips its own headers)",
					cfgQuote(h.name))
			}
		}
	}
	return nil
}

// ---- JSON walking ----

type cfgSetter func(path string, v gjson.Result) error

type cfgFields map[string]cfgSetter

// cfgObject walks the object v in document order, giving each member to its setter.
func cfgObject(path string, v gjson.Result, fields cfgFields) error {
	if !v.IsObject() {
		return cfgErr(path, "must be an object, got %s", cfgTypeName(v))
	}
	seen := make(map[string]bool, len(fields))
	var err error
	v.ForEach(func(k, val gjson.Result) bool {
		name := k.String()
		p := cfgJoin(path, name)
		set, ok := fields[name]
		switch {
		case !ok:
			err = cfgErr(p, "unknown field")
		case seen[name]:
			err = cfgErr(p, "duplicate field")
		case val.Type == gjson.Null:
			err = cfgErr(p, "must not be null")
		default:
			seen[name] = true
			err = set(p, val)
		}
		return err == nil
	})
	return err
}

// cfgArray walks the array v, giving each element and its path to fn.
func cfgArray(path string, v gjson.Result, fn func(i int, p string, el gjson.Result) error) error {
	if !v.IsArray() {
		return cfgErr(path, "must be an array, got %s", cfgTypeName(v))
	}
	i := 0
	var err error
	v.ForEach(func(_, el gjson.Result) bool {
		err = fn(i, path+"["+strconv.Itoa(i)+"]", el)
		i++
		return err == nil
	})
	return err
}

// cfgJoin appends a member name to a path; a name that is not a plain identifier is
// quoted so that an error stays one readable line.
func cfgJoin(path, name string) string {
	seg := name
	plain := name != ""
	for i := 0; i < len(name); i++ {
		b := name[i]
		if !(b == '_' || b == '-' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z') {
			plain = false
			break
		}
	}
	if !plain {
		seg = cfgQuote(name)
	}
	if path == "" {
		return seg
	}
	return path + "." + seg
}

func cfgTypeName(v gjson.Result) string {
	switch v.Type {
	case gjson.Null:
		return "null"
	case gjson.False, gjson.True:
		return "boolean"
	case gjson.Number:
		return "number"
	case gjson.String:
		return "string"
	}
	switch {
	case v.IsArray():
		return "array"
	case v.IsObject():
		return "object"
	}
	return "nothing"
}

// cfgQuote quotes a user-given string for an error, cut to cfgQuoteMax bytes.
func cfgQuote(s string) string {
	if len(s) > cfgQuoteMax {
		cut := cfgQuoteMax
		for cut > 0 && s[cut]&0xC0 == 0x80 { // do not split a UTF-8 sequence
			cut--
		}
		return strconv.Quote(s[:cut]) + "..."
	}
	return strconv.Quote(s)
}

// cfgRaw is a raw JSON number for an error, cut to cfgQuoteMax bytes.
func cfgRaw(v gjson.Result) string {
	raw := strings.TrimSpace(v.Raw)
	if len(raw) > cfgQuoteMax {
		return raw[:cfgQuoteMax] + "..."
	}
	return raw
}

// ---- scalars ----

func cfgBool(path string, v gjson.Result) (bool, error) {
	switch v.Type {
	case gjson.True:
		return true, nil
	case gjson.False:
		return false, nil
	}
	return false, cfgErr(path, "must be true or false, got %s", cfgTypeName(v))
}

func cfgString(path string, v gjson.Result) (string, error) {
	if v.Type != gjson.String {
		return "", cfgErr(path, "must be a string, got %s", cfgTypeName(v))
	}
	return v.Str, nil
}

// cfgInt reads a whole number in [lo, hi]. 8.0 and 8e0 are read as 8.
func cfgInt(path string, v gjson.Result, lo, hi int64) (int64, error) {
	if v.Type != gjson.Number {
		return 0, cfgErr(path, "must be an integer, got %s", cfgTypeName(v))
	}
	raw := strings.TrimSpace(v.Raw)
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		tooBig := errors.Is(err, strconv.ErrRange)
		if !tooBig {
			f, ferr := strconv.ParseFloat(raw, 64)
			if ferr != nil && !errors.Is(ferr, strconv.ErrRange) || ferr == nil && f != math.Trunc(f) {
				return 0, cfgErr(path, "must be an integer, got %s", cfgRaw(v))
			}
			if ferr != nil || math.Abs(f) > 1<<53 {
				tooBig = true
			} else {
				n = int64(f)
			}
		}
		if tooBig {
			if strings.HasPrefix(raw, "-") {
				return 0, cfgErr(path, "must be >= %d, got %s", lo, cfgRaw(v))
			}
			return 0, cfgErr(path, "must be <= %d, got %s", hi, cfgRaw(v))
		}
	}
	if n < lo {
		return 0, cfgErr(path, "must be >= %d, got %s", lo, cfgRaw(v))
	}
	if n > hi {
		return 0, cfgErr(path, "must be <= %d, got %s", hi, cfgRaw(v))
	}
	return n, nil
}

// cfgFloat reads a finite number in [lo, hi], or (lo, hi] when loOpen.
func cfgFloat(path string, v gjson.Result, lo float64, loOpen bool, hi float64) (float64, error) {
	if v.Type != gjson.Number {
		return 0, cfgErr(path, "must be a number, got %s", cfgTypeName(v))
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(v.Raw), 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, cfgErr(path, "must be a finite number, got %s", cfgRaw(v))
	}
	fmtF := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	switch {
	case loOpen && f <= lo:
		return 0, cfgErr(path, "must be > %s, got %s", fmtF(lo), cfgRaw(v))
	case f < lo:
		return 0, cfgErr(path, "must be >= %s, got %s", fmtF(lo), cfgRaw(v))
	case f > hi:
		return 0, cfgErr(path, "must be <= %s, got %s", fmtF(hi), cfgRaw(v))
	}
	return f, nil
}

// ---- field setters ----

func cfgObjectField(fields cfgFields) cfgSetter {
	return func(p string, v gjson.Result) error { return cfgObject(p, v, fields) }
}

func cfgBoolField(dst *bool) cfgSetter {
	return func(p string, v gjson.Result) error {
		b, err := cfgBool(p, v)
		if err == nil {
			*dst = b
		}
		return err
	}
}

func cfgIntField(dst *int, lo, hi int64) cfgSetter {
	return func(p string, v gjson.Result) error {
		n, err := cfgInt(p, v, lo, hi)
		if err == nil {
			*dst = int(n)
		}
		return err
	}
}

func cfgInt64Field(dst *int64, lo, hi int64) cfgSetter {
	return func(p string, v gjson.Result) error {
		n, err := cfgInt(p, v, lo, hi)
		if err == nil {
			*dst = n
		}
		return err
	}
}

func cfgFloatField(dst *float64, lo float64, loOpen bool, hi float64) cfgSetter {
	return func(p string, v gjson.Result) error {
		f, err := cfgFloat(p, v, lo, loOpen, hi)
		if err == nil {
			*dst = f
		}
		return err
	}
}

func cfgEnumField(dst *string, allowed ...string) cfgSetter {
	return func(p string, v gjson.Result) error {
		s, err := cfgString(p, v)
		if err != nil {
			return err
		}
		for _, a := range allowed {
			if s == a {
				*dst = s
				return nil
			}
		}
		return cfgErr(p, "must be one of %s, got %s", strings.Join(allowed, ", "), cfgQuote(s))
	}
}

// cfgClusterField reads an Envoy cluster name: Istio's names hold "|" and dots, so any
// printable text without whitespace is accepted.
func cfgClusterField(dst *string) cfgSetter {
	return func(p string, v gjson.Result) error {
		s, err := cfgString(p, v)
		if err != nil {
			return err
		}
		if s == "" {
			return cfgErr(p, "must not be empty")
		}
		for _, r := range s {
			if r <= ' ' || r == 0x7f {
				return cfgErr(p, "must not contain whitespace or control characters, got %s", cfgQuote(s))
			}
		}
		*dst = s
		return nil
	}
}

// cfgURLPath checks a request path: "/" first, printable ASCII without space, and
// neither "?" nor "#".
func cfgURLPath(p, s string) error {
	if !strings.HasPrefix(s, "/") {
		return cfgErr(p, "must start with \"/\", got %s", cfgQuote(s))
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if b <= ' ' || b >= 0x7f {
			return cfgErr(p, "must be printable ASCII without spaces, got %s", cfgQuote(s))
		}
		if b == '?' || b == '#' {
			return cfgErr(p, "must not contain %q, got %s", string(b), cfgQuote(s))
		}
	}
	return nil
}

func cfgPathField(dst *string) cfgSetter {
	return func(p string, v gjson.Result) error {
		s, err := cfgString(p, v)
		if err != nil {
			return err
		}
		if err := cfgURLPath(p, s); err != nil {
			return err
		}
		*dst = s
		return nil
	}
}

func cfgRoutes(dst *[]string) cfgSetter {
	return func(p string, v gjson.Result) error {
		var routes []string
		err := cfgArray(p, v, func(_ int, ep string, el gjson.Result) error {
			s, err := cfgString(ep, el)
			if err != nil {
				return err
			}
			if err := cfgURLPath(ep, s); err != nil {
				return err
			}
			for _, r := range routes {
				if r == s {
					return cfgErr(ep, "duplicate route %s", cfgQuote(s))
				}
			}
			routes = append(routes, s)
			return nil
		})
		if err != nil {
			return err
		}
		if len(routes) == 0 {
			return cfgErr(p, "must hold at least one path")
		}
		*dst = routes
		return nil
	}
}

func cfgNamespaceField(dst *string) cfgSetter {
	return func(p string, v gjson.Result) error {
		s, err := cfgString(p, v)
		if err != nil {
			return err
		}
		ok := s != "" && len(s) <= cfgNamespaceMax
		for i := 0; ok && i < len(s); i++ {
			b := s[i]
			ok = b == '_' || b == '.' || b == '-' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
		}
		if !ok {
			return cfgErr(p, "must be 1 to %d characters of [A-Za-z0-9_.-], got %s", cfgNamespaceMax, cfgQuote(s))
		}
		*dst = s
		return nil
	}
}

// cfgHeaderName checks an HTTP header name (an RFC 9110 token) and lower-cases it.
func cfgHeaderName(p, s string) (string, error) {
	if s == "" {
		return "", cfgErr(p, "must not be empty")
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !(b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0) {
			return "", cfgErr(p, "%s is not a valid header name", cfgQuote(s))
		}
	}
	return strings.ToLower(s), nil
}

func cfgHeaderField(dst *string, mayBeEmpty bool) cfgSetter {
	return func(p string, v gjson.Result) error {
		s, err := cfgString(p, v)
		if err != nil {
			return err
		}
		if s == "" && mayBeEmpty {
			*dst = ""
			return nil
		}
		name, err := cfgHeaderName(p, s)
		if err != nil {
			return err
		}
		*dst = name
		return nil
	}
}

func cfgHeaderList(dst *[]string) cfgSetter {
	return func(p string, v gjson.Result) error {
		names := []string{}
		err := cfgArray(p, v, func(_ int, ep string, el gjson.Result) error {
			s, err := cfgString(ep, el)
			if err != nil {
				return err
			}
			name, err := cfgHeaderName(ep, s)
			if err != nil {
				return err
			}
			for _, n := range names {
				if n == name {
					return cfgErr(ep, "duplicate header %s", cfgQuote(name))
				}
			}
			names = append(names, name)
			return nil
		})
		if err == nil {
			*dst = names
		}
		return err
	}
}

func cfgBodyFields(dst *[]string) cfgSetter {
	return func(p string, v gjson.Result) error {
		fields := []string{}
		err := cfgArray(p, v, func(_ int, ep string, el gjson.Result) error {
			s, err := cfgString(ep, el)
			if err != nil {
				return err
			}
			if s == "" {
				return cfgErr(ep, "must not be empty")
			}
			for _, f := range fields {
				if f == s {
					return cfgErr(ep, "duplicate body field %s", cfgQuote(s))
				}
			}
			fields = append(fields, s)
			return nil
		})
		if err == nil {
			*dst = fields
		}
		return err
	}
}

func cfgStatusList(dst *[]int) cfgSetter {
	return func(p string, v gjson.Result) error {
		statuses := []int{}
		err := cfgArray(p, v, func(_ int, ep string, el gjson.Result) error {
			n, err := cfgInt(ep, el, 100, 599)
			if err != nil {
				return err
			}
			for _, s := range statuses {
				if s == int(n) {
					return cfgErr(ep, "duplicate status %d", n)
				}
			}
			statuses = append(statuses, int(n))
			return nil
		})
		if err == nil {
			*dst = statuses
		}
		return err
	}
}

// ---- models ----

// cfgModelNameMax bounds a model name: far above any real one, and short enough to
// quote whole in an error.
const cfgModelNameMax = 256

// cfgModels reads the models list. A fleet's disaggregation starts from the top
// level's (base) and takes the fleet's own fields over it.
func cfgModels(path string, v gjson.Result, base DisaggregationConfig) ([]Model, error) {
	var out []Model
	namedBy := map[string]string{}  // name → the field that named it first
	taggedBy := map[string]string{} // a first name's metric tag → the field that gave it
	err := cfgArray(path, v, func(i int, mp string, el gjson.Result) error {
		m := Model{Disaggregation: base}
		hasNames, hasPools := false, false
		err := cfgObject(mp, el, cfgFields{
			"names": func(p string, v gjson.Result) error {
				hasNames = true
				err := cfgArray(p, v, func(j int, np string, nv gjson.Result) error {
					s, err := cfgString(np, nv)
					if err != nil {
						return err
					}
					if err := cfgModelName(np, s, j == 0); err != nil {
						return err
					}
					if prev, dup := namedBy[s]; dup {
						return cfgErr(np, "%s is already named by %s", cfgQuote(s), prev)
					}
					namedBy[s] = np
					if j == 0 {
						tag := ModelMetricTag(s)
						if prev, dup := taggedBy[tag]; dup {
							return cfgErr(np, "%s names its fleet's metrics %s, as %s does: the two fleets' counters would be one; rename one, or put another of its names first",
								cfgQuote(s), cfgQuote(tag), prev)
						}
						taggedBy[tag] = np
					}
					m.Names = append(m.Names, s)
					return nil
				})
				if err == nil && len(m.Names) == 0 {
					return cfgErr(p, "must hold at least one name")
				}
				return err
			},
			"pools": func(p string, v gjson.Result) error {
				hasPools = true
				return cfgObject(p, v, cfgFields{
					"decode":  cfgPoolField(&m.Pools.Decode, false),
					"prefill": cfgPoolField(&m.Pools.Prefill, true),
				})
			},
			"disaggregation": cfgDisaggregationField(&m.Disaggregation),
		})
		switch {
		case err != nil:
			return err
		case !hasNames:
			return cfgErr(mp+".names", "required field missing")
		case !hasPools:
			return cfgErr(mp+".pools", "required field missing")
		case len(m.Pools.Decode.Endpoints) == 0 && m.Pools.Decode.Discovery == nil:
			return cfgErr(mp+".pools.decode.endpoints", "must hold at least one endpoint (or set %s.pools.decode.discovery)", mp)
		case m.Disaggregation.Mode != ModeOff && len(m.Pools.Prefill.Endpoints) == 0 && m.Pools.Prefill.Discovery == nil:
			return cfgErr(mp+".pools.prefill.endpoints",
				"disaggregation.mode %q needs at least one prefill endpoint (or %s.pools.prefill.discovery; or set %s.disaggregation.mode \"off\")",
				m.Disaggregation.Mode, mp, mp)
		}
		out = append(out, m)
		return nil
	})
	return out, err
}

// cfgModelName checks one of a fleet's names: printable, at most cfgModelNameMax
// bytes, "*" only at the end (a prefix), and the first name exact.
func cfgModelName(p, s string, first bool) error {
	if s == "" {
		return cfgErr(p, "must not be empty")
	}
	if len(s) > cfgModelNameMax {
		return cfgErr(p, "must be at most %d bytes, got %d", cfgModelNameMax, len(s))
	}
	for i := 0; i < len(s); i++ {
		if b := s[i]; b < ' ' || b == 0x7f {
			return cfgErr(p, "must not contain control characters, got %s", cfgQuote(s))
		}
	}
	if i := strings.IndexByte(s, '*'); i >= 0 && i != len(s)-1 {
		return cfgErr(p, "\"*\" may only end a name (a prefix), got %s", cfgQuote(s))
	}
	if first && strings.HasSuffix(s, "*") {
		return cfgErr(p, "the first name names the fleet (catalogue, headers.model, metrics) and must be exact, got %s", cfgQuote(s))
	}
	return nil
}

// ---- pools ----

func cfgPoolField(dst *Pool, prefill bool) cfgSetter {
	return cfgObjectField(cfgFields{
		"endpoints": func(p string, v gjson.Result) error {
			eps := []Endpoint{}
			seen := map[string]int{}
			err := cfgArray(p, v, func(i int, ep string, el gjson.Result) error {
				e := Endpoint{DPSize: 1}
				hasAddress := false
				err := cfgObject(ep, el, cfgFields{
					"address": func(ap string, av gjson.Result) error {
						s, err := cfgString(ap, av)
						if err != nil {
							return err
						}
						if err := cfgHostPort(ap, s); err != nil {
							return err
						}
						key := strings.ToLower(s)
						if j, dup := seen[key]; dup {
							return cfgErr(ap, "duplicate address %s (also endpoints[%d])", cfgQuote(s), j)
						}
						seen[key] = i
						e.Address, hasAddress = s, true
						return nil
					},
					"dp_size":       cfgIntField(&e.DPSize, 1, cfgDPSizeMax),
					"dp_rank_start": cfgIntField(&e.DPRankStart, 0, cfgDPRankStartMax),
					"bootstrap_port": func(bp string, bv gjson.Result) error {
						if !prefill {
							return cfgErr(bp, "only allowed in the prefill pool (sglang bootstrap)")
						}
						return cfgIntField(&e.BootstrapPort, 1, cfgPortMax)(bp, bv)
					},
				})
				if err != nil {
					return err
				}
				if !hasAddress {
					return cfgErr(ep+".address", "required field missing")
				}
				eps = append(eps, e)
				return nil
			})
			if err == nil {
				dst.Endpoints = eps
			}
			return err
		},
		"discovery": func(p string, v gjson.Result) error {
			d := DefaultDiscovery()
			err := cfgObject(p, v, cfgFields{
				"source":          cfgEnumField(&d.Source, DiscoveryEnvoyAdmin, DiscoveryHTTP),
				"cluster":         cfgClusterField(&d.Cluster),
				"service_cluster": cfgClusterField(&d.ServiceCluster),
				"path":            cfgPathField(&d.Path),
				"dp_size":         cfgIntField(&d.DPSize, 1, cfgDPSizeMax),
				"interval_ms":     cfgInt64Field(&d.IntervalMS, cfgIntervalMSMin, cfgIntervalMSMax),
			})
			if err != nil {
				return err
			}
			switch {
			case d.Source == DiscoveryEnvoyAdmin && d.ServiceCluster == "":
				return cfgErr(p+".service_cluster", "required with source %q (the cluster the requests go to)", d.Source)
			case d.Source == DiscoveryEnvoyAdmin && d.Path != "":
				return cfgErr(p+".path", "only for source %q (envoy_admin reads the admin's /clusters)", DiscoveryHTTP)
			case d.Source == DiscoveryHTTP && d.Path == "":
				return cfgErr(p+".path", "required with source %q", d.Source)
			case d.Source == DiscoveryHTTP && d.ServiceCluster != "":
				return cfgErr(p+".service_cluster", "only for source %q", DiscoveryEnvoyAdmin)
			}
			dst.Discovery = &d
			return nil
		},
	})
}

// splitHostPort splits "host:port" or "[host]:port" as net.SplitHostPort does. Package
// net is kept out of the module: it links in a WASI import (path_filestat_get) that
// the proxy-wasm hosts of older Envoy and Istio releases do not provide.
func splitHostPort(s string) (host, port string, ok bool) {
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 || end+1 >= len(s) || s[end+1] != ':' {
			return "", "", false
		}
		host, port = s[1:end], s[end+2:]
		if strings.ContainsAny(host, "[]") || strings.ContainsAny(port, "[]:") {
			return "", "", false
		}
		return host, port, true
	}
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return "", "", false
	}
	host, port = s[:i], s[i+1:]
	if strings.ContainsAny(host, "[]:") || strings.ContainsAny(port, "[]") {
		return "", "", false
	}
	return host, port, true
}

// cfgHostPort checks "host:port": a DNS name, an IPv4 address or a bracketed IPv6
// address, and a decimal port 1..65535 without leading zeros.
func cfgHostPort(p, s string) error {
	bad := func(why string) error { return cfgErr(p, "%s is not host:port (%s)", cfgQuote(s), why) }
	host, port, ok := splitHostPort(s)
	if !ok {
		return bad("want host:port or [ipv6]:port")
	}
	if host == "" {
		return bad("empty host")
	}
	if port == "" || port[0] == '0' || len(port) > 5 || strings.Trim(port, "0123456789") != "" {
		return bad("port must be a number 1..65535")
	}
	if n, _ := strconv.Atoi(port); n < 1 || n > cfgPortMax {
		return bad("port must be a number 1..65535")
	}
	if strings.Contains(host, ":") { // splitHostPort only allows this inside brackets
		if ip, err := netip.ParseAddr(host); err != nil || !ip.Is6() || ip.Zone() != "" {
			return bad("bad IPv6 address")
		}
		return nil
	}
	if strings.HasPrefix(s, "[") {
		return bad("brackets are for IPv6 addresses only")
	}
	if strings.Trim(host, "0123456789.") == "" { // all digits and dots: must be IPv4
		if ip, err := netip.ParseAddr(host); err != nil || !ip.Is4() {
			return bad("bad IPv4 address")
		}
		return nil
	}
	name := strings.TrimSuffix(host, ".")
	if len(name) > 253 {
		return bad("host name longer than 253 characters")
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return bad("host name labels must be 1..63 characters")
		}
		for i := 0; i < len(label); i++ {
			b := label[i]
			if !(b == '-' || b == '_' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z') {
				return bad("bad character in host name")
			}
		}
	}
	return nil
}

// cfgDisaggregationField parses a disaggregation block into d, at the top level and
// in a fleet of models alike: fields the block leaves out keep d's values.
func cfgDisaggregationField(d *DisaggregationConfig) func(string, gjson.Result) error {
	return cfgObjectField(cfgFields{
		"mode": cfgEnumField(&d.Mode,
			ModeOff, ModeSidecar, ModeVLLM, ModeTRTLLM, ModeSGLang),
		"threshold_tokens":   cfgIntField(&d.ThresholdTokens, 0, cfgThresholdTokensMax),
		"uncached_only":      cfgBoolField(&d.UncachedOnly),
		"prefill_cluster":    cfgClusterField(&d.PrefillCluster),
		"prefill_timeout_ms": cfgInt64Field(&d.PrefillTimeoutMS, 1, cfgPrefillTimeoutMSMax),
	})
}
