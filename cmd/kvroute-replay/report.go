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

	KVRoute   *Result   // nil when not replayed; the first speed's first draw
	Baselines []*Result // in table order; the first speed's first draw
	Notes     []string  // anomalies seen during the replay

	Draws int     // tie-break draws per speed
	Cells []*Cell // every speed × draw, speed-major
}

// Cell is one replay of every policy: one speed, one tie-break draw.
type Cell struct {
	Speed      float64
	Draw       int
	DurationMS float64 // last arrival
	KVRoute    *Result
	Baselines  []*Result
	reqs       []*Request
}

// Speeds lists the replayed speeds in order.
func (rep *Report) Speeds() []float64 {
	var out []float64
	for _, c := range rep.Cells {
		if len(out) == 0 || out[len(out)-1] != c.Speed {
			out = append(out, c.Speed)
		}
	}
	if len(out) == 0 {
		out = append(out, rep.Speed)
	}
	return out
}

// PolicyStats is one policy at one speed over the draws.
type PolicyStats struct {
	Policy                 string
	KVRoute                bool
	TTFTMean, TTFTP99, Hit Spread
	TTFTP50, InFlightImbal Spread
	First                  *Result // the first draw
}

// Spread is a mean over draws with its range.
type Spread struct{ Mean, Min, Max float64 }

func spreadOf(xs []float64) Spread {
	s := Spread{Min: math.Inf(1), Max: math.Inf(-1)}
	for _, x := range xs {
		s.Mean += x
		s.Min = math.Min(s.Min, x)
		s.Max = math.Max(s.Max, x)
	}
	s.Mean /= float64(max(1, len(xs)))
	return s
}

// Stats summarises every policy at speed over its draws, kvroute first.
func (rep *Report) Stats(speed float64) []PolicyStats {
	var cells []*Cell
	for _, c := range rep.Cells {
		if c.Speed == speed {
			cells = append(cells, c)
		}
	}
	if len(cells) == 0 {
		cells = []*Cell{{Speed: rep.Speed, KVRoute: rep.KVRoute, Baselines: rep.Baselines}}
	}
	pick := func(c *Cell) []*Result {
		var out []*Result
		if c.KVRoute != nil {
			out = append(out, c.KVRoute)
		}
		return append(out, c.Baselines...)
	}
	var out []PolicyStats
	for i, first := range pick(cells[0]) {
		var mean, p99, p50, hit, imb []float64
		for _, c := range cells {
			r := pick(c)[i]
			mean = append(mean, r.TTFTMean())
			p99 = append(p99, r.TTFTQuantile(0.99))
			p50 = append(p50, r.TTFTQuantile(0.5))
			hit = append(hit, r.HitRate())
			imb = append(imb, r.LoadImbalance())
		}
		out = append(out, PolicyStats{Policy: first.Policy, KVRoute: first == cells[0].KVRoute,
			TTFTMean: spreadOf(mean), TTFTP99: spreadOf(p99), TTFTP50: spreadOf(p50), Hit: spreadOf(hit),
			InFlightImbal: spreadOf(imb), First: first})
	}
	return out
}

// Limits of the routing-quality bar.
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

