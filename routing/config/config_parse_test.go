package config

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const cfgMinimal = `{"pools":{"decode":{"endpoints":[{"address":"10.0.0.11:8000"}]}}}`

// cfgWith is the minimal config plus more top-level members.
func cfgWith(members string) string {
	return `{"pools":{"decode":{"endpoints":[{"address":"10.0.0.11:8000"}]}},` + members + `}`
}

// cfgDecode is a config whose decode pool holds the given endpoint objects.
func cfgDecode(endpoints string) string {
	return `{"pools":{"decode":{"endpoints":[` + endpoints + `]}}}`
}

func TestParseConfigDefaults(t *testing.T) {
	c, err := ParseConfig([]byte(cfgMinimal))
	require.NoError(t, err)

	want := DefaultConfig()
	want.Pools.Decode.Endpoints = []Endpoint{{Address: "10.0.0.11:8000", DPSize: 1}}
	assert.Equal(t, want, c)

	d := DefaultConfig()
	assert.Equal(t, d.Routes, c.Routes)
	assert.Equal(t, int64(4<<20), c.MaxBodyBytes)
	assert.Equal(t, 4, c.CharsPerToken)
	assert.False(t, c.TrustClientDPRank)
	require.Len(t, c.Pools.Decode.Endpoints, 1)
	assert.Equal(t, 1, c.Pools.Decode.Endpoints[0].DPSize)
	assert.Equal(t, 0, c.Pools.Decode.Endpoints[0].BootstrapPort)
	assert.Empty(t, c.Pools.Prefill.Endpoints)
	assert.Equal(t, d.Conversation, c.Conversation)
	assert.Equal(t, d.Prefix, c.Prefix)
	assert.Equal(t, d.Balance, c.Balance)
	assert.Equal(t, ModeOff, c.Disaggregation.Mode)
	assert.Equal(t, []int{502, 503, 504}, c.Health.FailureStatuses)
	assert.Equal(t, d.EngineMetrics, c.EngineMetrics)
	assert.Equal(t, "kvroute", c.State.Namespace)
	assert.Equal(t, d.Headers, c.Headers)
}

func TestParseConfigSpecDefaultsDocument(t *testing.T) {
	// The whole default configuration, written out in full, parses to the defaults.
	spec := `{
	  "routes": ["/v1/chat/completions", "/v1/completions", "/v1/responses"],
	  "max_body_bytes": 4194304,
	  "chars_per_token": 4,
	  "trust_client_dp_rank": false,
	  "pools": {
	    "decode":  {"endpoints": [{"address": "10.0.0.11:8000", "dp_size": 1}]},
	    "prefill": {"endpoints": []}
	  },
	  "conversation": {
	    "enabled": true,
	    "headers": ["x-session-id", "x-correlation-id", "x-session-affinity", "x-multi-turn-session-id"],
	    "body_fields": ["conversation_params.conversation_id", "prompt_cache_key", "conversation"],
	    "max_sessions": 100000,
	    "first_turn": "round_robin"
	  },
	  "prefix": {"enabled": true, "block_tokens": 16, "match_rate_threshold": 0.1,
	             "continuation_threshold": 0.75, "skip_blocks": 0, "capacity_blocks": 262144},
	  "balance": {"load_metric": "requests", "load_weight": 1.0, "fair_share_multiplier": 2.0},
	  "disaggregation": {"mode": "off", "threshold_tokens": 0, "uncached_only": false,
	                     "prefill_cluster": "kvroute_prefill", "prefill_timeout_ms": 60000},
	  "health": {"failure_statuses": [502, 503, 504], "failure_threshold": 3, "cooldown_ms": 10000},
	  "engine_metrics": {"enabled": false, "flavor": "vllm", "cluster": "kvroute_metrics",
	                     "path": "/metrics", "interval_ms": 1000, "stale_ms": 5000},
	  "state": {"namespace": "kvroute", "max_cas_retries": 8, "lease_ms": 600000},
	  "headers": {
	    "destination": "x-gateway-destination-endpoint",
	    "dp_rank": "x-data-parallel-rank",
	    "prefill_destination": "x-prefiller-host-port",
	    "prefill_dp_rank": "x-prefiller-data-parallel-rank",
	    "decision": "x-kvroute-decision"
	  }
	}`
	c, err := ParseConfig([]byte(spec))
	require.NoError(t, err)
	want := DefaultConfig()
	want.Pools.Decode.Endpoints = []Endpoint{{Address: "10.0.0.11:8000", DPSize: 1}}
	want.Pools.Prefill.Endpoints = []Endpoint{}
	assert.Equal(t, want, c)
}

