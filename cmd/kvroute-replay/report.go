package main

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// Report is everything one run measured.
type Report struct {
	TraceKind   string
	TracePath   string
	Requests    int
	Blocks      int64 // accounting blocks over the trace
	Distinct    int   // distinct accounting blocks
	BlockTokens int
	DurationMS  float64 // last arrival
	Fleet       FleetConfig
	Speed       float64

	OracleLRU      float64 // one LRU of the fleet's total capacity
	OracleInfinite float64 // a cache that never evicts

	KVRoute   *Result   // nil when not replayed
	Baselines []*Result // in table order
	Notes     []string  // anomalies seen during the replay
}

// Limits of the routing-quality bar (docs/development.md, Benchmarks and the bars).
const (
	barOracleShare = 0.95
	barLoad        = 1.2
)

// BarLine is one PASS/FAIL line of the quality bar.
type BarLine struct {
	Text string
	Pass bool
	NA   bool // not applicable to this trace (no shared prefixes)
}

// Bars evaluates the routing-quality bar on this run.
func (rep *Report) Bars() []BarLine {
	k := rep.KVRoute
	if k == nil {
		return nil
	}
	var out []BarLine
	shared := rep.OracleInfinite > 0
	if shared {
		share := ratio(k.HitRate(), rep.OracleLRU)
		out = append(out, BarLine{
			Text: fmt.Sprintf("prefix hit rate >= 95%% of the oracle (one shared LRU of %d blocks): %.4f / %.4f = %.1f%%",
				rep.oracleBlocks(), k.HitRate(), rep.OracleLRU, 100*share),
			Pass: share >= barOracleShare,
		})
	} else {
		out = append(out, BarLine{Text: "prefix hit rate >= 95% of the oracle: the trace shares no prefix (oracle 0)", NA: true})
	}
	out = append(out, BarLine{
		Text: fmt.Sprintf("max/mean active load <= %.1f (time-averaged in-flight requests per target): %.3f", barLoad, k.LoadImbalance()),
		Pass: k.LoadImbalance() <= barLoad,
	})
	if shared && len(rep.Baselines) > 0 {
		best := rep.Baselines[0]
		for _, b := range rep.Baselines {
			if b.HitRate() > best.HitRate() {
				best = b
			}
		}
		out = append(out, BarLine{
			Text: fmt.Sprintf("hit rate strictly above every baseline: %.4f vs best baseline %s %.4f (%+.4f)",
				k.HitRate(), best.Policy, best.HitRate(), k.HitRate()-best.HitRate()),
			Pass: k.HitRate() > best.HitRate(),
		})
	} else if len(rep.Baselines) > 0 {
		out = append(out, BarLine{Text: "hit rate strictly above every baseline: the trace shares no prefix", NA: true})
	}
	return out
}

func (rep *Report) oracleBlocks() int {
	return rep.Fleet.CacheTokens / rep.BlockTokens * rep.Fleet.Targets()
}

// Results lists kvroute first, then the baselines.
func (rep *Report) Results() []*Result {
	var out []*Result
	if rep.KVRoute != nil {
		out = append(out, rep.KVRoute)
	}
	return append(out, rep.Baselines...)
}