// Bars evaluates the routing-quality bar at every speed, on the means over
// the draws: kvroute's TTFT mean and p99 each the lowest of all policies, and its hit
// rate at least 95 % of the oracle's.
func (rep *Report) Bars() []BarLine {
	if rep.KVRoute == nil {
		return nil
	}
	var out []BarLine
	for _, speed := range rep.Speeds() {
		stats := rep.Stats(speed)
		k := stats[0]
		at := fmt.Sprintf("x%g, %d draw(s)", speed, max(1, rep.Draws))
		for _, m := range []struct {
			name string
			get  func(PolicyStats) float64
		}{{"TTFT mean", func(s PolicyStats) float64 { return s.TTFTMean.Mean }},
			{"TTFT p99", func(s PolicyStats) float64 { return s.TTFTP99.Mean }}} {
			var best []PolicyStats
			bestV := math.Inf(1)
			for _, s := range stats[1:] {
				if v := m.get(s); v < bestV {
					bestV, best = v, []PolicyStats{s}
				}
			}
			if len(best) == 0 {
				continue
			}
			out = append(out, BarLine{
				Text: fmt.Sprintf("%s: kvroute's %s is the lowest: %.0f ms vs best other %s %.0f ms (%+.1f%%)",
					at, m.name, m.get(k), best[0].Policy, bestV, 100*(m.get(k)/bestV-1)),
				Pass: m.get(k) < bestV,
			})
		}
		if rep.OracleInfinite > 0 {
			share := ratio(k.Hit.Mean, rep.OracleLRU)
			out = append(out, BarLine{
				Text: fmt.Sprintf("%s: kvroute's prefix hit rate >= 95%% of the oracle (one shared LRU of %d blocks): %.4f / %.4f = %.1f%%",
					at, rep.oracleBlocks(), k.Hit.Mean, rep.OracleLRU, 100*share),
				Pass: share >= barOracleShare,
			})
		} else {
			out = append(out, BarLine{Text: at + ": prefix hit rate >= 95% of the oracle: the trace shares no prefix (oracle 0)", NA: true})
		}
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
	fmt.Fprintf(w, "  %d requests over %.0f s at speed x1, %d prompt blocks of %d tokens, %d distinct\n",
		rep.Requests, rep.baseDurationMS()/1000, rep.Blocks, rep.BlockTokens, rep.Distinct)
	fmt.Fprintf(w, "  fleet: %d endpoints x dp %d = %d targets; prefix KV cache %d blocks (%d tokens) per target, %d in all",
		fc.Endpoints, fc.DPSize, fc.Targets(), capBlocks, fc.CacheTokens, capBlocks*fc.Targets())
	if rep.Distinct > 0 {
		fmt.Fprintf(w, " (%.1f%% of the distinct blocks)", 100*float64(capBlocks*fc.Targets())/float64(rep.Distinct))
	}
	fmt.Fprintf(w, "\n  service: prefill %.3g ms per uncached token (one prefill at a time per target, FIFO), decode %.3g ms per output token, %d running per target; responses streamed\n",
		fc.PrefillMSPerToken, fc.DecodeMSPerToken, fc.MaxRunning)
	if fc.SlowEndpoints > 0 && fc.SlowFactor != 1 {
		fmt.Fprintf(w, "  mixed fleet: endpoints 1-%d prefill and decode %.3g times as slowly\n", min(fc.SlowEndpoints, fc.Endpoints), fc.SlowFactor)
	}
	fmt.Fprintf(w, "  oracle hit rate: one shared LRU of the fleet's total size %.4f; infinite cache %.4f\n",
		rep.OracleLRU, rep.OracleInfinite)
	draws := max(1, rep.Draws)
	fmt.Fprintf(w, "  TTFT = time to first token (arrival to the end of its prefill), ms: lower is better; hit rate: higher is better.\n")
	if draws > 1 {
		fmt.Fprintf(w, "  Each figure is the mean over %d tie-break draws, [min-max] its range.\n", draws)
	}
	for _, speed := range rep.Speeds() {
		fmt.Fprintf(w, "\nspeed x%g (arrivals %g times the trace's pace)\n", speed, speed)
		const rowFormat = "%-20s %21s %20s %9s %8s %7s %9s\n"
		fmt.Fprintf(w, rowFormat, "policy", "TTFT mean ms", "TTFT p99 ms", "TTFT p50", "hit rate", "/oracle", "in-flight")
		fmt.Fprintf(w, rowFormat, "", "(lower better)", "(lower better)", "ms", "(higher)", "", "max/mean")
		fmt.Fprintln(w, strings.Repeat("-", 100))
		stats := rep.Stats(speed)
		bestMean, bestP99 := math.Inf(1), math.Inf(1)
		for _, st := range stats {
			bestMean = math.Min(bestMean, st.TTFTMean.Mean)
			bestP99 = math.Min(bestP99, st.TTFTP99.Mean)
		}
		// Means of a few ms (a light chat trace) differ in hundredths, which whole
		// ms would hide.
		meanFormat := "%.0f"
		if bestMean < 100 {
			meanFormat = "%.2f"
		}
		for _, st := range stats {
			fmt.Fprintf(w, rowFormat, st.Policy, withSpread(st.TTFTMean, draws, meanFormat, st.TTFTMean.Mean == bestMean),
				withSpread(st.TTFTP99, draws, "%.0f", st.TTFTP99.Mean == bestP99), f0(st.TTFTP50.Mean),
				f4(st.Hit.Mean), f3(ratio(st.Hit.Mean, rep.OracleLRU)), f3(st.InFlightImbal.Mean))
		}
		fmt.Fprintln(w, "  (* = the lowest)")
		for _, c := range rep.Cells {
			if c.Speed == speed && c.Draw == 0 && c.KVRoute != nil && len(c.KVRoute.Decisions) > 0 {
				fmt.Fprintf(w, "  kvroute decisions, first draw:")
				writeDecisionMix(w, c.KVRoute.Decisions)
				fmt.Fprintf(w, "; P/D split: %s\n", c.KVRoute.PD)
			}
		}
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

// baseDurationMS is the trace's span at speed x1.
func (rep *Report) baseDurationMS() float64 {
	for _, c := range rep.Cells {
		return c.DurationMS * c.Speed
	}
	return rep.DurationMS * rep.Speed
}

// withSpread renders a mean and, over several draws, its range; best marks it.
func withSpread(s Spread, draws int, format string, best bool) string {
	out := fmt.Sprintf(format, s.Mean)
	if draws > 1 {
		out += fmt.Sprintf(" ["+format+"-"+format+"]", s.Min, s.Max)
	}
	if best {
		out = "*" + out
	}
	return out
}

// WriteSVG draws the comparison at every speed, one horizontal bar per policy: the
// TTFT mean and p99 (lower is better) and the prefix hit rate against the oracle
// (higher is better), means over the draws.
func (rep *Report) WriteSVG(w io.Writer) error {
	speeds := rep.Speeds()
	n := len(rep.Stats(speeds[0]))
	const (
		labelW = 170
		panelW = 230
		gap    = 40
		rowH   = 22
		top    = 92
		block  = 30 // space for a speed's heading
	)
	width := labelW + 3*panelW + 2*gap + 30
	height := top + len(speeds)*(block+rowH*n) + 40
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="10" y="20" font-size="15" font-weight="bold">kvroute-replay: %s trace, %d requests, %d targets x %d-block caches, mean of %d draw(s)</text>`+"\n",
		html.EscapeString(rep.TraceKind), rep.Requests, rep.Fleet.Targets(), rep.Fleet.CacheTokens/rep.BlockTokens, max(1, rep.Draws))

	type panel struct {
		title  string
		value  func(PolicyStats) float64
		max    float64
		marks  []mark
		format string
	}
	maxMean, maxP99 := 1.0, 1.0
	for _, sp := range speeds {
		for _, st := range rep.Stats(sp) {
			maxMean = math.Max(maxMean, st.TTFTMean.Mean)
			maxP99 = math.Max(maxP99, st.TTFTP99.Mean)
		}
	}
	panels := []panel{
		{title: "TTFT mean, ms (lower is better)", value: func(s PolicyStats) float64 { return s.TTFTMean.Mean }, max: maxMean * 1.15, format: "%.0f"},
		{title: "TTFT p99, ms (lower is better)", value: func(s PolicyStats) float64 { return s.TTFTP99.Mean }, max: maxP99 * 1.15, format: "%.0f"},
		{title: "prefix hit rate (higher is better)", value: func(s PolicyStats) float64 { return s.Hit.Mean },
			max: math.Max(rep.OracleInfinite, 0.01) * 1.05, format: "%.3f",
			marks: []mark{{rep.OracleLRU, "oracle"}, {barOracleShare * rep.OracleLRU, "95%"}}},
	}
	bottom := height - 30
	for pi, p := range panels {
		x0 := labelW + pi*(panelW+gap)
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", x0, top-46, html.EscapeString(p.title))
		scale := func(v float64) float64 { return float64(x0) + float64(panelW)*math.Max(0, v)/p.max }
		// Reference lines carry their labels above the plot, staggered, where no bar
		// or value is drawn.
		for mi, m := range p.marks {
			if m.at <= 0 || m.at > p.max {
				continue
			}
			x := scale(m.at)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="10" fill="#d1242f" text-anchor="middle">%s</text>`+"\n",
				x, top-28+11*mi, html.EscapeString(m.label))
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#d1242f" stroke-dasharray="4 3"/>`+"\n",
				x, top-4, x, bottom)
		}
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#444"/>`+"\n", x0, top-4, x0, bottom)
	}
	y := top
	for _, sp := range speeds {
		fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="bold">speed x%g</text>`+"\n", y+18, sp)
		y += block
		for _, st := range rep.Stats(sp) {
			weight, color := "normal", "#9aa5b1"
			if st.KVRoute {
				weight, color = "bold", "#1f6feb"
			}
			fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="%s">%s</text>`+"\n", y+15, weight, html.EscapeString(st.Policy))
			for pi, p := range panels {
				x0 := labelW + pi*(panelW+gap)
				v := p.value(st)
				wBar := float64(panelW) * math.Max(0, v) / p.max
				fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x0, y+4, wBar, rowH-8, color)
				fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="11">%s</text>`+"\n", float64(x0)+wBar+4, y+15, fmt.Sprintf(p.format, v))
			}
			y += rowH
		}
	}
	if bars := rep.Bars(); len(bars) > 0 {
		pass, fail := 0, 0
		for _, bl := range bars {
			switch {
			case bl.NA:
			case bl.Pass:
				pass++
			default:
				fail++
			}
		}
		fmt.Fprintf(&b, `<text x="10" y="%d" font-size="11">%s</text>`+"\n", height-10, html.EscapeString(fmt.Sprintf(
			"bar (kvroute's TTFT mean and p99 the lowest, hit rate >= 95%% of the oracle, at each speed): %d met, %d not met", pass, fail)))
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
		fmt.Fprintf(&b, ",%s_target,%s_hits,%s_ttft_ms", name, name, name)
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
			ttft := 0.0
			if i < len(r.TTFTByIndex) {
				ttft = r.TTFTByIndex[i]
			}
			fmt.Fprintf(&b, ",%d,%d,%.0f", t, h, ttft)
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
