package config

// Config is the whole plugin configuration (reference: docs/configuration.md, held to
// these structs by TestConfigDocs). It is built by ParseConfig from
// the JSON Envoy or Istio hands the plugin; DefaultConfig holds every default.
type Config struct {
	Routes            []string             // paths routed (POST, matched exactly); others pass through
	MaxBodyBytes      int64                // largest body buffered and read; past it, decided at the headers
	CharsPerToken     int                  // bytes of UTF-8 prompt text per estimated token
	TrustClientDPRank bool                 // honour a DP rank the client sends in Headers.DPRank
	Pools             Pools                // the inference servers (the default fleet)
	Models            []Model              // fleets of other models, each with its own pools
	Conversation      ConversationConfig   // explicit conversation ids
	Prefix            PrefixConfig         // prefix-aware routing
	Balance           BalanceConfig        // load against cache hits
	Disaggregation    DisaggregationConfig // prefill/decode disaggregation
	Health            HealthConfig         // passive ejection of failing endpoints
	EngineMetrics     EngineMetricsConfig  // load scraped from the engines' Prometheus pages
	State             StateConfig          // shared data between VMs
	Headers           HeadersConfig        // names of the request headers the filter owns
}

// Pools holds the decode pool (required) and the prefill pool (optional).
type Pools struct {
	Decode  Pool // every worker, when there is no disaggregation
	Prefill Pool // needed by every disaggregation mode but off
}

// Model is one fleet of a gateway that serves several models (docs/behaviour.md,
// Several models): the model names it serves and its own pools. A request whose body
// names one of Names is routed over Pools only, with state of its own; every other
// section of the configuration is shared with the top level.
//
// A name ending in "*" matches every model that starts with the rest (the LoRA
// adapters of one base model). Names[0] is exact: it names the fleet in the catalogue
// (GET /v1/models), in headers.model, in the per-model metrics and, fingerprinted, in
// the fleet's shared-data keys — so state survives a reconfiguration that adds or
// removes other fleets. Disaggregation is the top-level block with the fleet's own
// fields written over it.
type Model struct {
	Names          []string             // exact model names, or prefixes ending in "*"; Names[0] is exact
	Pools          Pools                // this fleet's decode (and prefill) pools
	Disaggregation DisaggregationConfig // the top-level block with the fleet's fields over it
}

// ModelMetricTag is a fleet's first name as its per-model stat names carry it: every
// byte other than [A-Za-z0-9_-] written as '_', so Envoy's stats_tags can lift it into
// a label. Two fleets whose first names write alike are refused, since their counters
// would be one.
func ModelMetricTag(name string) string {
	b := []byte(name)
	for i, c := range b {
		if !(c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			b[i] = '_'
		}
	}
	return string(b)
}

