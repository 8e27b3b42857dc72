package engine

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/hashx"
	"github.com/kvroute/kvroute/routing/promtext"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/require"
)

func TestEngineMetricsVLLMDataParallel(t *testing.T) {
	page := readEngineTestdata(t, "vllm.txt")
	got, err := ParseEngineMetrics(config.FlavorVLLM, page, 2, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{
		0: {Running: 5, Waiting: 4, KVUsage: 0.72},
		1: {Running: 3, Waiting: 2, KVUsage: 0.64},
	}, got)

	// The same server configured as one target (dp_size 1): vLLM balances its engines
	// itself, and the target's load is the sum.
	got, err = ParseEngineMetrics(config.FlavorVLLM, page, 1, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{0: {Running: 8, Waiting: 6, KVUsage: 0.72}}, got)

	// More ranks configured than the page reports: only the reported ranks have figures.
	got, err = ParseEngineMetrics(config.FlavorVLLM, page, 4, 0)
	require.NoError(t, err)
	require.Len(t, got, 2)

	// Fewer: engine 1 cannot be attributed and is left out.
	got, err = ParseEngineMetrics(config.FlavorVLLM, []byte(`vllm:num_requests_running{engine="1",model_name="m"} 3
vllm:num_requests_running{engine="0",model_name="m"} 1
vllm:num_requests_running{engine="x",model_name="m"} 9
`), 1, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{0: {Running: 13}}, got, "dp_size 1 counts every engine, labelled or not a number")
	got, err = ParseEngineMetrics(config.FlavorVLLM, []byte(`vllm:num_requests_running{engine="2",model_name="m"} 3
vllm:num_requests_running{engine="0",model_name="m"} 1
vllm:num_requests_running{engine="x",model_name="m"} 9
`), 2, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{0: {Running: 1}}, got)
}

func TestEngineMetricsVLLMDocsAndLegacyNames(t *testing.T) {
	got, err := ParseEngineMetrics(config.FlavorVLLM, readEngineTestdata(t, "vllm_docs.txt"), 1, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{0: {Running: 8}}, got)

	// vLLM < 0.9 (and V0) has only vllm:gpu_cache_usage_perc and no engine label.
	legacy := `# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
vllm:num_requests_running{model_name="m"} 2.0
vllm:num_requests_waiting{model_name="m"} 1.0
`
	got, err = ParseEngineMetrics(config.FlavorVLLM, []byte(legacy), 1, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{0: {Running: 2, Waiting: 1, KVUsage: 0.5}}, got)

	// vLLM 0.9–0.10 export both: the current name wins, wherever it appears.
	both := `vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.9
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.75
vllm:num_requests_running{engine="1",model_name="m"} 1
`
	got, err = ParseEngineMetrics(config.FlavorVLLM, []byte(both), 2, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{0: {KVUsage: 0.25}, 1: {Running: 1, KVUsage: 0.75}}, got)
}

func TestEngineMetricsModelsAndUnlabelledSeries(t *testing.T) {
	// Two models on one server: requests add up, KV usage is the fullest cache.
	page := `vllm:num_requests_running{engine="0",model_name="a"} 2
vllm:num_requests_running{engine="0",model_name="b"} 3
vllm:num_requests_waiting{engine="0",model_name="a"} 1
vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.2
vllm:kv_cache_usage_perc{engine="0",model_name="b"} 0.6
vllm:num_requests_running{engine="0",model_name="a\"b"} 10
`
	got, err := ParseEngineMetrics(config.FlavorVLLM, []byte(page), 1, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{0: {Running: 15, Waiting: 1, KVUsage: 0.6}}, got)

	// No rank label on a dp_size 4 endpoint: spread evenly, KV usage as it is.
	got, err = ParseEngineMetrics(config.FlavorVLLM, []byte("vllm:num_requests_running 8\nvllm:num_requests_waiting 4\nvllm:kv_cache_usage_perc 0.5\n"), 4, 0)
	require.NoError(t, err)
	for r := 0; r < 4; r++ {
		require.Equal(t, EngineFigures{Running: 2, Waiting: 1, KVUsage: 0.5}, got[r])
	}

	// NaN, infinite and negative values are left out; other engines' names ignored.
	got, err = ParseEngineMetrics(config.FlavorVLLM, []byte(`vllm:num_requests_running{engine="0"} NaN
vllm:num_requests_running{engine="0",model_name="z"} -1
vllm:num_requests_waiting{engine="0"} +Inf
vllm:num_requests_waiting{engine="0",model_name="y"} 2
sglang:num_running_reqs{dp_rank="0"} 50
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 9
`), 1, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{0: {Waiting: 2}}, got)
}

