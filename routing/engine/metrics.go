// Package engine reads the load the inference engines report: their Prometheus pages
// parsed per DP rank, the board every VM reads them from, and the lease that lets one
// VM at a time scrape.
package engine

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/promtext"
	"github.com/kvroute/kvroute/routing/state"
)

// Engine metrics (docs/behaviour.md, Engine-reported load): one VM at a time holds the
// scrape lease (NewScrapeLease) and scrapes every endpoint's Prometheus page; ParseEngineMetrics turns a
// page into per-DP-rank figures; EngineBoard keeps the latest figures of every target of a
// pool in shared data, each with the time it was taken, so every VM reads the same fleet
// view and figures that stop being refreshed age out.

// labelOffset is the rank label of an endpoint's first rank: dpRankStart, unless no
// label is one of the endpoint's ranks and the labels fit dpSize consecutive numbers,
// then the lowest label (see ParseEngineMetrics).
func labelOffset(groups map[engineGroupKey]*engineGroup, dpSize, dpRankStart int) int {
	lo, hi, any := 0, 0, false
	for key := range groups {
		if key.rank < 0 {
			continue
		}
		if key.rank >= dpRankStart && key.rank-dpRankStart < dpSize {
			return dpRankStart
		}
		if !any || key.rank < lo {
			lo = key.rank
		}
		if !any || key.rank > hi {
			hi = key.rank
		}
		any = true
	}
	if any && hi-lo < dpSize {
		return lo
	}
	return dpRankStart
}

// EngineFigures is what an engine reports about one target (an endpoint's DP rank).
type EngineFigures struct {
	Running, Waiting float64 // requests in the running batch, and queued
	KVUsage          float64 // fraction of the KV cache in use, 0..1
	CacheTokens      float64 // the KV cache's size in tokens (0: not reported)
}

// ErrNoEngineFigures means a page was read but holds none of the flavor's series (an
// engine without metrics enabled, a TensorRT-LLM too old to export its queue gauges, or
// the wrong engine_metrics.path). The caller treats it like a failed scrape.
var ErrNoEngineFigures = errors.New("kvroute: the metrics page has none of the engine's load series")

// ErrUnknownFlavor is returned for an engine_metrics.flavor ParseEngineMetrics does not know.
var ErrUnknownFlavor = errors.New("kvroute: unknown engine metrics flavor")

// engineNames are the series one engine flavor exports, and how it labels them.
type engineNames struct {
	running, waiting string
	kv, kvLegacy     string // kvLegacy counts only when kv is absent from the page
	cacheTokens      string // a gauge of the KV cache's size in tokens
	cacheInfo        string // an info gauge whose labels give the KV cache's size
	rankLabel        string // the DP rank of a series; "" when the engine has none
	modelLabel       string
}

// The names, each checked against the engine's own source:
//
// vLLM (V1 engine) — vllm-project/vllm vllm/v1/metrics/loggers.py, PrometheusStatLogger:
// gauges vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc
// (a fraction, "1 means 100 percent usage") and, until its removal, the deprecated
// duplicate vllm:gpu_cache_usage_perc (the only KV gauge of vLLM < 0.9 / V0). Every
// series has labelnames ["model_name", "engine"]; "engine" is the engine index, which
// is the DP rank (make_per_engine over engine_indexes). Sample pages with two engines:
// vllm-project/vllm tests/benchmarks/test_serve_metrics_export.py. The cache's size is
// the info gauge vllm:cache_config_info (value 1), one series per engine labelled with
// CacheConfig.metrics_info() and "engine" (loggers.py, _log_info_cache_config): the
// size in tokens is its kv_cache_size_tokens label where vLLM gives one (it counts
// hybrid models' attention groups right), else num_gpu_blocks × block_size shared
// evenly among the engines, as num_gpu_blocks is their sum.
//
// SGLang — sgl-project/sglang python/sglang/srt/metrics/collector.py,
// SchedulerMetricsCollector: gauges sglang:num_running_reqs, sglang:num_queue_reqs
// ("requests in the waiting queue"), sglang:token_usage (used / total KV tokens,
// a fraction) and sglang:max_total_num_tokens (the KV pool's size in tokens, set
// once at start). The labels come from python/sglang/srt/managers/scheduler_metrics_mixin.py
// init_metrics: model_name, engine_type, tp_rank, pp_rank, and dp_rank when the server
// runs data parallel. Every TP/PP scheduler of one DP rank can report the same queue
// (with --enable-metrics-for-all-schedulers, or under DP attention where tp_rank is
// global), so series that differ only in those labels are not summed: the largest wins.
//
// TensorRT-LLM (trtllm-serve) — NVIDIA/TensorRT-LLM tensorrt_llm/metrics/collector.py,
// MetricsCollector with metric_prefix "trtllm_": gauges trtllm_num_requests_running
// ("Number of active requests"), trtllm_num_requests_waiting ("Number of queued
// requests") and trtllm_kv_cache_utilization, labelled with the server's labels
// (model_name, engine_type) and no rank label. trtllm-serve serves this Prometheus text
// at /prometheus/metrics (tensorrt_llm/serve/openai_server.py mounts make_asgi_app()
// there); its /metrics answers JSON iteration stats, so engine_metrics.path must be
// /prometheus/metrics for this flavor. Releases up to 1.1 exported only per-request
// histograms and counters there (no running/waiting gauge); such a page yields
// ErrNoEngineFigures, and the figures simply stay absent.
var engineFlavors = map[string]engineNames{
	config.FlavorVLLM: {
		running: "vllm:num_requests_running", waiting: "vllm:num_requests_waiting",
		kv: "vllm:kv_cache_usage_perc", kvLegacy: "vllm:gpu_cache_usage_perc",
		cacheInfo: "vllm:cache_config_info", rankLabel: "engine", modelLabel: "model_name",
	},
	config.FlavorSGLang: {
		running: "sglang:num_running_reqs", waiting: "sglang:num_queue_reqs",
		kv: "sglang:token_usage", cacheTokens: "sglang:max_total_num_tokens",
		rankLabel: "dp_rank", modelLabel: "model_name",
	},
	config.FlavorTRTLLM: {
		running: "trtllm_num_requests_running", waiting: "trtllm_num_requests_waiting",
		kv: "trtllm_kv_cache_utilization", modelLabel: "model_name",
	},
}