func TestParseConfigFull(t *testing.T) {
	full := `{
	  "routes": ["/v1/chat/completions", "/custom/generate"],
	  "max_body_bytes": 1048576,
	  "chars_per_token": 3,
	  "trust_client_dp_rank": true,
	  "pools": {
	    "decode": {"endpoints": [
	      {"address": "10.0.0.11:8000", "dp_size": 4},
	      {"address": "[fd00::12]:8001"},
	      {"address": "decode-2.llm.svc.cluster.local:9000", "dp_size": 2, "dp_rank_start": 2}
	    ]},
	    "prefill": {"endpoints": [
	      {"address": "10.0.1.1:8100", "dp_size": 2, "dp_rank_start": 8.0, "bootstrap_port": 9001},
	      {"address": "prefill-1:8100"}
	    ]}
	  },
	  "conversation": {
	    "enabled": false,
	    "headers": ["X-Chat-ID", "x-thread"],
	    "body_fields": ["metadata.session", "user"],
	    "max_sessions": 5000,
	    "first_turn": "hash"
	  },
	  "prefix": {"enabled": false, "block_tokens": 64, "match_rate_threshold": 0.25,
	             "continuation_threshold": 0.5, "skip_blocks": 3, "capacity_blocks": 1024,
	             "target_cache_tokens": 2097152},
	  "balance": {"load_metric": "tokens", "load_weight": 0.5, "fair_share_multiplier": 1.5},
	  "disaggregation": {"mode": "sglang", "threshold_tokens": 2048, "uncached_only": true,
	                     "prefill_cluster": "outbound|8100||prefill.llm.svc.cluster.local",
	                     "prefill_timeout_ms": 30000},
	  "health": {"failure_statuses": [500, 503], "failure_threshold": 5, "cooldown_ms": 0},
	  "engine_metrics": {"enabled": true, "flavor": "sglang", "cluster": "metrics_cluster",
	                     "path": "/engine/metrics", "interval_ms": 2000, "stale_ms": 2000},
	  "state": {"namespace": "kv.route-2_a", "max_cas_retries": 16, "lease_ms": 120000},
	  "headers": {
	    "destination": "X-Dest",
	    "dp_rank": "x-rank",
	    "prefill_destination": "x-p-dest",
	    "prefill_dp_rank": "x-p-rank",
	    "decision": ""
	  }
	}`
	c, err := ParseConfig([]byte(full))
	require.NoError(t, err)

	assert.Equal(t, []string{"/v1/chat/completions", "/custom/generate"}, c.Routes)
	assert.Equal(t, int64(1048576), c.MaxBodyBytes)
	assert.Equal(t, 3, c.CharsPerToken)
	assert.True(t, c.TrustClientDPRank)
	assert.Equal(t, []Endpoint{
		{Address: "10.0.0.11:8000", DPSize: 4},
		{Address: "[fd00::12]:8001", DPSize: 1},
		{Address: "decode-2.llm.svc.cluster.local:9000", DPSize: 2, DPRankStart: 2},
	}, c.Pools.Decode.Endpoints)
	assert.Equal(t, []Endpoint{
		{Address: "10.0.1.1:8100", DPSize: 2, DPRankStart: 8, BootstrapPort: 9001},
		{Address: "prefill-1:8100", DPSize: 1},
	}, c.Pools.Prefill.Endpoints)
	assert.Equal(t, ConversationConfig{
		Enabled:     false,
		Headers:     []string{"x-chat-id", "x-thread"},
		BodyFields:  []string{"metadata.session", "user"},
		MaxSessions: 5000,
		FirstTurn:   FirstTurnHash,
	}, c.Conversation)
	assert.Equal(t, PrefixConfig{
		Enabled:               false,
		BlockTokens:           64,
		MatchRateThreshold:    0.25,
		ContinuationThreshold: 0.5,
		SkipBlocks:            3,
		CapacityBlocks:        1024,
		TargetCacheTokens:     2097152,
	}, c.Prefix)
	assert.Equal(t, BalanceConfig{LoadMetric: LoadMetricTokens, LoadWeight: 0.5, FairShareMultiplier: 1.5}, c.Balance)
	assert.Equal(t, DisaggregationConfig{
		Mode:             ModeSGLang,
		ThresholdTokens:  2048,
		UncachedOnly:     true,
		PrefillCluster:   "outbound|8100||prefill.llm.svc.cluster.local",
		PrefillTimeoutMS: 30000,
	}, c.Disaggregation)
	assert.Equal(t, HealthConfig{FailureStatuses: []int{500, 503}, FailureThreshold: 5, CooldownMS: 0}, c.Health)
	assert.Equal(t, EngineMetricsConfig{
		Enabled:    true,
		Flavor:     FlavorSGLang,
		Cluster:    "metrics_cluster",
		Path:       "/engine/metrics",
		IntervalMS: 2000,
		StaleMS:    2000,
	}, c.EngineMetrics)
	assert.Equal(t, StateConfig{Namespace: "kv.route-2_a", MaxCASRetries: 16, LeaseMS: 120000}, c.State)
	assert.Equal(t, HeadersConfig{
		Destination:        "x-dest",
		DPRank:             "x-rank",
		PrefillDestination: "x-p-dest",
		PrefillDPRank:      "x-p-rank",
		Decision:           "",
	}, c.Headers)
}

