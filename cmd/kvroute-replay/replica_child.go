package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
)

// A gateway replica: `kvroute-replay -replica -wasm W -config C [-endpoints N -dp D]`
// runs one compiled filter in its own host emulator (so its own VM and its own shared
// data: replicas share nothing, as separate Envoys) and serves the replica protocol
// (replica_proto.go) on stdin and stdout. The parent policy (replicas.go) starts one
// child per replica: only one host emulator may exist in a process.
//
// Engine metrics. With engine_metrics.enabled, the filter's tick sends a scrape
// callout per endpoint; the child asks the parent for the endpoint's page (an M
// message, answered from the parent's fleet model) and hands it to the filter as the
// callout's response. The guest's clock in the emulator is wazero's fake one: it
// moves 1 ms per reading, not with the replay (a few ms per request or tick, ~30×
// slower than replay time on the Mooncake trace), so on its own the filter would
// scrape every interval_ms *readings*. To keep engine_metrics.interval_ms and stale_ms
// in replay time, the child delivers extra timer ticks whenever interval_ms of replay
// time has passed since the filter last scraped, until the filter's own clock has
// reached its interval and it scrapes (at most interval_ms + 16 ticks: every tick
// reads the clock). The guest clock then keeps about the replay's pace, and the
// figures a decision sees are at most interval_ms of replay time old. The extra ticks
// otherwise only repeat the filter's periodic housekeeping (prefix-journal sync, the
// sweep of expired load), which with a single VM changes no decision.

// replicaMain runs a replica child on the process's stdin and stdout and returns the
// exit code. Everything else that would print to stdout goes to stderr: stdout
// carries the protocol only.
func replicaMain(args []string) int {
	out := os.Stdout
	os.Stdout = os.Stderr
	if err := runReplica(args, os.Stdin, out); err != nil {
		fmt.Fprintln(os.Stderr, "kvroute-replay -replica:", err)
		return 1
	}
	return 0
}

func runReplica(args []string, in io.Reader, out io.Writer) error {
	fs := flag.NewFlagSet("kvroute-replay -replica", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	wasmPath := fs.String("wasm", "build/kvroute.wasm", "compiled filter")
	configPath := fs.String("config", "", "kvroute config (its decode pool is replaced by the fleet)")
	var fc FleetConfig
	fs.IntVar(&fc.Endpoints, "endpoints", defaultEndpoints, "inference servers")
	fs.IntVar(&fc.DPSize, "dp", defaultDPSize, "data-parallel ranks per server")
	idSalt := fs.String("id-salt", "", "as the parent's -id-salt")
	if err := fs.Parse(args); err != nil {
		return err
	}
	fail := func(err error) error {
		// Tell the parent why before exiting: it is waiting for a reply.
		_ = newReplicaConn(nil, out).Send(&replicaMsg{Kind: "E", Text: err.Error()})
		return err
	}
	if fc.Endpoints < 1 || fc.DPSize < 1 {
		return fail(fmt.Errorf("-endpoints and -dp must be >= 1"))
	}
	wasm, err := os.ReadFile(*wasmPath)
	if err != nil {
		return fail(fmt.Errorf("%v (run `make build` first)", err))
	}
	config, err := replayConfig(*configPath, fc)
	if err != nil {
		return fail(err)
	}
	p, err := newKVRouteWasm(wasm, config, fc)
	if err != nil {
		return fail(err)
	}
	p.idSalt = *idSalt
	defer p.Close()
	return newReplicaServer(p, config, in, out).Serve()
}

// replicaServer is the child's loop over one kvrouteWasm.
type replicaServer struct {
	p     *kvrouteWasm
	conn  *replicaConn
	clock *Fleet // only its clock: the child has no fleet model

	engine     bool    // engine_metrics.enabled
	intervalMS float64 // engine_metrics.interval_ms, kept in replay time
	seen       int     // scrape callouts answered so far (the emulator keeps them all)
	lastScrape float64 // replay time of the last scrape answered; < 0 before the first
	err        error   // a protocol failure inside a tick, reported after the command

	stats replicaStats
}

// replicaStats is what a child reports on S: the filter's counters and the scrapes.
type replicaStats struct {
	Routed         uint64  `json:"routed"`
	Decisions      []Count `json:"decisions"`
	ActiveRequests uint64  `json:"active_requests"` // gauge; 0 once every request completed
	FailOpen       uint64  `json:"fail_open"`
	StateConflicts uint64  `json:"state_conflicts"`
	ParseErrors    uint64  `json:"parse_errors"`
	PD             string  `json:"pd"`
	Ticks          int     `json:"ticks"`        // ticks at the replay's tick period
	ExtraTicks     int     `json:"extra_ticks"`  // ticks delivered to bring a scrape on
	Scrapes        int     `json:"scrapes"`      // scrape callouts answered
	LateScrapes    int     `json:"late_scrapes"` // times the extra ticks brought no scrape
}

func newReplicaServer(p *kvrouteWasm, config []byte, in io.Reader, out io.Writer) *replicaServer {
	s := &replicaServer{p: p, conn: newReplicaConn(in, out), clock: &Fleet{}, lastScrape: -1}
	var doc struct {
		EngineMetrics struct {
			Enabled    bool    `json:"enabled"`
			IntervalMS float64 `json:"interval_ms"`
		} `json:"engine_metrics"`
	}
	_ = json.Unmarshal(config, &doc) // the filter accepted it: it is JSON
	s.engine = doc.EngineMetrics.Enabled
	s.intervalMS = doc.EngineMetrics.IntervalMS
	if s.intervalMS <= 0 {
		s.intervalMS = 1000 // engine_metrics.interval_ms's default
	}
	p.fleet = s.clock
	p.onTick = func() { s.answerScrapes() }
	return s
}

// Serve answers commands until the parent closes the stream (nil) or something fails
// (the error, also sent to the parent as E).
func (s *replicaServer) Serve() (err error) {
	defer func() {
		// A trap in the guest surfaces as a panic of the emulator.
		if r := recover(); r != nil {
			err = fmt.Errorf("the compiled filter crashed in the host emulator: %v", r)
			_ = s.conn.Send(&replicaMsg{Kind: "E", Text: err.Error()})
		}
	}()
	fail := func(err error) error {
		_ = s.conn.Send(&replicaMsg{Kind: "E", Text: err.Error()})
		return err
	}
	for {
		m, err := s.conn.Receive()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fail(err)
		}
		switch m.Kind {
		case "C":
			s.at(m.TimeMS)
			body := m.Body
			r := &Request{Index: m.Index, Path: m.Path, Headers: m.Headers, body: func() []byte { return body }}
			t := s.p.Choose(r, s.clock)
			if s.err != nil {
				return fail(s.err)
			}
			if s.p.err != nil {
				return fail(s.p.err)
			}
			if err := s.conn.Send(&replicaMsg{Kind: "T", Target: t, Text: s.p.kinds[m.Index]}); err != nil {
				return err
			}
		case "F":
			s.at(m.TimeMS)
			s.p.FirstToken(&Request{Index: m.Index}, 0)
			if s.err != nil {
				return fail(s.err)
			}
			if err := s.conn.Send(&replicaMsg{Kind: "ok"}); err != nil {
				return err
			}
		case "D":
			s.at(m.TimeMS)
			s.p.Done(&Request{Index: m.Index}, 0)
			if s.err != nil {
				return fail(s.err)
			}
			if err := s.conn.Send(&replicaMsg{Kind: "ok"}); err != nil {
				return err
			}
		case "S":
			st := s.Stats()
			if err := s.conn.Send(&replicaMsg{Kind: "S", Stats: &st}); err != nil {
				return err
			}
		default:
			return fail(fmt.Errorf("replica protocol: unexpected message %q from the parent", m.Kind))
		}
	}
}