// Pool is a list of inference server endpoints: static, discovered, or static until
// the first discovery answer.
type Pool struct {
	Endpoints []Endpoint       // addresses unique; each (endpoint, rank) is a target
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
	Source         string // DiscoveryEnvoyAdmin or DiscoveryHTTP
	Cluster        string // the Envoy cluster the poll is sent through
	ServiceCluster string // envoy_admin: the cluster whose hosts are the endpoints
	Path           string // http: the path of the endpoint list
	DPSize         int    // ranks of an endpoint the source gives no dp_size for
	IntervalMS     int64  // between polls
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

// ConversationConfig is conversation affinity by explicit id.
type ConversationConfig struct {
	Enabled     bool     // use explicit conversation ids at all
	Headers     []string // headers carrying an id, the first non-empty wins; lower-cased at parse time
	BodyFields  []string // gjson paths read when no header gave an id, the first id wins
	MaxSessions int      // capacity of each pool's conversation table (least recently used dropped)
	FirstTurn   string   // placement of a conversation with no live mapping: a FirstTurn* policy
}

// PrefixConfig is prefix-aware routing over the canonical prompt's blocks.
type PrefixConfig struct {
	Enabled               bool    // prefix index, implicit continuation and the cost's prefix term
	BlockTokens           int     // tokens per prefix block; match the engine's KV block size
	MatchRateThreshold    float64 // cached prefixes count only above this share of the prompt
	ContinuationThreshold float64 // share of blocks one target must hold for a request to follow them
	SkipBlocks            int     // leading blocks the continuation test ignores (a shared system prompt)
	CapacityBlocks        int     // prefix index entries per pool in each VM
	TargetCacheTokens     int64   // one target's prefix KV cache in tokens, where learning it from first chunks starts and the most it learns; 0: the size the engine reports with engine metrics on, else unknown. A holder keeps a prefix's first p tokens while its writes since recording it plus p fit its cache
}

// Load metrics (balance.load_metric).
const (
	LoadMetricRequests = "requests"
	LoadMetricTokens   = "tokens"
)

// BalanceConfig weighs load against cache hits.
type BalanceConfig struct {
	LoadMetric          string  // what least_loaded compares: a LoadMetric* value
	LoadWeight          float64 // weight of load against cache hits in the cost
	FairShareMultiplier float64 // a target may carry this many fair shares before spilling
}

// Disaggregation modes (disaggregation.mode).
const (
	ModeOff     = "off"
	ModeSidecar = "sidecar"
	ModeVLLM    = "vllm"
	ModeTRTLLM  = "trtllm"
	ModeSGLang  = "sglang"
)

// DisaggregationConfig is prefill/decode disaggregation.
type DisaggregationConfig struct {
	Mode             string // a Mode* value; off sends every request to the decode pool alone
	ThresholdTokens  int    // prompts of at least this many estimated tokens are disaggregated
	UncachedOnly     bool   // count only tokens not already cached on the decode target
	PrefillCluster   string // Envoy cluster of the inline modes' prefill call
	PrefillTimeoutMS int64  // past it the request is decoded directly
}

// HealthConfig is passive ejection of endpoints that answer with failures.
type HealthConfig struct {
	FailureStatuses  []int // response statuses that count as a failure of the endpoint
	FailureThreshold int   // consecutive failures that eject an endpoint
	CooldownMS       int64 // how long an ejection lasts
}

// Engine metric flavors (engine_metrics.flavor).
const (
	FlavorVLLM   = "vllm"
	FlavorSGLang = "sglang"
	FlavorTRTLLM = "trtllm"
)

// EngineMetricsConfig is load read from the engines' own Prometheus pages.
type EngineMetricsConfig struct {
	Enabled    bool   // scrape every endpoint, count its running + waiting requests as load and, with prefix.target_cache_tokens unset, take its KV cache's size as the target's cache and the most it learns
	Flavor     string // whose metric names to read: a Flavor* value
	Cluster    string // Envoy cluster scrapes go through, honouring the destination header
	Path       string // the scrape path
	IntervalMS int64  // time between two scrapes of the fleet
	StaleMS    int64  // figures older than this are ignored
}

// StateConfig is the state shared by the VMs of one Envoy.
type StateConfig struct {
	Namespace     string // prefix of every shared-data key
	MaxCASRetries int    // compare-and-swap retries before a request is decided without state
	LeaseMS       int64  // load of a request whose end never arrives stops counting after this
}

// HeadersConfig names the request headers the filter owns. An empty Decision disables
// the decision header, an empty Model (the default) the model header; the others must
// be set.
type HeadersConfig struct {
	Destination        string // the chosen target's endpoint, host:port
	DPRank             string // the chosen rank, when its endpoint has more than one
	PrefillDestination string // sidecar mode: the prefill endpoint
	PrefillDPRank      string // sidecar mode: the prefill rank, when its endpoint has more than one
	Decision           string // the decision; "" turns it off
	Model              string // receives the matched fleet's first name; "" turns it off
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