func TestParseConfigAccepts(t *testing.T) {
	tests := []struct {
		name  string
		json  string
		check func(t *testing.T, c Config)
	}{
		{"ipv6 loopback", cfgDecode(`{"address":"[::1]:8000"}`), func(t *testing.T, c Config) {
			assert.Equal(t, "[::1]:8000", c.Pools.Decode.Endpoints[0].Address)
		}},
		{"host name", cfgDecode(`{"address":"vllm-0.vllm.default.svc:8000"}`), func(t *testing.T, c Config) {
			assert.Equal(t, "vllm-0.vllm.default.svc:8000", c.Pools.Decode.Endpoints[0].Address)
		}},
		{"port 65535", cfgDecode(`{"address":"a:65535"}`), func(t *testing.T, c Config) {
			assert.Equal(t, "a:65535", c.Pools.Decode.Endpoints[0].Address)
		}},
		{"whole number written as float", cfgWith(`"chars_per_token": 8.0, "max_body_bytes": 1e3`), func(t *testing.T, c Config) {
			assert.Equal(t, 8, c.CharsPerToken)
			assert.Equal(t, int64(1000), c.MaxBodyBytes)
		}},
		{"integer as float field", cfgWith(`"balance": {"load_weight": 0, "fair_share_multiplier": 1}`), func(t *testing.T, c Config) {
			assert.Equal(t, 0.0, c.Balance.LoadWeight)
			assert.Equal(t, 1.0, c.Balance.FairShareMultiplier)
		}},
		{"thresholds at their bounds", cfgWith(`"prefix": {"match_rate_threshold": 1, "continuation_threshold": 1}`), func(t *testing.T, c Config) {
			assert.Equal(t, 1.0, c.Prefix.MatchRateThreshold)
			assert.Equal(t, 1.0, c.Prefix.ContinuationThreshold)
		}},
		{"empty lists", cfgWith(`"conversation": {"headers": [], "body_fields": []}, "health": {"failure_statuses": []}`), func(t *testing.T, c Config) {
			assert.Empty(t, c.Conversation.Headers)
			assert.Empty(t, c.Conversation.BodyFields)
			assert.Empty(t, c.Health.FailureStatuses)
		}},
		{"same address in both pools", `{"pools":{"decode":{"endpoints":[{"address":"a:1"}]},"prefill":{"endpoints":[{"address":"a:1"}]}},"disaggregation":{"mode":"vllm"}}`, func(t *testing.T, c Config) {
			assert.Equal(t, ModeVLLM, c.Disaggregation.Mode)
			assert.Equal(t, "a:1", c.Pools.Prefill.Endpoints[0].Address)
		}},
		{"partial section keeps other defaults", cfgWith(`"prefix": {"block_tokens": 32}`), func(t *testing.T, c Config) {
			assert.Equal(t, 32, c.Prefix.BlockTokens)
			assert.Equal(t, DefaultConfig().Prefix.CapacityBlocks, c.Prefix.CapacityBlocks)
			assert.True(t, c.Prefix.Enabled)
		}},
		{"whitespace around document", "\n\t " + cfgMinimal + " \r\n", func(t *testing.T, c Config) {
			assert.Len(t, c.Pools.Decode.Endpoints, 1)
		}},
		{"escaped key", `{"pools":{"decode":{"endpoints":[{"addr\u0065ss":"a:1"}]}}}`, func(t *testing.T, c Config) {
			assert.Equal(t, "a:1", c.Pools.Decode.Endpoints[0].Address)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tt.json))
			require.NoError(t, err)
			tt.check(t, c)
		})
	}
}