// at brings the replica to replay time now: the clock, the timer ticks due (each
// followed by answering its scrapes) and, with engine metrics, a scrape if
// interval_ms of replay time has passed since the last one.
func (s *replicaServer) at(now float64) {
	s.clock.now = now
	s.p.tickTo(now)
	if !s.engine || s.err != nil || (s.lastScrape >= 0 && now-s.lastScrape < s.intervalMS) {
		return
	}
	limit := int(s.intervalMS) + 16
	for i := 0; i < limit; i++ {
		s.p.host.Tick()
		s.stats.ExtraTicks++
		if s.answerScrapes() > 0 || s.err != nil {
			return
		}
	}
	s.stats.LateScrapes++
	s.lastScrape = now // try again one interval later
}

// answerScrapes answers every scrape callout not answered yet with the endpoint's
// page from the parent, and returns how many it answered.
func (s *replicaServer) answerScrapes() int {
	all := s.p.host.GetCalloutAttributesFromContext(proxytest.PluginContextID)
	fresh := all[min(s.seen, len(all)):]
	s.seen = len(all)
	for _, c := range fresh {
		endpoint := ""
		for _, h := range c.Headers {
			if strings.EqualFold(h[0], headerDestination) {
				endpoint = h[1]
			}
		}
		page, err := s.page(endpoint)
		if err != nil {
			if s.err == nil {
				s.err = err
			}
			s.p.host.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "503"}}, nil, nil)
			continue
		}
		s.p.host.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}}, nil, page)
		s.stats.Scrapes++
	}
	if len(fresh) > 0 {
		s.lastScrape = s.clock.now
	}
	return len(fresh)
}

// page asks the parent for an endpoint's metrics page.
func (s *replicaServer) page(endpoint string) ([]byte, error) {
	if err := s.conn.Send(&replicaMsg{Kind: "M", Text: endpoint}); err != nil {
		return nil, err
	}
	m, err := s.conn.Receive()
	if err != nil {
		return nil, err
	}
	if m.Kind != "P" {
		return nil, fmt.Errorf("replica protocol: asked for the page of %s, got message %q", endpoint, m.Kind)
	}
	return m.Body, nil
}

// Stats reads the filter's counters.
func (s *replicaServer) Stats() replicaStats {
	st := s.stats
	p := s.p
	st.Routed = p.Counter("kvroute_requests_routed")
	st.Decisions = p.Decisions()
	st.ActiveRequests = p.Gauge("kvroute_active_requests")
	st.FailOpen = p.Counter("kvroute_fail_open")
	st.StateConflicts = p.Counter("kvroute_state_conflicts")
	st.ParseErrors = p.Counter("kvroute_parse_errors")
	st.PD = p.PDSplit()
	st.Ticks = p.ticks
	return st
}
