package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
)

// A scaled replay (-scale): the fleet starts with some endpoints and gains or loses
// endpoints at set times, always at its end (the newest leave first), so the targets
// in the fleet are always 0 … N−1. kvroute finds the fleet with discovery
// (pools.decode.discovery, source http): the host emulator answers the filter's poll
// with the endpoints in the fleet at that moment. It is compared with kvroute told of
// every change at the moment it happens (its poll forced at each step: a static
// configuration updated at once) and with the baselines, which always know the fleet.

// Schedule is a fleet's size over a replay.
type Schedule struct {
	Start int         // endpoints at the start
	Steps []ScaleStep // in time order
}

// ScaleStep is one change of the fleet's size.
type ScaleStep struct {
	AtMS      float64 // replay time
	Endpoints int     // endpoints in the fleet from AtMS on
}

// scaleSpec is -scale as written: "start=4,at=50%:+4,at=600s:-2". A time is a share
// of the replay's duration (50%), seconds (600s) or milliseconds (600000).
type scaleSpec struct {
	start int
	steps []scaleSpecStep
}

type scaleSpecStep struct {
	at      float64
	percent bool
	delta   int
}

func parseScale(s string) (*scaleSpec, error) {
	sp := &scaleSpec{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		key, val, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("-scale: %q is not start=N or at=T:±M", item)
		}
		switch key {
		case "start":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("-scale: start=%q is not a count of endpoints", val)
			}
			sp.start = n
		case "at":
			when, delta, ok := strings.Cut(val, ":")
			d, err := strconv.Atoi(delta)
			if !ok || err != nil || d == 0 || (delta[0] != '+' && delta[0] != '-') {
				return nil, fmt.Errorf("-scale: at=%q: want T:+M or T:-M", val)
			}
			st := scaleSpecStep{delta: d}
			unit := 1.0
			switch {
			case strings.HasSuffix(when, "%"):
				st.percent, when = true, strings.TrimSuffix(when, "%")
			case strings.HasSuffix(when, "ms"):
				when = strings.TrimSuffix(when, "ms")
			case strings.HasSuffix(when, "s"):
				unit, when = 1000, strings.TrimSuffix(when, "s")
			}
			v, err := strconv.ParseFloat(when, 64)
			if err != nil || v < 0 || (st.percent && v > 100) {
				return nil, fmt.Errorf("-scale: at=%q: the time is not 0–100%%, seconds (600s) or ms", val)
			}
			st.at = v * unit
			sp.steps = append(sp.steps, st)
		default:
			return nil, fmt.Errorf("-scale: unknown key %q (start, at)", key)
		}
	}
	if sp.start < 1 {
		return nil, fmt.Errorf("-scale: start= must be >= 1")
	}
	if len(sp.steps) == 0 {
		return nil, fmt.Errorf("-scale: no at= step")
	}
	return sp, nil
}

// resolve places the steps in a replay of durationMS and checks the fleet never
// shrinks below one endpoint.
func (sp *scaleSpec) resolve(durationMS float64) (*Schedule, error) {
	steps := append([]scaleSpecStep(nil), sp.steps...)
	for i := range steps {
		if steps[i].percent {
			steps[i].at = steps[i].at / 100 * durationMS
		}
	}
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].at < steps[j].at })
	s := &Schedule{Start: sp.start}
	n := sp.start
	for _, st := range steps {
		n += st.delta
		if n < 1 {
			return nil, fmt.Errorf("-scale: the fleet shrinks to %d endpoints at %.0f ms", n, st.at)
		}
		s.Steps = append(s.Steps, ScaleStep{AtMS: st.at, Endpoints: n})
	}
	return s, nil
}

// Max is the most endpoints the fleet ever has: the fleet model's size.
func (s *Schedule) Max() int {
	m := s.Start
	for _, st := range s.Steps {
		m = max(m, st.Endpoints)
	}
	return m
}

// At is the number of endpoints in the fleet at replay time now.
func (s *Schedule) At(now float64) int {
	n := s.Start
	for _, st := range s.Steps {
		if st.AtMS <= now {
			n = st.Endpoints
		}
	}
	return n
}