func TestParseConfigRefusals(t *testing.T) {
	tests := []struct {
		name   string
		json   string
		field  string // the error must start with field + ": "
		reason string // and contain this
	}{
		// The document.
		{"empty input", ``, "pools.decode.endpoints", "at least one endpoint"},
		{"whitespace input", " \n\t ", "pools.decode.endpoints", "at least one endpoint"},
		{"empty object", `{}`, "pools.decode.endpoints", "at least one endpoint"},
		{"array input", `[]`, "configuration", "must be a JSON object, got array"},
		{"null input", `null`, "configuration", "must be a JSON object, got null"},
		{"string input", `"x"`, "configuration", "must be a JSON object"},
		{"not json", `{"routes":`, "configuration", "not valid JSON"},
		{"trailing garbage", cfgMinimal + `}`, "configuration", "not valid JSON"},

		// Unknown, duplicate and null fields.
		{"unknown top-level field", cfgWith(`"bogus": 1`), "bogus", "unknown field"},
		{"unknown nested field", cfgWith(`"prefix": {"block_size": 16}`), "prefix.block_size", "unknown field"},
		{"unknown pools field", `{"pools":{"decode":{"endpoints":[{"address":"a:1"}]},"encode":{}}}`, "pools.encode", "unknown field"},
		{"unknown pool field", `{"pools":{"decode":{"endpoints":[{"address":"a:1"}],"weight":1}}}`, "pools.decode.weight", "unknown field"},
		{"unknown endpoint field", cfgDecode(`{"address":"a:1"},{"address":"b:1","port":1}`), "pools.decode.endpoints[1].port", "unknown field"},
		{"unknown headers field", cfgWith(`"headers": {"rank": "x"}`), "headers.rank", "unknown field"},
		{"unknown field with odd name", cfgWith(`"state": {"a\nb": 1}`), `state."a\nb"`, "unknown field"},
		{"duplicate field", cfgWith(`"chars_per_token": 4, "chars_per_token": 5`), "chars_per_token", "duplicate field"},
		{"null field", cfgWith(`"max_body_bytes": null`), "max_body_bytes", "must not be null"},
		{"null section", cfgWith(`"prefix": null`), "prefix", "must not be null"},

		// Wrong types.
		{"string for integer", cfgWith(`"max_body_bytes": "4096"`), "max_body_bytes", "must be an integer, got string"},
		{"fraction for integer", cfgDecode(`{"address":"a:1","dp_size":1.5}`), "pools.decode.endpoints[0].dp_size", "must be an integer, got 1.5"},
		{"string for boolean", cfgWith(`"trust_client_dp_rank": "true"`), "trust_client_dp_rank", "must be true or false, got string"},
		{"number for boolean", cfgWith(`"prefix": {"enabled": 1}`), "prefix.enabled", "must be true or false, got number"},
		{"string for float", cfgWith(`"balance": {"load_weight": "1"}`), "balance.load_weight", "must be a number, got string"},
		{"number for string", cfgWith(`"state": {"namespace": 7}`), "state.namespace", "must be a string, got number"},
		{"object for array", cfgWith(`"routes": {"a": "/x"}`), "routes", "must be an array, got object"},
		{"string for object", cfgWith(`"conversation": "on"`), "conversation", "must be an object, got string"},
		{"string endpoint", cfgDecode(`"a:1"`), "pools.decode.endpoints[0]", "must be an object, got string"},
		{"number in header list", cfgWith(`"conversation": {"headers": ["x-a", 5]}`), "conversation.headers[1]", "must be a string, got number"},
		{"string status", cfgWith(`"health": {"failure_statuses": ["503"]}`), "health.failure_statuses[0]", "must be an integer, got string"},
		{"beyond int64", cfgWith(`"max_body_bytes": 99999999999999999999`), "max_body_bytes", "must be <= 1073741824"},
		{"huge float integer", cfgWith(`"max_body_bytes": 1e300`), "max_body_bytes", "must be <= 1073741824"},
		{"infinite float", cfgWith(`"balance": {"load_weight": 1e400}`), "balance.load_weight", "finite"},

		// Routes.
		{"empty routes", cfgWith(`"routes": []`), "routes", "at least one path"},
		{"route without slash", cfgWith(`"routes": ["v1/chat/completions"]`), "routes[0]", `must start with "/"`},
		{"route with query", cfgWith(`"routes": ["/v1/completions", "/v1/x?y=1"]`), "routes[1]", `must not contain "?"`},
		{"route with space", cfgWith(`"routes": ["/v1 x"]`), "routes[0]", "printable ASCII"},
		{"duplicate route", cfgWith(`"routes": ["/a", "/a"]`), "routes[1]", "duplicate route"},

		// Out of range, every numeric field.
		{"max_body_bytes 0", cfgWith(`"max_body_bytes": 0`), "max_body_bytes", "must be >= 1, got 0"},
		{"max_body_bytes too big", cfgWith(`"max_body_bytes": 2147483648`), "max_body_bytes", "must be <= 1073741824"},
		{"chars_per_token 0", cfgWith(`"chars_per_token": 0`), "chars_per_token", "must be >= 1, got 0"},
		{"chars_per_token 65", cfgWith(`"chars_per_token": 65`), "chars_per_token", "must be <= 64, got 65"},
		{"dp_size 0", cfgDecode(`{"address":"a:1","dp_size":0}`), "pools.decode.endpoints[0].dp_size", "must be >= 1, got 0"},
		{"dp_size negative", cfgDecode(`{"address":"a:1","dp_size":-2}`), "pools.decode.endpoints[0].dp_size", "must be >= 1, got -2"},
		{"dp_size 1025", cfgDecode(`{"address":"a:1","dp_size":1025}`), "pools.decode.endpoints[0].dp_size", "must be <= 1024"},
		{"dp_rank_start negative", cfgDecode(`{"address":"a:1"},{"address":"b:1","dp_rank_start":-1}`), "pools.decode.endpoints[1].dp_rank_start", "must be >= 0, got -1"},
		{"dp_rank_start string", cfgDecode(`{"address":"a:1"},{"address":"b:1","dp_rank_start":"4"}`), "pools.decode.endpoints[1].dp_rank_start", "must be an integer"},
		{"dp_rank_start fraction", cfgDecode(`{"address":"a:1","dp_rank_start":0.5}`), "pools.decode.endpoints[0].dp_rank_start", "must be an integer, got 0.5"},
		{"dp_rank_start bool", cfgDecode(`{"address":"a:1","dp_rank_start":true}`), "pools.decode.endpoints[0].dp_rank_start", "must be an integer"},
		{"dp_rank_start 65536", cfgDecode(`{"address":"a:1","dp_rank_start":65536}`), "pools.decode.endpoints[0].dp_rank_start", "must be <= 65535"},
		{"prefill dp_rank_start negative", `{"pools":{"decode":{"endpoints":[{"address":"a:1"}]},"prefill":{"endpoints":[{"address":"p:1","dp_rank_start":-3}]}}}`, "pools.prefill.endpoints[0].dp_rank_start", "must be >= 0, got -3"},
		{"bootstrap_port 0", `{"pools":{"decode":{"endpoints":[{"address":"a:1"}]},"prefill":{"endpoints":[{"address":"p:1","bootstrap_port":0}]}}}`, "pools.prefill.endpoints[0].bootstrap_port", "must be >= 1, got 0"},
		{"bootstrap_port 65536", `{"pools":{"decode":{"endpoints":[{"address":"a:1"}]},"prefill":{"endpoints":[{"address":"p:1","bootstrap_port":65536}]}}}`, "pools.prefill.endpoints[0].bootstrap_port", "must be <= 65535"},
		{"max_sessions 0", cfgWith(`"conversation": {"max_sessions": 0}`), "conversation.max_sessions", "must be >= 1, got 0"},
		{"max_sessions too big", cfgWith(`"conversation": {"max_sessions": 100000001}`), "conversation.max_sessions", "must be <= 100000000"},
		{"block_tokens 0", cfgWith(`"prefix": {"block_tokens": 0}`), "prefix.block_tokens", "must be >= 1, got 0"},
		{"block_tokens too big", cfgWith(`"prefix": {"block_tokens": 65537}`), "prefix.block_tokens", "must be <= 65536"},
		{"match_rate_threshold negative", cfgWith(`"prefix": {"match_rate_threshold": -0.1}`), "prefix.match_rate_threshold", "must be >= 0, got -0.1"},
		{"match_rate_threshold above 1", cfgWith(`"prefix": {"match_rate_threshold": 1.01}`), "prefix.match_rate_threshold", "must be <= 1, got 1.01"},
		{"continuation_threshold 0", cfgWith(`"prefix": {"continuation_threshold": 0}`), "prefix.continuation_threshold", "must be > 0, got 0"},
		{"continuation_threshold above 1", cfgWith(`"prefix": {"continuation_threshold": 1.5}`), "prefix.continuation_threshold", "must be <= 1"},
		{"skip_blocks negative", cfgWith(`"prefix": {"skip_blocks": -1}`), "prefix.skip_blocks", "must be >= 0, got -1"},
		{"skip_blocks too big", cfgWith(`"prefix": {"skip_blocks": 1048577}`), "prefix.skip_blocks", "must be <= 1048576"},
		{"capacity_blocks 0", cfgWith(`"prefix": {"capacity_blocks": 0}`), "prefix.capacity_blocks", "must be >= 1, got 0"},
		{"capacity_blocks too big", cfgWith(`"prefix": {"capacity_blocks": 67108865}`), "prefix.capacity_blocks", "must be <= 67108864"},
		{"target_cache_tokens negative", cfgWith(`"prefix": {"target_cache_tokens": -1}`), "prefix.target_cache_tokens", "must be >= 0, got -1"},
		{"target_cache_tokens too big", cfgWith(`"prefix": {"target_cache_tokens": 1099511627777}`), "prefix.target_cache_tokens", "must be <= 1099511627776"},
		{"load_weight negative", cfgWith(`"balance": {"load_weight": -1}`), "balance.load_weight", "must be >= 0, got -1"},
		{"load_weight too big", cfgWith(`"balance": {"load_weight": 1001}`), "balance.load_weight", "must be <= 1000"},
		{"fair_share_multiplier below 1", cfgWith(`"balance": {"fair_share_multiplier": 0.9}`), "balance.fair_share_multiplier", "must be >= 1, got 0.9"},
		{"fair_share_multiplier too big", cfgWith(`"balance": {"fair_share_multiplier": 1e4}`), "balance.fair_share_multiplier", "must be <= 1000"},
		{"threshold_tokens negative", cfgWith(`"disaggregation": {"threshold_tokens": -5}`), "disaggregation.threshold_tokens", "must be >= 0, got -5"},
		{"threshold_tokens too big", cfgWith(`"disaggregation": {"threshold_tokens": 2000000000}`), "disaggregation.threshold_tokens", "must be <= 1073741824"},
		{"prefill_timeout_ms 0", cfgWith(`"disaggregation": {"prefill_timeout_ms": 0}`), "disaggregation.prefill_timeout_ms", "must be >= 1, got 0"},
		{"prefill_timeout_ms too big", cfgWith(`"disaggregation": {"prefill_timeout_ms": 3600001}`), "disaggregation.prefill_timeout_ms", "must be <= 3600000"},
		{"failure status 99", cfgWith(`"health": {"failure_statuses": [503, 99]}`), "health.failure_statuses[1]", "must be >= 100, got 99"},
		{"failure status 600", cfgWith(`"health": {"failure_statuses": [600]}`), "health.failure_statuses[0]", "must be <= 599, got 600"},
		{"failure status duplicate", cfgWith(`"health": {"failure_statuses": [503, 503]}`), "health.failure_statuses[1]", "duplicate status 503"},
		{"failure_threshold 0", cfgWith(`"health": {"failure_threshold": 0}`), "health.failure_threshold", "must be >= 1, got 0"},
		{"failure_threshold too big", cfgWith(`"health": {"failure_threshold": 1001}`), "health.failure_threshold", "must be <= 1000"},
		{"cooldown_ms negative", cfgWith(`"health": {"cooldown_ms": -1}`), "health.cooldown_ms", "must be >= 0, got -1"},
		{"cooldown_ms too big", cfgWith(`"health": {"cooldown_ms": 86400001}`), "health.cooldown_ms", "must be <= 86400000"},
		{"interval_ms 99", cfgWith(`"engine_metrics": {"interval_ms": 99}`), "engine_metrics.interval_ms", "must be >= 100, got 99"},
		{"interval_ms too big", cfgWith(`"engine_metrics": {"interval_ms": 3600001}`), "engine_metrics.interval_ms", "must be <= 3600000"},
		{"stale_ms 0", cfgWith(`"engine_metrics": {"stale_ms": 0}`), "engine_metrics.stale_ms", "must be >= 1, got 0"},
		{"stale_ms too big", cfgWith(`"engine_metrics": {"stale_ms": 86400001}`), "engine_metrics.stale_ms", "must be <= 86400000"},
		{"max_cas_retries 0", cfgWith(`"state": {"max_cas_retries": 0}`), "state.max_cas_retries", "must be >= 1, got 0"},
		{"max_cas_retries too big", cfgWith(`"state": {"max_cas_retries": 1001}`), "state.max_cas_retries", "must be <= 1000"},
		{"lease_ms 999", cfgWith(`"state": {"lease_ms": 999}`), "state.lease_ms", "must be >= 1000, got 999"},
		{"lease_ms too big", cfgWith(`"state": {"lease_ms": 86400001}`), "state.lease_ms", "must be <= 86400000"},

		// Enums and strings.
		{"first_turn random", cfgWith(`"conversation": {"first_turn": "random"}`), "conversation.first_turn", `must be one of round_robin, least_loaded, hash, score, got "random"`},
		{"load_metric bad", cfgWith(`"balance": {"load_metric": "kv"}`), "balance.load_metric", `must be one of requests, tokens, got "kv"`},
		{"mode bad", cfgWith(`"disaggregation": {"mode": "nixl"}`), "disaggregation.mode", `must be one of off, sidecar, vllm, trtllm, sglang, got "nixl"`},
		{"mode case", cfgWith(`"disaggregation": {"mode": "OFF"}`), "disaggregation.mode", "must be one of"},
		{"flavor bad", cfgWith(`"engine_metrics": {"flavor": "tgi"}`), "engine_metrics.flavor", `got "tgi"`},
		{"prefill_cluster empty", cfgWith(`"disaggregation": {"prefill_cluster": ""}`), "disaggregation.prefill_cluster", "must not be empty"},
		{"metrics cluster with space", cfgWith(`"engine_metrics": {"cluster": "a b"}`), "engine_metrics.cluster", "whitespace"},
		{"metrics path relative", cfgWith(`"engine_metrics": {"path": "metrics"}`), "engine_metrics.path", `must start with "/"`},
		{"namespace empty", cfgWith(`"state": {"namespace": ""}`), "state.namespace", "[A-Za-z0-9_.-]"},
		{"namespace bad char", cfgWith(`"state": {"namespace": "kv/route"}`), "state.namespace", `got "kv/route"`},
		{"namespace too long", cfgWith(`"state": {"namespace": "` + strings.Repeat("n", 65) + `"}`), "state.namespace", "1 to 64 characters"},
		{"conversation header empty", cfgWith(`"conversation": {"headers": [""]}`), "conversation.headers[0]", "must not be empty"},
		{"conversation header bad", cfgWith(`"conversation": {"headers": ["x session"]}`), "conversation.headers[0]", "not a valid header name"},
		{"conversation header duplicate", cfgWith(`"conversation": {"headers": ["X-A", "x-a"]}`), "conversation.headers[1]", `duplicate header "x-a"`},
		{"body field empty", cfgWith(`"conversation": {"body_fields": ["a", ""]}`), "conversation.body_fields[1]", "must not be empty"},
		{"body field duplicate", cfgWith(`"conversation": {"body_fields": ["a", "a"]}`), "conversation.body_fields[1]", "duplicate body field"},

		// Endpoints.
		{"no decode endpoints", `{"pools":{"decode":{"endpoints":[]}}}`, "pools.decode.endpoints", "at least one endpoint"},
		{"missing address", cfgDecode(`{"dp_size":2}`), "pools.decode.endpoints[0].address", "required"},
		{"address no port", cfgDecode(`{"address":"a:1"},{"address":"10.0.0.1"}`), "pools.decode.endpoints[1].address", `"10.0.0.1" is not host:port`},
		{"address port 0", cfgDecode(`{"address":"10.0.0.1:0"}`), "pools.decode.endpoints[0].address", "is not host:port"},
		{"address port 70000", cfgDecode(`{"address":"10.0.0.1:70000"}`), "pools.decode.endpoints[0].address", "is not host:port"},
		{"address empty host", cfgDecode(`{"address":":8000"}`), "pools.decode.endpoints[0].address", "empty host"},
		{"address port not a number", cfgDecode(`{"address":"host:abc"}`), "pools.decode.endpoints[0].address", "is not host:port"},
		{"address signed port", cfgDecode(`{"address":"host:+80"}`), "pools.decode.endpoints[0].address", "is not host:port"},
		{"address empty", cfgDecode(`{"address":""}`), "pools.decode.endpoints[0].address", "is not host:port"},
		{"address ipv6 unbracketed", cfgDecode(`{"address":"::1:8000"}`), "pools.decode.endpoints[0].address", "is not host:port"},
		{"address bad ipv4", cfgDecode(`{"address":"10.0.0.256:80"}`), "pools.decode.endpoints[0].address", "bad IPv4"},
		{"address bad host char", cfgDecode(`{"address":"a/b:80"}`), "pools.decode.endpoints[0].address", "bad character"},
		{"address bracketed ipv4", cfgDecode(`{"address":"[10.0.0.1]:80"}`), "pools.decode.endpoints[0].address", "IPv6"},
		{"duplicate address", cfgDecode(`{"address":"a:1"},{"address":"b:1"},{"address":"a:1"}`), "pools.decode.endpoints[2].address", `duplicate address "a:1"`},
		{"duplicate address case", cfgDecode(`{"address":"Host:1"},{"address":"host:1"}`), "pools.decode.endpoints[1].address", "duplicate address"},
		{"bootstrap_port in decode pool", cfgDecode(`{"address":"a:1","bootstrap_port":8998}`), "pools.decode.endpoints[0].bootstrap_port", "only allowed in the prefill pool"},
		{"duplicate prefill address", `{"pools":{"decode":{"endpoints":[{"address":"a:1"}]},"prefill":{"endpoints":[{"address":"p:1"},{"address":"p:1"}]}}}`, "pools.prefill.endpoints[1].address", "duplicate address"},

		// Cross-field rules.
		{"mode without prefill pool", cfgWith(`"disaggregation": {"mode": "vllm"}`), "pools.prefill.endpoints", `disaggregation.mode "vllm" needs at least one prefill endpoint`},
		{"sidecar with empty prefill pool", `{"pools":{"decode":{"endpoints":[{"address":"a:1"}]},"prefill":{"endpoints":[]}},"disaggregation":{"mode":"sidecar"}}`, "pools.prefill.endpoints", `"sidecar"`},
		{"stale_ms below interval_ms", cfgWith(`"engine_metrics": {"interval_ms": 2000, "stale_ms": 1000}`), "engine_metrics.stale_ms", "must be >= engine_metrics.interval_ms (2000), got 1000"},
		{"interval_ms above default stale_ms", cfgWith(`"engine_metrics": {"interval_ms": 10000}`), "engine_metrics.stale_ms", "got 5000"},
		{"owned header empty", cfgWith(`"headers": {"destination": ""}`), "headers.destination", "must not be empty"},
		{"owned header bad", cfgWith(`"headers": {"dp_rank": "x:rank"}`), "headers.dp_rank", "not a valid header name"},
		{"owned headers collide", cfgWith(`"headers": {"prefill_dp_rank": "X-Data-Parallel-Rank"}`), "headers.prefill_dp_rank", `"x-data-parallel-rank" is already used by headers.dp_rank`},
		{"decision collides", cfgWith(`"headers": {"decision": "x-gateway-destination-endpoint"}`), "headers.decision", "already used by headers.destination"},
		{"owned header in conversation headers", cfgWith(`"conversation": {"headers": ["x-session-id", "x-kvroute-decision"]}`), "headers.decision", "also in conversation.headers"},
		{"owned header set to a conversation header", cfgWith(`"headers": {"destination": "X-Session-ID"}`), "headers.destination", "also in conversation.headers"},
		{"owned header reserved", cfgWith(`"headers": {"dp_rank": "Content-Length"}`), "headers.dp_rank", "must not strip"},
	}
	require.GreaterOrEqual(t, len(tests), 40)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tt.json))
			require.Error(t, err)
			assert.Equal(t, Config{}, c)
			msg := err.Error()
			assert.True(t, strings.HasPrefix(msg, tt.field+": "), "error %q should start with %q", msg, tt.field+": ")
			assert.Contains(t, msg, tt.reason)
			assert.NotContains(t, msg, "\n")

			var ce *ConfigError
			require.True(t, errors.As(err, &ce))
			if tt.field == "configuration" {
				assert.Equal(t, "", ce.Field)
			} else {
				assert.Equal(t, tt.field, ce.Field)
			}
		})
	}
}

func TestParseConfigFirstErrorWins(t *testing.T) {
	// Two bad fields: the one first in the document is reported, before any
	// cross-field rule.
	_, err := ParseConfig([]byte(`{"chars_per_token": 0, "max_body_bytes": 0}`))
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), "chars_per_token: "), err.Error())

	_, err = ParseConfig([]byte(`{"max_body_bytes": 0, "chars_per_token": 0}`))
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), "max_body_bytes: "), err.Error())
}

func TestParseConfigLongValuesAreCut(t *testing.T) {
	long := strings.Repeat("é", 200)
	_, err := ParseConfig([]byte(cfgWith(`"conversation": {"first_turn": "` + long + `"}`)))
	require.Error(t, err)
	assert.Less(t, len(err.Error()), 250)
	assert.True(t, strings.HasSuffix(err.Error(), `"...`), err.Error())
}