// WriteText prints the report as plain text.
func (rep *Report) WriteText(w io.Writer) {
	fc := rep.Fleet
	capBlocks := fc.CacheTokens / rep.BlockTokens
	fmt.Fprintf(w, "kvroute-replay: %s trace %s\n", rep.TraceKind, rep.TracePath)
	fmt.Fprintf(w, "  %d requests over %.0f s (speed x%g), %d prompt blocks of %d tokens, %d distinct\n",
		rep.Requests, rep.DurationMS/1000, rep.Speed, rep.Blocks, rep.BlockTokens, rep.Distinct)
	fmt.Fprintf(w, "  fleet: %d endpoints x dp %d = %d targets; prefix KV cache %d blocks (%d tokens) per target, %d in all",
		fc.Endpoints, fc.DPSize, fc.Targets(), capBlocks, fc.CacheTokens, capBlocks*fc.Targets())
	if rep.Distinct > 0 {
		fmt.Fprintf(w, " (%.1f%% of the distinct blocks)", 100*float64(capBlocks*fc.Targets())/float64(rep.Distinct))
	}
	fmt.Fprintf(w, "\n  service: prefill %.3g ms per uncached token (one prefill at a time per target), decode %.3g ms per output token, %d running per target\n",
		fc.PrefillMSPerToken, fc.DecodeMSPerToken, fc.MaxRunning)
	fmt.Fprintf(w, "  oracle hit rate: one shared LRU of the fleet's total size %.4f; infinite cache %.4f\n\n",
		rep.OracleLRU, rep.OracleInfinite)

	const rowFormat = "%-20s %8s %7s %9s %9s %9s %9s %9s %8s %8s\n"
	fmt.Fprintf(w, rowFormat, "policy", "hit rate", "/oracle", "/infinite", "work", "in-flight", "in-flight", "TTFT mean", "TTFT p50", "TTFT p99")
	fmt.Fprintf(w, rowFormat, "", "", "", "", "max/mean", "max/mean", "mean", "ms", "ms", "ms")
	fmt.Fprintln(w, strings.Repeat("-", 101))
	for _, r := range rep.Results() {
		fmt.Fprintf(w, rowFormat, r.Policy, f4(r.HitRate()), f3(ratio(r.HitRate(), rep.OracleLRU)), f3(ratio(r.HitRate(), rep.OracleInfinite)),
			f3(r.WorkImbalance()), f3(r.LoadImbalance()), f3(mean(r.MeanInFlight)),
			f0(r.TTFTMean()), f0(r.TTFTQuantile(0.5)), f0(r.TTFTQuantile(0.99)))
	}
	if k := rep.KVRoute; k != nil {
		fmt.Fprintf(w, "\nkvroute decisions (filter counters):")
		writeDecisionMix(w, k.Decisions)
		fmt.Fprintf(w, "; P/D split: %s; %d timer ticks\n", k.PD, k.Ticks)
		fmt.Fprintf(w, "kvroute requests per target:")
		for _, n := range k.Assigned {
			fmt.Fprintf(w, " %d", n)
		}
		fmt.Fprintln(w)
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "NOTE: %s\n", n)
	}
	if bars := rep.Bars(); len(bars) > 0 {
		fmt.Fprintln(w, "\nRouting-quality bar, measured in this run:")
		for _, b := range bars {
			verdict := "FAIL"
			switch {
			case b.NA:
				verdict = "n/a "
			case b.Pass:
				verdict = "PASS"
			}
			fmt.Fprintf(w, "  %s  %s\n", verdict, b.Text)
		}
	}
}