func TestEngineMetricsSGLang(t *testing.T) {
	got, err := ParseEngineMetrics(config.FlavorSGLang, readEngineTestdata(t, "sglang.txt"), 1, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{0: {Running: 162, Waiting: 2826, KVUsage: 0.28}}, got)

	// DP attention, labels as SGLang's init_metrics builds them (model_name, engine_type,
	// tp_rank, pp_rank, dp_rank): the TP schedulers of one DP rank report the same queue
	// and must not be added up.
	dp := `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="glm",engine_type="unified",tp_rank="0",pp_rank="0",dp_rank="0"} 2.0
sglang:num_running_reqs{model_name="glm",engine_type="unified",tp_rank="1",pp_rank="0",dp_rank="0"} 2.0
sglang:num_running_reqs{model_name="glm",engine_type="unified",tp_rank="2",pp_rank="0",dp_rank="1"} 0.0
sglang:num_running_reqs{model_name="glm",engine_type="unified",tp_rank="3",pp_rank="0",dp_rank="1"} 0.0
sglang:num_queue_reqs{model_name="glm",engine_type="unified",tp_rank="0",pp_rank="0",dp_rank="0"} 1.0
sglang:num_queue_reqs{model_name="glm",engine_type="unified",tp_rank="2",pp_rank="0",dp_rank="1"} 7.0
sglang:token_usage{model_name="glm",engine_type="unified",tp_rank="0",pp_rank="0",dp_rank="0"} 0.31
sglang:token_usage{model_name="glm",engine_type="unified",tp_rank="1",pp_rank="0",dp_rank="0"} 0.33
sglang:token_usage{model_name="glm",engine_type="unified",tp_rank="2",pp_rank="0",dp_rank="1"} 0.05
`
	got, err = ParseEngineMetrics(config.FlavorSGLang, []byte(dp), 2, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{
		0: {Running: 2, Waiting: 1, KVUsage: 0.33},
		1: {Running: 0, Waiting: 7, KVUsage: 0.05},
	}, got)
	got, err = ParseEngineMetrics(config.FlavorSGLang, []byte(dp), 1, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{0: {Running: 2, Waiting: 8, KVUsage: 0.33}}, got)
}

func TestEngineMetricsTRTLLM(t *testing.T) {
	got, err := ParseEngineMetrics(config.FlavorTRTLLM, readEngineTestdata(t, "trtllm.txt"), 1, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{0: {Running: 12, Waiting: 3, KVUsage: 0.4375}}, got)

	// TensorRT-LLM 1.1 exports no load gauges: no figures, and the caller keeps none.
	_, err = ParseEngineMetrics(config.FlavorTRTLLM, readEngineTestdata(t, "trtllm_1.1.txt"), 1, 0)
	require.ErrorIs(t, err, ErrNoEngineFigures)

	// No rank label: a dp_size 2 (attention DP) endpoint gets half on each rank.
	got, err = ParseEngineMetrics(config.FlavorTRTLLM, readEngineTestdata(t, "trtllm.txt"), 2, 0)
	require.NoError(t, err)
	require.Equal(t, EngineFigures{Running: 6, Waiting: 1.5, KVUsage: 0.4375}, got[1])
}