// discoveryPath and discoveryCluster are where the scaled replay's kvroute polls.
const (
	discoveryCluster = "kvroute_discovery"
	discoveryPath    = "/endpoints"
)

// discoveryConfig is config with its decode pool discovered (no static endpoint)
// every intervalMS.
func discoveryConfig(config []byte, cfg FleetConfig, intervalMS int) ([]byte, error) {
	var doc map[string]any
	if err := json.Unmarshal(config, &doc); err != nil {
		return nil, err
	}
	pools := doc["pools"].(map[string]any)
	pools["decode"] = map[string]any{"discovery": map[string]any{
		"source": "http", "cluster": discoveryCluster, "path": discoveryPath,
		"interval_ms": intervalMS, "dp_size": cfg.DPSize,
	}}
	return json.Marshal(doc)
}

// discoveryHost answers the filter's discovery polls with the fleet of the schedule
// at the moment. The guest's clock in the emulator moves 1 ms per reading, not with
// the replay (replica_child.go says more), so, as the replica child does for engine
// scrapes, extra timer ticks are delivered whenever interval_ms of replay time has
// passed since the last poll, until the filter's own clock reaches its interval and
// it polls: the polls then follow the replay's clock. With instant set, the poll is
// forced at each step instead, and the filter knows the fleet as it changes.
type discoveryHost struct {
	p          *kvrouteWasm
	cfg        FleetConfig
	sched      *Schedule
	intervalMS float64
	instant    bool

	lastPoll float64 // replay time of the last answered poll; < 0 before the first
	nextStep int     // instant: the first step not yet published
	seen     int     // callouts already answered
	now      float64

	Polls, ExtraTicks, LatePolls int
	PollAt                       []float64 // replay time of each answered poll
}

