package main

import (
	"fmt"
	"math"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// trtUnderCap is TensorRT-LLM's ConversationRouter (baseline_trtllm.go) made to obey
// kvroute's fair-share cap: a target whose in-flight requests are at or
// above max(1, ceil(m × ceil((in flight + 1) / n))) takes no request unless every
// target is there. An implicit continuation whose server is at the cap goes to the
// least content-loaded target under it and its session follows; a new session is
// placed likewise. Everything else is the baseline's own rules. It answers one
// question: what the cap alone costs a policy that is otherwise TRT-LLM's.
type trtUnderCap struct {
	*trtllmConversation
	multiplier float64
}

func (p *trtUnderCap) Choose(r *Request, f *Fleet) int {
	active := 0
	for t := 0; t < f.N(); t++ {
		active += f.InFlight(t)
	}
	share := (active + 1 + f.N() - 1) / f.N()
	limit := max(1, int(math.Ceil(p.multiplier*float64(share))))
	open := func(t int) bool { return f.InFlight(t) < limit }
	anyOpen := false
	for t := 0; t < f.N(); t++ {
		anyOpen = anyOpen || open(t)
	}
	if !anyOpen {
		open = func(int) bool { return true }
	}
	hashes := r.Chain128
	weight := len(hashes) * p.tokensPerBlock
	if weight == 0 {
		weight = max(r.TextLen/5, 1)
	}
	id := p.findMatchingSession(hashes)
	server := -1
	if id != "" && open(p.sessions[id].server) {
		server = p.sessions[id].server
	} else {
		var tied []int
		for t := 0; t < f.N(); t++ {
			if !open(t) {
				continue
			}
			switch {
			case len(tied) == 0 || p.load[t] < p.load[tied[0]]:
				tied = append(tied[:0], t)
			case p.load[t] == p.load[tied[0]]:
				tied = append(tied, t)
			}
		}
		server = tied[p.rr%len(tied)]
		p.rr++
		if id == "" {
			p.implicit++
			id = fmt.Sprintf("conv_id:0_%d", p.implicit)
		}
	}
	p.updateSession(id, server, hashes)
	p.load[server] += weight
	p.weights[r.Index] = weight
	return server
}

// TestAnalysisCapCost replays the Mooncake trace through TensorRT-LLM's router with
// and without kvroute's fair-share cap, each from 8 round-robin starting points (the
// baseline's only tie-break), and GIE's scorers with 6 seeds: the spread a single run
// of each has, and what the cap at its default costs. Slow (about a minute on a
// shared machine): KVROUTE_ANALYSIS=1 go test ./cmd/kvroute-replay -run Analysis -v
func TestAnalysisCapCost(t *testing.T) {
	if os.Getenv("KVROUTE_ANALYSIS") == "" {
		t.Skip("set KVROUTE_ANALYSIS=1")
	}
	o, err := parseFlags([]string{"-trace", testTrace})
	require.NoError(t, err)
	reqs, _, err := loadTrace(o.trace, "auto", 0, o.charsPerToken, 1)
	require.NoError(t, err)
	oracle := OracleHitRate(reqs, o.fleet.CacheTokens/MooncakeBlockTokens*o.fleet.Targets())
	report := func(name string, runs []*Result) {
		lo, hi, sum, worst := 1.0, 0.0, 0.0, 0.0
		for _, r := range runs {
			h := r.HitRate()
			lo, hi, sum = math.Min(lo, h), math.Max(hi, h), sum+h
			worst = math.Max(worst, r.LoadImbalance())
		}
		mean := sum / float64(len(runs))
		fmt.Printf("%-34s hit rate mean %.4f (%.1f%% of the oracle), range %.4f-%.4f, in-flight max/mean up to %.3f\n",
			name, mean, 100*mean/oracle, lo, hi, worst)
	}
	trt := func(multiplier float64) []*Result {
		var runs []*Result
		for start := 0; start < 8; start++ {
			base := newTRTLLMConversation(o.fleet.Targets())
			base.rr = start
			var p Policy = base
			if multiplier > 0 {
				p = &trtUnderCap{trtllmConversation: base, multiplier: multiplier}
			}
			res, err := Replay(reqs, o.fleet, p)
			require.NoError(t, err)
			runs = append(runs, res)
		}
		return runs
	}
	plain := trt(0)
	report("TRT-LLM ConversationRouter", plain)
	// With a cap that never binds the wrapper is the baseline, run for run.
	for i, r := range trt(1000) {
		assert.Equal(t, plain[i].Choices, r.Choices, "round-robin start %d", i)
	}
	report("TRT-LLM rules + kvroute's cap, m=2", trt(2))
	report("TRT-LLM rules + kvroute's cap, m=3", trt(3))
	var gie []*Result
	for seed := uint64(1); seed <= 6; seed++ {
		res, err := Replay(reqs, o.fleet, newGIEDefaultScorers(o.fleet.Targets(), seed))
		require.NoError(t, err)
		gie = append(gie, res)
	}
	report("GIE default scorers", gie)
	fmt.Printf("oracle (one shared LRU) %.4f\n", oracle)
}