func TestEngineMetricsCacheSize(t *testing.T) {
	// vLLM's info gauge, one series per engine, labelled as CacheConfig.metrics_info()
	// gives them. A vLLM that labels kv_cache_size_tokens gives each engine's own (it
	// wins over the blocks: a hybrid model's groups); num_gpu_blocks is the sum over
	// the server's engines, on every engine's series.
	sized := `# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",kv_cache_size_tokens="218464",num_gpu_blocks="49956",sliding_window="None"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="1",gpu_memory_utilization="0.9",kv_cache_size_tokens="218000",num_gpu_blocks="49956",sliding_window="None"} 1.0
vllm:num_requests_running{engine="0",model_name="m"} 2
vllm:num_requests_running{engine="1",model_name="m"} 1
`
	got, err := ParseEngineMetrics(config.FlavorVLLM, []byte(sized), 2, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{0: {Running: 2, CacheTokens: 218464}, 1: {Running: 1, CacheTokens: 218000}}, got)
	summed := `vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_gpu_blocks="18000"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="1",num_gpu_blocks="18000"} 1.0
vllm:num_requests_running{engine="0",model_name="m"} 2
vllm:num_requests_running{engine="1",model_name="m"} 1
`
	got, err = ParseEngineMetrics(config.FlavorVLLM, []byte(summed), 2, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{0: {Running: 2, CacheTokens: 144000}, 1: {Running: 1, CacheTokens: 144000}}, got, "each engine its share of the blocks")
	// One target over both engines: vLLM spreads its requests over all of them.
	got, err = ParseEngineMetrics(config.FlavorVLLM, []byte(summed), 1, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{0: {Running: 3, CacheTokens: 288000}}, got)
	got, err = ParseEngineMetrics(config.FlavorVLLM, []byte(sized), 1, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{0: {Running: 3, CacheTokens: 436464}}, got)
	// Before the cache is sized vLLM labels it "None"; a size of 0 is none either.
	for _, page := range []string{
		`vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="None"} 1.0`,
		`vllm:cache_config_info{block_size="16",engine="0",kv_cache_size_tokens="0",num_gpu_blocks="100"} 1.0`,
	} {
		got, err = ParseEngineMetrics(config.FlavorVLLM, []byte(page+"\nvllm:num_requests_running{engine=\"0\"} 1\n"), 1, 0)
		require.NoError(t, err)
		require.Equal(t, map[int]EngineFigures{0: {Running: 1}}, got, page)
	}
	// A page with nothing but the cache's size still says the engine's load is nil.
	got, err = ParseEngineMetrics(config.FlavorVLLM, []byte(`vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="100"} 1`), 1, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{0: {CacheTokens: 3200}}, got)

	// SGLang's gauge, reported by every TP scheduler of a DP rank: not added up.
	sglang := `# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="glm",engine_type="unified",tp_rank="0",pp_rank="0",dp_rank="0"} 156907.0
sglang:max_total_num_tokens{model_name="glm",engine_type="unified",tp_rank="1",pp_rank="0",dp_rank="0"} 156907.0
sglang:max_total_num_tokens{model_name="glm",engine_type="unified",tp_rank="2",pp_rank="0",dp_rank="1"} 150000.0
sglang:num_running_reqs{model_name="glm",engine_type="unified",tp_rank="0",pp_rank="0",dp_rank="0"} 2.0
`
	got, err = ParseEngineMetrics(config.FlavorSGLang, []byte(sglang), 2, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{0: {Running: 2, CacheTokens: 156907}, 1: {CacheTokens: 150000}}, got)
	// Without a rank label on an endpoint of two ranks, each rank has half.
	got, err = ParseEngineMetrics(config.FlavorSGLang, []byte(`sglang:max_total_num_tokens{model_name="glm"} 100000.0`), 2, 0)
	require.NoError(t, err)
	require.Equal(t, map[int]EngineFigures{0: {CacheTokens: 50000}, 1: {CacheTokens: 50000}}, got)

	// TensorRT-LLM reports no size: the figures carry none, and neither does the wrong flavor's.
	got, err = ParseEngineMetrics(config.FlavorTRTLLM, readEngineTestdata(t, "trtllm.txt"), 1, 0)
	require.NoError(t, err)
	require.Zero(t, got[0].CacheTokens)
	_, err = ParseEngineMetrics(config.FlavorTRTLLM, []byte(summed+sglang), 1, 0)
	require.ErrorIs(t, err, ErrNoEngineFigures)
}

