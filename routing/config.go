package routing

// Config is the whole plugin configuration (reference: docs/configuration.md, held to
// these structs by TestConfigDocs). It is built by ParseConfig from
// the JSON Envoy or Istio hands the plugin; DefaultConfig holds every default.
type Config struct {
	Routes            []string
	MaxBodyBytes      int64
	CharsPerToken     int
	TrustClientDPRank bool
	Pools             Pools
	Conversation      ConversationConfig
	Prefix            PrefixConfig
	Balance           BalanceConfig
	Disaggregation    DisaggregationConfig
	Health            HealthConfig
	EngineMetrics     EngineMetricsConfig
	State             StateConfig
	Headers           HeadersConfig
}

// Pools holds the decode pool (required) and the prefill pool (optional).
type Pools struct {
	Decode  Pool
	Prefill Pool
}

// Pool is a list of inference server endpoints: static, discovered, or static until
// the first discovery answer.
type Pool struct {
	Endpoints []Endpoint
	Discovery *DiscoveryConfig // nil: the endpoints are static
}

// Endpoint is one inference server.
//
// DPRankStart is the first DP rank the server answers to: its ranks are DPRankStart ..
// DPRankStart+DPSize-1, and that is the number the rank headers carry, a trusted client
// rank is read in and engine metrics are labelled in. A vLLM node of a hybrid or
// external DP deployment may number its engines from its --data-parallel-start-rank
// rather than from 0; which numbering its API server accepts depends on the vLLM
// frontend, so the operator says it here.
type Endpoint struct {
	Address       string // host:port
	DPSize        int    // data-parallel ranks, >= 1
	DPRankStart   int    // >= 0; see above
	BootstrapPort int    // sglang prefill endpoints; 0 means the default 8998
}

// Discovery sources (pools.<pool>.discovery.source).
const (
	DiscoveryEnvoyAdmin = "envoy_admin"
	DiscoveryHTTP       = "http"
)

// DiscoveryConfig makes a pool's endpoints follow a source instead of the static list
// (docs/behaviour.md, Discovered endpoints). One VM at a time polls Source every
// IntervalMS through the Envoy cluster Cluster: with "envoy_admin", Envoy's admin
// /clusters for the hosts and health of ServiceCluster; with "http", a JSON endpoint list
// at Path. Endpoints that name no dp_size get DPSize.
type DiscoveryConfig struct {
	Source         string
	Cluster        string
	ServiceCluster string
	Path           string
	DPSize         int
	IntervalMS     int64
}

// DefaultDiscovery holds the defaults of a discovery block.
func DefaultDiscovery() DiscoveryConfig {
	return DiscoveryConfig{Source: DiscoveryEnvoyAdmin, Cluster: "kvroute_admin", DPSize: 1, IntervalMS: 2000}
}

// First-turn placement policies (conversation.first_turn).
const (
	FirstTurnRoundRobin  = "round_robin"
	FirstTurnLeastLoaded = "least_loaded"
	FirstTurnHash        = "hash"
	FirstTurnScore       = "score"
)

type ConversationConfig struct {
	Enabled     bool
	Headers     []string // lower-cased at parse time
	BodyFields  []string // gjson paths
	MaxSessions int
	FirstTurn   string
}

type PrefixConfig struct {
	Enabled               bool
	BlockTokens           int
	MatchRateThreshold    float64
	ContinuationThreshold float64
	SkipBlocks            int
	CapacityBlocks        int
}

// Load metrics (balance.load_metric).
const (
	LoadMetricRequests = "requests"
	LoadMetricTokens   = "tokens"
)

type BalanceConfig struct {
	LoadMetric          string
	LoadWeight          float64
	FairShareMultiplier float64
}

// Disaggregation modes (disaggregation.mode).
const (
	ModeOff     = "off"
	ModeSidecar = "sidecar"
	ModeVLLM    = "vllm"
	ModeTRTLLM  = "trtllm"
	ModeSGLang  = "sglang"
)

type DisaggregationConfig struct {
	Mode             string
	ThresholdTokens  int
	UncachedOnly     bool
	PrefillCluster   string
	PrefillTimeoutMS int64
}

type HealthConfig struct {
	FailureStatuses  []int
	FailureThreshold int
	CooldownMS       int64
}

// Engine metric flavors (engine_metrics.flavor).
const (
	FlavorVLLM   = "vllm"
	FlavorSGLang = "sglang"
	FlavorTRTLLM = "trtllm"
)

type EngineMetricsConfig struct {
	Enabled    bool
	Flavor     string
	Cluster    string
	Path       string
	IntervalMS int64
	StaleMS    int64
}

type StateConfig struct {
	Namespace     string
	MaxCASRetries int
	LeaseMS       int64
}

// HeadersConfig names the request headers the filter owns. An empty Decision disables
// the decision header; the others must be set.
type HeadersConfig struct {
	Destination        string
	DPRank             string
	PrefillDestination string
	PrefillDPRank      string
	Decision           string
}

// DefaultBootstrapPort is SGLang's default disaggregation bootstrap port.
const DefaultBootstrapPort = 8998

// DefaultConfig returns every default. Pools are empty: the decode pool has
// no sensible default and ParseConfig requires at least one endpoint.
func DefaultConfig() Config {
	return Config{
		Routes:        []string{"/v1/chat/completions", "/v1/completions", "/v1/responses"},
		MaxBodyBytes:  4 << 20,
		CharsPerToken: 4,
		Conversation: ConversationConfig{
			Enabled:     true,
			Headers:     []string{"x-session-id", "x-correlation-id", "x-session-affinity", "x-multi-turn-session-id"},
			BodyFields:  []string{"conversation_params.conversation_id", "prompt_cache_key", "conversation"},
			MaxSessions: 100000,
			FirstTurn:   FirstTurnRoundRobin,
		},
		Prefix: PrefixConfig{
			Enabled:               true,
			BlockTokens:           16,
			MatchRateThreshold:    0.1,
			ContinuationThreshold: 0.75,
			SkipBlocks:            0,
			CapacityBlocks:        262144,
		},
		Balance: BalanceConfig{
			LoadMetric:          LoadMetricRequests,
			LoadWeight:          1.0,
			FairShareMultiplier: 2.0,
		},
		Disaggregation: DisaggregationConfig{
			Mode:             ModeOff,
			PrefillCluster:   "kvroute_prefill",
			PrefillTimeoutMS: 60000,
		},
		Health: HealthConfig{
			FailureStatuses:  []int{502, 503, 504},
			FailureThreshold: 3,
			CooldownMS:       10000,
		},
		EngineMetrics: EngineMetricsConfig{
			Flavor:     FlavorVLLM,
			Cluster:    "kvroute_metrics",
			Path:       "/metrics",
			IntervalMS: 1000,
			StaleMS:    5000,
		},
		State: StateConfig{
			Namespace:     "kvroute",
			MaxCASRetries: 8,
			LeaseMS:       600000,
		},
		Headers: HeadersConfig{
			Destination:        "x-gateway-destination-endpoint",
			DPRank:             "x-data-parallel-rank",
			PrefillDestination: "x-prefiller-host-port",
			PrefillDPRank:      "x-prefiller-data-parallel-rank",
			Decision:           "x-kvroute-decision",
		},
	}
}