const (
	hasRunning = 1 << iota
	hasWaiting
	hasKV
	hasKVLegacy
	hasCache
)

type engineGroupKey struct {
	rank  int // -1: the series has no rank label; -2: its rank label is not a number
	model uint64
}

type engineGroup struct {
	running, waiting, kv, kvLegacy, cache float64
	has                                   uint8
	cacheWhole                            bool // cache is the whole server's (cacheInfoTokens)
}

func (g *engineGroup) set(field *float64, bit uint8, v float64) {
	if g.has&bit == 0 || v > *field {
		*field = v
	}
	g.has |= bit
}

// ParseEngineMetrics reads one endpoint's metrics page and returns its figures per DP
// rank, numbered as the endpoint's targets are: dpRankStart .. dpRankStart+dpSize-1.
// Series are grouped by (rank, model): within a group (series that differ only in
// other labels, such as SGLang's tp_rank) the largest value counts; across models
// running, waiting and the cache's size add up and KV usage is the largest (each
// model has its own cache, and the fullest one is what limits the server).
//
// The rank of a series is its rank label (vLLM "engine", SGLang "dp_rank"):
//   - dpSize <= 1: every series counts for the endpoint's only rank, whatever its
//     label (a vLLM external-load-balancing server labels its only engine with its
//     global DP rank, and a DP server kvroute treats as one target balances its
//     engines itself);
//   - otherwise a label v is the endpoint's rank v when that is one of its ranks. A
//     vLLM hybrid-load-balancing node labels its engines with their global ranks even
//     where its API server takes node-local ranks in the header (and the endpoint has
//     dp_rank_start 0): when no label is one of the endpoint's ranks and all of them
//     lie within dpSize consecutive numbers, the lowest label is the endpoint's first
//     rank. A labelled series that is still outside, or whose label is not a number,
//     is left out: it cannot be attributed;
//   - a series without a rank label on an endpoint with dpSize > 1 is spread evenly:
//     each rank gets running/dpSize, waiting/dpSize and cache/dpSize, and the KV
//     usage as it is.
//
// Values that are NaN, infinite or negative are left out. A malformed page is an error
// wrapping promtext.ErrMalformed; a page with none of the flavor's series is
// ErrNoEngineFigures. Either way the caller keeps no figures from it.
func ParseEngineMetrics(flavor string, text []byte, dpSize, dpRankStart int) (map[int]EngineFigures, error) {
	names, ok := engineFlavors[flavor]
	if !ok {
		return nil, ErrUnknownFlavor
	}
	if dpSize < 1 {
		dpSize = 1
	}
	groups := map[engineGroupKey]*engineGroup{}
	wholeSeries := 0 // cache_config_info series that give the whole server's blocks
	err := promtext.Scan(text, func(name []byte, labels promtext.Labels, v float64) bool {
		var field int
		var whole bool
		switch string(name) {
		case names.running:
			field = hasRunning
		case names.waiting:
			field = hasWaiting
		case names.kv:
			field = hasKV
		case names.kvLegacy: // "" for flavors without one: never a sample's name
			field = hasKVLegacy
		case names.cacheTokens:
			field = hasCache
		case names.cacheInfo:
			field = hasCache
			if v, whole = cacheInfoTokens(labels); v <= 0 {
				return true
			}
		default:
			return true
		}
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return true
		}
		key := engineGroupKey{rank: -1, model: labels.Hash(names.modelLabel)}
		if names.rankLabel != "" && labels.Has(names.rankLabel) {
			key.rank = -2 // not a rank: counts only where every series goes to the one rank
			if r, ok := labels.Int(names.rankLabel); ok {
				key.rank = r
			}
		}
		g := groups[key]
		if g == nil {
			g = &engineGroup{}
			groups[key] = g
		}
		switch field {
		case hasRunning:
			g.set(&g.running, hasRunning, v)
		case hasWaiting:
			g.set(&g.waiting, hasWaiting, v)
		case hasKV:
			g.set(&g.kv, hasKV, v)
		case hasKVLegacy:
			g.set(&g.kvLegacy, hasKVLegacy, v)
		case hasCache:
			g.set(&g.cache, hasCache, v)
			if whole {
				g.cacheWhole = true
				wholeSeries++
			}
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	// vLLM's front end sums num_gpu_blocks over the DP engines it runs and labels every
	// engine's series with that sum: each engine has its share.
	if wholeSeries > 1 {
		for _, g := range groups {
			if g.cacheWhole {
				g.cache /= float64(wholeSeries)
			}
		}
	}
	out := map[int]EngineFigures{}
	add := func(rank int, g *engineGroup, share float64) {
		f := out[rank]
		f.Running += g.running * share
		f.Waiting += g.waiting * share
		f.CacheTokens += g.cache * share
		kv := g.kv
		if g.has&hasKV == 0 {
			kv = g.kvLegacy
		}
		f.KVUsage = max(f.KVUsage, kv)
		out[rank] = f
	}
	offset := labelOffset(groups, dpSize, dpRankStart)
	for key, g := range groups {
		switch {
		case dpSize == 1:
			add(dpRankStart, g, 1)
		case key.rank == -1:
			for r := 0; r < dpSize; r++ {
				add(dpRankStart+r, g, 1/float64(dpSize))
			}
		case key.rank >= offset && key.rank-offset < dpSize:
			add(dpRankStart+key.rank-offset, g, 1)
		}
	}
	if len(out) == 0 {
		return nil, ErrNoEngineFigures
	}
	return out, nil
}

// cacheInfoTokens is the KV cache's size in tokens that a vLLM cache_config_info
// series gives in its labels (0: none that can be read, as before the cache is sized,
// when vLLM labels it "None"). kv_cache_size_tokens is the engine's own;
// num_gpu_blocks × block_size is the whole server's (whole): vLLM's front end adds up
// the blocks of every DP engine it runs (v1/engine/utils.py, wait_for_engine_startup).
func cacheInfoTokens(labels promtext.Labels) (tokens float64, whole bool) {
	if n, ok := labels.Int("kv_cache_size_tokens"); ok {
		return float64(n), false
	}
	blocks, ok1 := labels.Int("num_gpu_blocks")
	size, ok2 := labels.Int("block_size")
	if !ok1 || !ok2 {
		return 0, false
	}
	return float64(blocks) * float64(size), true
}

// EngineBoard keeps the latest engine figures of every target of one pool in one
// shared-data key, <namespace>/engine/<pool>, each with the time it was taken.
//
// The value is a format byte, then per target: id (8), taken at in ms (8), running,
// waiting and KV usage (float32, 4 each) and the cache's size in tokens (uint32,
// saturating), little-endian. A value of another format, or
// torn, reads as empty and is started afresh.
type EngineBoard struct {
	store   state.Store
	key     string
	retries int
	keepMS  int64
}

const (
	engineBoardFormat    = 2
	engineBoardEntrySize = 32
)

type boardEntry struct {
	id      uint64
	takenMS int64
	f       EngineFigures
}

// NewEngineBoard returns the board of one pool. Entries older than keepMS (pass
// engine_metrics.stale_ms; 0 keeps them forever) are dropped when the board is
// written, so targets that leave the config or stop answering do not linger.
func NewEngineBoard(s state.Store, namespace, pool string, keepMS int64, retries int) *EngineBoard {
	return &EngineBoard{store: s, key: namespace + "/engine/" + pool, retries: retries, keepMS: keepMS}
}

func decodeEngineBoard(v []byte) []boardEntry {
	if len(v) < 1 || v[0] != engineBoardFormat || (len(v)-1)%engineBoardEntrySize != 0 {
		return nil
	}
	v = v[1:]
	out := make([]boardEntry, 0, len(v)/engineBoardEntrySize)
	for ; len(v) >= engineBoardEntrySize; v = v[engineBoardEntrySize:] {
		out = append(out, boardEntry{
			id:      binary.LittleEndian.Uint64(v),
			takenMS: int64(binary.LittleEndian.Uint64(v[8:])),
			f:       decodeFigures(v),
		})
	}
	return out
}

func encodeEngineBoard(entries []boardEntry) []byte {
	out := make([]byte, 1, 1+len(entries)*engineBoardEntrySize)
	out[0] = engineBoardFormat
	for _, e := range entries {
		out = binary.LittleEndian.AppendUint64(out, e.id)
		out = binary.LittleEndian.AppendUint64(out, uint64(e.takenMS))
		out = binary.LittleEndian.AppendUint32(out, math.Float32bits(float32(e.f.Running)))
		out = binary.LittleEndian.AppendUint32(out, math.Float32bits(float32(e.f.Waiting)))
		out = binary.LittleEndian.AppendUint32(out, math.Float32bits(float32(e.f.KVUsage)))
		out = binary.LittleEndian.AppendUint32(out, uint32(min(max(e.f.CacheTokens, 0), math.MaxUint32)))
	}
	return out
}

// decodeFigures reads the figures of one board entry.
func decodeFigures(v []byte) EngineFigures {
	return EngineFigures{
		Running:     float64(math.Float32frombits(binary.LittleEndian.Uint32(v[16:]))),
		Waiting:     float64(math.Float32frombits(binary.LittleEndian.Uint32(v[20:]))),
		KVUsage:     float64(math.Float32frombits(binary.LittleEndian.Uint32(v[24:]))),
		CacheTokens: float64(binary.LittleEndian.Uint32(v[28:])),
	}
}

// Publish records fresh figures, taken at nowMS, for the targets in figures (by target
// id) under compare-and-swap. Targets not in figures keep their previous figures and
// time, so a failed or unparsable scrape of one endpoint leaves its old figures to age
// out instead of wiping them. Entries older than the board's keepMS are dropped.
func (b *EngineBoard) Publish(nowMS int64, figures map[uint64]EngineFigures) error {
	if len(figures) == 0 {
		return nil
	}
	ids := make([]uint64, 0, len(figures))
	for id := range figures {
		ids = append(ids, id)
	}
	slices.Sort(ids) // a deterministic value for the same figures
	return state.Update(b.store, b.key, b.retries, func(old []byte) ([]byte, bool) {
		entries := decodeEngineBoard(old)
		kept := entries[:0]
		for _, e := range entries {
			if _, fresh := figures[e.id]; fresh {
				continue // replaced below
			}
			if b.keepMS > 0 && nowMS-e.takenMS > b.keepMS {
				continue
			}
			kept = append(kept, e)
		}
		for _, id := range ids {
			kept = append(kept, boardEntry{id: id, takenMS: nowMS, f: figures[id]})
		}
		return encodeEngineBoard(kept), true
	})
}

// Read returns the figures of every target taken less than staleMS before nowMS.
func (b *EngineBoard) Read(nowMS, staleMS int64) (map[uint64]EngineFigures, error) {
	out := map[uint64]EngineFigures{}
	if err := b.ReadInto(out, nowMS, staleMS); err != nil {
		return nil, err
	}
	return out, nil
}

// ReadInto is Read into dst, which it clears first, so a caller can reuse one map.
func (b *EngineBoard) ReadInto(dst map[uint64]EngineFigures, nowMS, staleMS int64) error {
	clear(dst)
	v, _, err := b.store.Get(b.key)
	if err == state.ErrNotFound {
		return nil
	}
	if err != nil {
		return err
	}
	if len(v) < 1 || v[0] != engineBoardFormat || (len(v)-1)%engineBoardEntrySize != 0 {
		return nil
	}
	for v = v[1:]; len(v) >= engineBoardEntrySize; v = v[engineBoardEntrySize:] {
		taken := int64(binary.LittleEndian.Uint64(v[8:]))
		if nowMS-taken >= staleMS {
			continue
		}
		dst[binary.LittleEndian.Uint64(v)] = decodeFigures(v)
	}
	return nil
}

// NewScrapeLease returns the engine-scrape lease of a namespace, at
// <namespace>/engine/lease: one VM at a time scrapes the engines.
func NewScrapeLease(s state.Store, namespace string, retries int) *state.Lease {
	return state.NewLease(s, namespace+"/engine/lease", retries)
}