func TestEngineMetricsErrors(t *testing.T) {
	_, err := ParseEngineMetrics("tgi", []byte("x 1\n"), 1, 0)
	require.ErrorIs(t, err, ErrUnknownFlavor)
	_, err = ParseEngineMetrics(config.FlavorVLLM, []byte("vllm:num_requests_running{engine=\"0\" 1\n"), 1, 0)
	require.ErrorIs(t, err, promtext.ErrMalformed)
	_, err = ParseEngineMetrics(config.FlavorVLLM, []byte("<html>502 Bad Gateway</html>"), 1, 0)
	require.ErrorIs(t, err, promtext.ErrMalformed)
	_, err = ParseEngineMetrics(config.FlavorVLLM, readEngineTestdata(t, "sglang.txt"), 1, 0)
	require.ErrorIs(t, err, ErrNoEngineFigures, "the wrong flavor finds nothing")
	_, err = ParseEngineMetrics(config.FlavorVLLM, nil, 1, 0)
	require.ErrorIs(t, err, ErrNoEngineFigures)
	got, err := ParseEngineMetrics(config.FlavorVLLM, readEngineTestdata(t, "vllm.txt"), 0, 0)
	require.NoError(t, err, "dp_size 0 reads as 1")
	require.Len(t, got, 1)
}

func TestEngineBoardPublishRead(t *testing.T) {
	s := state.NewMemoryStore()
	b := NewEngineBoard(s, "ns", "decode", 5000, 8)
	got, err := b.Read(0, 5000)
	require.NoError(t, err)
	require.Empty(t, got)

	a, c := hashx.FingerprintString("10.0.0.1:8000#0"), hashx.FingerprintString("10.0.0.1:8000#1")
	require.NoError(t, b.Publish(1000, map[uint64]EngineFigures{
		a: {Running: 5, Waiting: 4, KVUsage: 0.72},
		c: {Running: 3, Waiting: 2, KVUsage: 0.5, CacheTokens: 1 << 40},
	}))
	got, err = b.Read(1500, 5000)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, 5.0, got[a].Running)
	require.Equal(t, 4.0, got[a].Waiting)
	require.InDelta(t, 0.72, got[a].KVUsage, 1e-6, "stored as float32")
	require.Equal(t, EngineFigures{Running: 3, Waiting: 2, KVUsage: 0.5, CacheTokens: math.MaxUint32}, got[c], "a cache too large to store saturates")

	// The key is <namespace>/engine/<pool>, format byte first.
	v, _, err := s.Get("ns/engine/decode")
	require.NoError(t, err)
	require.Equal(t, byte(engineBoardFormat), v[0])
	require.Len(t, v, 1+2*engineBoardEntrySize)

	// Staleness: figures younger than staleMS only.
	got, err = b.Read(5999, 5000)
	require.NoError(t, err)
	require.Len(t, got, 2)
	got, err = b.Read(6000, 5000)
	require.NoError(t, err)
	require.Empty(t, got)

	// ReadInto reuses and clears the map.
	dst := map[uint64]EngineFigures{42: {}}
	require.NoError(t, b.ReadInto(dst, 1000, 5000))
	require.Len(t, dst, 2)
	require.NotContains(t, dst, uint64(42))

	// A different pool is a different key.
	got, err = NewEngineBoard(s, "ns", "prefill", 5000, 8).Read(1000, 5000)
	require.NoError(t, err)
	require.Empty(t, got)
}

func TestEngineBoardPartialPublishKeepsOldFigures(t *testing.T) {
	s := state.NewMemoryStore()
	b := NewEngineBoard(s, "kvroute", "decode", 5000, 8)
	require.NoError(t, b.Publish(1000, map[uint64]EngineFigures{1: {Running: 1}, 2: {Running: 2}, 3: {Running: 3}}))
	// Endpoint of target 2 failed to scrape at 3000: only 1 and 3 are fresh.
	require.NoError(t, b.Publish(3000, map[uint64]EngineFigures{1: {Running: 10}, 3: {Running: 30}}))
	got, err := b.Read(4000, 5000)
	require.NoError(t, err)
	require.Equal(t, map[uint64]EngineFigures{1: {Running: 10}, 2: {Running: 2}, 3: {Running: 30}}, got,
		"target 2 keeps its old figures while they are fresh")
	// ... and they age out on their own clock.
	got, err = b.Read(6500, 5000)
	require.NoError(t, err)
	require.Equal(t, map[uint64]EngineFigures{1: {Running: 10}, 3: {Running: 30}}, got)

	// An empty publish (every scrape failed) writes nothing.
	_, cas1, _ := s.Get("kvroute/engine/decode")
	require.NoError(t, b.Publish(7000, nil))
	_, cas2, _ := s.Get("kvroute/engine/decode")
	require.Equal(t, cas1, cas2)

	// Entries older than keepMS are dropped from the value when it is next written.
	require.NoError(t, b.Publish(7500, map[uint64]EngineFigures{1: {Running: 11}}))
	v, _, _ := s.Get("kvroute/engine/decode")
	require.Len(t, v, 1+2*engineBoardEntrySize, "target 2 (taken at 1000) is gone, 3 (3000) stays")
	got, err = b.Read(7500, 1<<40)
	require.NoError(t, err)
	require.Equal(t, map[uint64]EngineFigures{1: {Running: 11}, 3: {Running: 30}}, got)
}