// WriteSVG draws the comparison as an SVG: hit rate against the oracles, load
// imbalance against the bar, and the TTFT estimate, one horizontal bar per policy.
func (rep *Report) WriteSVG(w io.Writer) error {
	results := rep.Results()
	const (
		labelW = 170
		panelW = 250
		gap    = 30
		rowH   = 26
		top    = 70
	)
	width := labelW + 3*panelW + 2*gap + 20
	height := top + rowH*len(results) + 62
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="10" y="20" font-size="15" font-weight="bold">kvroute-replay: %s, %d requests, %d targets x %d-block caches</text>`+"\n",
		html.EscapeString(rep.TraceKind), rep.Requests, rep.Fleet.Targets(), rep.Fleet.CacheTokens/rep.BlockTokens)

	type panel struct {
		title   string
		value   func(*Result) float64
		max     float64
		marks   []mark
		format  string
		goodLow bool
	}
	maxTTFT, maxLoad := 1.0, barLoad
	for _, r := range results {
		maxTTFT = math.Max(maxTTFT, r.TTFTMean())
		maxLoad = math.Max(maxLoad, r.LoadImbalance())
	}
	panels := []panel{
		{title: "prefix-block hit rate", value: (*Result).HitRate, max: math.Max(rep.OracleInfinite, 0.01) * 1.05, format: "%.3f",
			marks: []mark{{rep.OracleInfinite, "infinite"}, {rep.OracleLRU, "oracle LRU"}, {barOracleShare * rep.OracleLRU, "95%"}}},
		{title: "in-flight max/mean (bar 1.2)", value: (*Result).LoadImbalance, max: maxLoad * 1.1, format: "%.2f", goodLow: true,
			marks: []mark{{1, ""}, {barLoad, "1.2"}}},
		{title: "TTFT mean, ms", value: (*Result).TTFTMean, max: maxTTFT * 1.1, format: "%.0f", goodLow: true},
	}
	for i, r := range results {
		y := top + i*rowH
		weight := "normal"
		if r == rep.KVRoute {
			weight = "bold"
		}
		fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="%s">%s</text>`+"\n", y+16, weight, html.EscapeString(r.Policy))
	}
	for pi, p := range panels {
		x0 := labelW + pi*(panelW+gap)
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", x0, top-22, html.EscapeString(p.title))
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#444"/>`+"\n", x0, top-4, x0, top+rowH*len(results))
		scale := func(v float64) float64 { return float64(x0) + float64(panelW)*math.Max(0, v)/p.max }
		for i, r := range results {
			v := p.value(r)
			y := top + i*rowH
			color := "#9aa5b1"
			if r == rep.KVRoute {
				color = "#1f6feb"
			}
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x0, y+4, scale(v)-float64(x0), rowH-8, color)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="11">%s</text>`+"\n", scale(v)+4, y+17, fmt.Sprintf(p.format, v))
		}
		for mi, m := range p.marks {
			if m.at <= 0 || m.at > p.max {
				continue
			}
			x := scale(m.at)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#d1242f" stroke-dasharray="4 3"/>`+"\n",
				x, top-4, x, top+rowH*len(results))
			if m.label != "" {
				fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="10" fill="#d1242f" text-anchor="middle">%s</text>`+"\n",
					x, top+rowH*len(results)+13+11*mi, html.EscapeString(m.label))
			}
		}
	}
	if bars := rep.Bars(); len(bars) > 0 {
		var parts []string
		for _, bl := range bars {
			switch {
			case bl.NA:
				parts = append(parts, "n/a")
			case bl.Pass:
				parts = append(parts, "PASS")
			default:
				parts = append(parts, "FAIL")
			}
		}
		fmt.Fprintf(&b, `<text x="10" y="%d" font-size="11">%s</text>`+"\n", height-10, html.EscapeString(
			"Routing-quality bar (hit >= 95% of the oracle / in-flight max/mean <= 1.2 / hit above every baseline): "+strings.Join(parts, " / ")))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func f0(v float64) string { return fmt.Sprintf("%.0f", v) }
func f3(v float64) string { return fmt.Sprintf("%.3f", v) }
func f4(v float64) string { return fmt.Sprintf("%.4f", v) }

func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return ratio(s, float64(len(xs)))
}

type mark struct {
	at    float64
	label string
}

// WriteCSV writes one row per request: its arrival and blocks, then per policy the
// target chosen and the prefix blocks served from cache, and kvroute's decision.
func (rep *Report) WriteCSV(w io.Writer, reqs []*Request) error {
	results := rep.Results()
	var b strings.Builder
	b.WriteString("request,arrival_ms,input_tokens,blocks")
	for _, r := range results {
		name := strings.NewReplacer(" ", "_", "(", "", ")", "").Replace(r.Policy)
		fmt.Fprintf(&b, ",%s_target,%s_hits", name, name)
	}
	if rep.KVRoute != nil {
		b.WriteString(",kvroute_decision")
	}
	b.WriteByte('\n')
	for i, q := range reqs {
		fmt.Fprintf(&b, "%d,%.1f,%d,%d", q.Index, q.ArrivalMS, q.InputTokens, len(q.Blocks))
		for _, r := range results {
			t, h := -1, int32(0)
			if i < len(r.Choices) {
				t = r.Choices[i]
			}
			if i < len(r.Hits) {
				h = r.Hits[i]
			}
			fmt.Fprintf(&b, ",%d,%d", t, h)
		}
		if k := rep.KVRoute; k != nil {
			kind := ""
			if i < len(k.Kinds) {
				kind = k.Kinds[i]
			}
			fmt.Fprintf(&b, ",%s", kind)
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeDecisionMix writes " kind n (share%)" for every kind that occurred.
func writeDecisionMix(w io.Writer, decisions []Count) {
	var total uint64
	for _, c := range decisions {
		total += c.N
	}
	for _, c := range decisions {
		if c.N > 0 {
			fmt.Fprintf(w, " %s %d (%.1f%%)", c.Name, c.N, 100*ratio(float64(c.N), float64(total)))
		}
	}
}