// body is the endpoint list at replay time now, in the http source's shape.
func (d *discoveryHost) body(now float64) []byte {
	var b strings.Builder
	b.WriteString(`{"endpoints":[`)
	for e := 0; e < d.sched.At(now); e++ {
		if e > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"address":%q,"dp_size":%d}`, d.cfg.Address(e), d.cfg.DPSize)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// answer answers every discovery callout not answered yet, and returns how many.
func (d *discoveryHost) answer() int {
	all := d.p.host.GetCalloutAttributesFromContext(proxytest.PluginContextID)
	fresh := all[min(d.seen, len(all)):]
	d.seen = len(all)
	for _, c := range fresh {
		d.p.host.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}, {"content-type", "application/json"}}, nil, d.body(d.now))
		d.Polls++
		d.PollAt = append(d.PollAt, d.now)
	}
	if len(fresh) > 0 {
		d.lastPoll = d.now
	}
	return len(fresh)
}

// at brings discovery to replay time now: a poll if one is due.
func (d *discoveryHost) at(now float64) {
	d.now = now
	d.answer()
	due := d.lastPoll < 0 || (!d.instant && now-d.lastPoll >= d.intervalMS)
	if d.instant {
		for d.nextStep < len(d.sched.Steps) && d.sched.Steps[d.nextStep].AtMS <= now {
			d.nextStep++
			due = true
		}
	}
	if !due {
		return
	}
	for i := 0; i < int(d.intervalMS)+16; i++ {
		d.p.host.Tick()
		d.ExtraTicks++
		if d.answer() > 0 {
			return
		}
	}
	d.LatePolls++
	d.lastPoll = now // try again one interval later
}

// scaleRow is one policy's replay of a scaled fleet.
type scaleRow struct {
	Name string
	Res  *Result
	Disc *discoveryHost // kvroute with discovery
}

// replayKVRouteScaled replays reqs through the compiled filter on a scaled fleet.
// discover: the filter polls every intervalMS (or, with instant, at each step);
// otherwise it keeps config's static endpoints.
func replayKVRouteScaled(reqs []*Request, fleet FleetConfig, sched *Schedule, wasm, config []byte, idSalt string,
	discover, instant bool, intervalMS int) (res *Result, d *discoveryHost, err error) {
	p, err := newKVRouteWasm(wasm, config, fleet)
	if err != nil {
		return nil, nil, err
	}
	p.idSalt = idSalt
	defer p.Close()
	defer func() {
		if r := recover(); r != nil {
			res, err = nil, fmt.Errorf("the compiled filter crashed in the host emulator after %d requests: %v", len(p.kinds), r)
		}
	}()
	if discover {
		d = &discoveryHost{p: p, cfg: fleet, sched: sched, intervalMS: float64(intervalMS), instant: instant, lastPoll: -1}
		p.disc = d
		d.at(0) // the gateway found its fleet before the first request
	}
	res, err = ReplayScaled(reqs, fleet, p, sched)
	if err != nil {
		return nil, nil, err
	}
	if p.err != nil {
		return nil, nil, p.err
	}
	res.Decisions = p.Decisions()
	res.Kinds = p.kinds
	res.Ticks = p.ticks
	if routed := p.Counter("kvroute_requests_routed"); routed != uint64(len(reqs)) {
		return nil, nil, fmt.Errorf("kvroute routed %d of %d requests", routed, len(reqs))
	}
	if n := p.Gauge("kvroute_active_requests"); n != 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("kvroute_active_requests is %d after every request completed", n))
	}
	for _, c := range []string{"kvroute_state_conflicts", "kvroute_fail_open", "kvroute_discovery_failures"} {
		if n := p.Counter(c); n != 0 {
			res.Notes = append(res.Notes, fmt.Sprintf("%s = %d during the replay", c, n))
		}
	}
	return res, d, nil
}

// runScale replays every selected policy on the scaled fleet, draw after draw, and
// writes the comparison.
func runScale(o *options, w io.Writer) error {
	wantKV, baselines, err := selectPolicies(o.policies)
	if err != nil {
		return err
	}
	reqs, _, err := loadTrace(o.trace, o.format, o.limit, o.charsPerToken, 1)
	if err != nil {
		return err
	}
	reqs = atSpeed(reqs, o.speed)
	if wantKV && o.draws > 1 {
		keepBodies(reqs)
	}
	sched, err := o.scale.resolve(reqs[len(reqs)-1].ArrivalMS)
	if err != nil {
		return err
	}
	fleet := o.fleet
	fleet.Endpoints = sched.Max()
	var wasm, static, discovered []byte
	if wantKV {
		if wasm, err = os.ReadFile(o.wasm); err != nil {
			return fmt.Errorf("%v (run `make build` first)", err)
		}
		startFleet := fleet
		startFleet.Endpoints = sched.Start
		if static, err = replayConfig(o.config, startFleet); err != nil {
			return err
		}
		if discovered, err = discoveryConfig(static, fleet, o.scaleInterval); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "scaled fleet: %d endpoints × dp %d at the start", sched.Start, fleet.DPSize)
	for _, st := range sched.Steps {
		fmt.Fprintf(w, ", %d from %.1f s", st.Endpoints, st.AtMS/1000)
	}
	fmt.Fprintf(w, "; %d requests over %.1f s (speed x%g); window %.0f s after each step\n",
		len(reqs), reqs[len(reqs)-1].ArrivalMS/1000, o.speed, o.scaleWindowMS/1000)
	for draw := 0; draw < o.draws; draw++ {
		var rows []scaleRow
		if wantKV {
			salt := drawSalt(o.idSalt, draw)
			for _, v := range []struct {
				name              string
				config            []byte
				discover, instant bool
			}{
				{fmt.Sprintf("kvroute discovery %d ms", o.scaleInterval), discovered, true, false},
				{"kvroute told at once", discovered, true, true},
				{"kvroute static (start pods)", static, false, false},
			} {
				res, d, err := replayKVRouteScaled(reqs, fleet, sched, wasm, v.config, salt, v.discover, v.instant, o.scaleInterval)
				if err != nil {
					return fmt.Errorf("%s: %v", v.name, err)
				}
				rows = append(rows, scaleRow{Name: v.name, Res: res, Disc: d})
			}
		}
		for _, name := range baselines {
			res, err := ReplayScaled(reqs, fleet, newBaseline(name, fleet, o.seed, draw), sched)
			if err != nil {
				return err
			}
			rows = append(rows, scaleRow{Name: name, Res: res})
		}
		writeScaleTable(w, draw, reqs, fleet, sched, o.scaleWindowMS, rows)
	}
	return nil
}

// windowStats are the requests arriving in a span of replay time.
type windowStats struct {
	n             int
	hit, total    int64
	ttftMean, p99 float64
}

func statsOf(reqs []*Request, res *Result, from, to float64) windowStats {
	var s windowStats
	var ttft []float64
	for _, r := range reqs {
		if r.ArrivalMS < from || r.ArrivalMS >= to {
			continue
		}
		s.n++
		s.hit += int64(res.Hits[r.Index])
		s.total += int64(len(r.Blocks))
		ttft = append(ttft, res.TTFTByIndex[r.Index])
	}
	if len(ttft) == 0 {
		return s
	}
	sort.Float64s(ttft)
	sum := 0.0
	for _, v := range ttft {
		sum += v
	}
	s.ttftMean = sum / float64(len(ttft))
	s.p99 = ttft[min(max(int(math.Ceil(0.99*float64(len(ttft))))-1, 0), len(ttft)-1)]
	return s
}

// joinLag is how long after the first step that adds endpoints a policy first sent
// a request to one of them (ms; −1: never), and how many requests went to targets
// before they joined (must be 0).
func joinLag(reqs []*Request, res *Result, fleet FleetConfig, sched *Schedule) (lag float64, early int) {
	lag = -1
	prev := sched.Start
	for _, st := range sched.Steps {
		if st.Endpoints > prev {
			for _, r := range reqs {
				t := res.Choices[r.Index]
				joining := t >= prev*fleet.DPSize && t < st.Endpoints*fleet.DPSize
				if joining && r.ArrivalMS < st.AtMS {
					early++
				}
				if joining && r.ArrivalMS >= st.AtMS && lag < 0 {
					lag = r.ArrivalMS - st.AtMS
				}
			}
			return lag, early
		}
		prev = st.Endpoints
	}
	return lag, early
}

func writeScaleTable(w io.Writer, draw int, reqs []*Request, fleet FleetConfig, sched *Schedule, windowMS float64, rows []scaleRow) {
	t := sched.Steps[0].AtMS
	end := math.Inf(1)
	spans := []struct {
		name     string
		from, to float64
	}{{"before", 0, t}, {"window", t, t + windowMS}, {"after", t + windowMS, end}}
	fmt.Fprintf(w, "\ndraw %d: spans by arrival — before: [0, %.1f s), window: [%.1f s, %.1f s), after: the rest\n",
		draw, t/1000, t/1000, (t+windowMS)/1000)
	fmt.Fprintf(w, "%-30s", "policy")
	for _, s := range spans {
		fmt.Fprintf(w, " | %-6s hit  ttft mean   p99", s.name)
	}
	fmt.Fprintf(w, " | first to new | departed | polls\n")
	for _, row := range rows {
		fmt.Fprintf(w, "%-30s", row.Name)
		for _, s := range spans {
			st := statsOf(reqs, row.Res, s.from, s.to)
			fmt.Fprintf(w, " | %10.3f %9.0f %6.0f", ratio(float64(st.hit), float64(st.total)), st.ttftMean, st.p99)
		}
		lag, early := joinLag(reqs, row.Res, fleet, sched)
		lagText := "never"
		if lag >= 0 {
			lagText = fmt.Sprintf("%.0f ms", lag)
		}
		if early > 0 {
			lagText += fmt.Sprintf(" (%d early!)", early)
		}
		polls := "-"
		if row.Disc != nil {
			polls = strconv.Itoa(row.Disc.Polls)
			if row.Disc.LatePolls > 0 {
				polls += fmt.Sprintf(" (%d late)", row.Disc.LatePolls)
			}
		}
		fmt.Fprintf(w, " | %12s | %8d | %s\n", lagText, row.Res.Departed, polls)
		for _, n := range row.Res.Notes {
			fmt.Fprintf(w, "  note: %s\n", n)
		}
	}
}