func TestEngineBoardUnknownFormatStartsAfresh(t *testing.T) {
	for what, v := range map[string][]byte{
		"other format": append([]byte{9}, make([]byte, engineBoardEntrySize)...),
		"format 1":     append([]byte{1}, make([]byte, 28)...), // before the cache's size
		"torn":         append([]byte{engineBoardFormat}, make([]byte, engineBoardEntrySize-3)...),
		"empty":        {},
	} {
		t.Run(what, func(t *testing.T) {
			s := state.NewMemoryStore()
			require.NoError(t, s.Set("kvroute/engine/decode", v, 0))
			b := NewEngineBoard(s, "kvroute", "decode", 5000, 8)
			got, err := b.Read(0, 5000)
			require.NoError(t, err)
			require.Empty(t, got)
			require.NoError(t, b.Publish(100, map[uint64]EngineFigures{7: {Waiting: 3}}))
			got, err = b.Read(100, 5000)
			require.NoError(t, err)
			require.Equal(t, map[uint64]EngineFigures{7: {Waiting: 3}}, got)
			raw, _, _ := s.Get("kvroute/engine/decode")
			require.Len(t, raw, 1+engineBoardEntrySize)
		})
	}
}

func TestEngineBoardStoreErrors(t *testing.T) {
	ms := state.NewMemoryStore()
	require.NoError(t, NewEngineBoard(ms, "kvroute", "decode", 5000, 2).Publish(1, map[uint64]EngineFigures{1: {Running: 1}}))
	hostDown := errors.New("host down")
	b := NewEngineBoard(state.FailingStore{Inner: ms, GetErr: hostDown}, "kvroute", "decode", 5000, 2)
	_, err := b.Read(1, 5000)
	require.ErrorIs(t, err, hostDown)
	require.ErrorIs(t, b.Publish(2, map[uint64]EngineFigures{1: {Running: 2}}), hostDown)
	b = NewEngineBoard(state.FailingStore{Inner: ms, SetErr: state.ErrCASMismatch}, "kvroute", "decode", 5000, 2)
	require.ErrorIs(t, b.Publish(2, map[uint64]EngineFigures{1: {Running: 2}}), state.ErrStateConflict)
	got, err := b.Read(2, 5000)
	require.NoError(t, err)
	require.Equal(t, map[uint64]EngineFigures{1: {Running: 1}}, got, "a failed publish changes nothing")
}

// Concurrent publishers of disjoint targets (VMs that each scraped some endpoints)
// never lose each other's figures.
func TestEngineBoardConcurrentPublish(t *testing.T) {
	s := state.NewMemoryStore()
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			b := NewEngineBoard(s, "kvroute", "decode", 1<<40, 1000)
			for i := 0; i < 50; i++ {
				require.NoError(t, b.Publish(int64(i), map[uint64]EngineFigures{uint64(w): {Running: float64(i)}}))
			}
		}(w)
	}
	wg.Wait()
	got, err := NewEngineBoard(s, "kvroute", "decode", 0, 8).Read(49, 1<<40)
	require.NoError(t, err)
	require.Len(t, got, 8)
	for w := uint64(0); w < 8; w++ {
		require.Equal(t, 49.0, got[w].Running)
	}
}

func readEngineTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "engine", name))
	require.NoError(t, err)
	return b
}
