package main

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// serveMetrics writes vLLM-style Prometheus text, one series per DP rank.
func (w *worker) serveMetrics(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeError(rw, http.StatusMethodNotAllowed, "use GET", nil)
		return
	}
	capacity := kvCapacity
	if w.cfg.MaxRunning > 0 {
		capacity = w.cfg.MaxRunning
	}
	var b strings.Builder
	family := func(name, typ, help string, value func(rs *rankState) float64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
		for i, rs := range w.ranks {
			fmt.Fprintf(&b, "%s{engine=\"%d\",model_name=%q} %s\n", name, i, w.cfg.Model, promFloat(value(rs)))
		}
	}
	family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
		func(rs *rankState) float64 { return float64(rs.running.Load()) })
	family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
		func(rs *rankState) float64 { return float64(rs.waiting.Load()) })
	family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
		func(rs *rankState) float64 { return min(1, float64(rs.running.Load())/float64(capacity)) })
	family("mock:requests_total", "counter", "Inference requests answered with 200 by this mock worker.",
		func(rs *rankState) float64 { return float64(rs.served.Load()) })
	rw.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	io.WriteString(rw, b.String())
}

// promFloat formats v as Prometheus' Python client does ("3.0", "0.25").
func promFloat(v float64) string {
	if v == float64(int64(v)) {
		return strconv.FormatInt(int64(v), 10) + ".0"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
