package main

import (
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/routing"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

// httpContext follows one request: headers, maybe the body, the decision, the
// response status and the release of its load.
type httpContext struct {
	types.DefaultHttpContext
	plugin *pluginContext

	api        routing.API
	fleet      *routing.Fleet // the fleet that serves the request's model
	routed     bool           // a POST on a configured route: it will be (or was) decided
	decided    bool
	clientRank int
	requestID  string
	req        routing.Request
	decision   routing.Decision

	healthReported bool
	released       bool
	firstChunk     bool // the first response body chunk came back

	body            []byte // the buffered body, kept while an inline prefill runs
	prefillInFlight bool
	prefillReleased bool
	answered        bool // the filter answered the client itself (a prefill's reply)
	unparsable      bool // the body failed open
}

func (c *httpContext) OnHttpRequestHeaders(numHeaders int, endOfStream bool) (action types.Action) {
	action = types.ActionContinue
	defer c.plugin.recoverFailOpen("request headers", func() { action = types.ActionContinue })
	p := c.plugin
	cfg := &p.cfg
	// One host call reads every header; each is looked at once, here.
	headers := requestHeaders()
	var method, path, conversation, contentLength string
	convRank := len(cfg.Conversation.Headers)
	var stripped uint32 // bit i: owned header i was sent and is removed
	for {
		name, value, ok := headers.next()
		if !ok {
			break
		}
		r := p.roles.of(name)
		if r == nil {
			continue
		}
		switch {
		case r.method:
			method = value
		case r.path:
			path = value
		case r.requestID:
			c.requestID = value
		case r.contentLength:
			contentLength = value
		}
		for _, i := range r.owned {
			if stripped&(1<<i) == 0 && name == cfg.Headers.DPRank && cfg.TrustClientDPRank {
				if r, err := strconv.Atoi(strings.TrimSpace(value)); err == nil && r >= 0 {
					c.clientRank = r
				}
			}
			stripped |= 1 << i
			// Once per line: Envoy drops every line of the name at the first call, but
			// a host that drops one at a time must not leave a spoofed copy behind.
			_ = proxywasm.RemoveHttpRequestHeader(name)
		}
		if r.conversation >= 0 && r.conversation < convRank && value != "" {
			conversation, convRank = value, r.conversation // first configured header wins
		}
	}
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	api, ok := p.routes[path]
	if ok && method == "GET" && path == catalogueRoute && c.answerCatalogue() {
		return types.ActionPause
	}
	if method != "POST" || !ok {
		return types.ActionContinue
	}
	c.routed, c.api = true, api
	if conversation != "" {
		c.req.Conversation, c.req.HasConversation = routing.FingerprintString(conversation), true
	}
	if endOfStream {
		c.decide(nil)
		return types.ActionContinue
	}
	if n, err := strconv.ParseInt(contentLength, 10, 64); err == nil && n > cfg.MaxBodyBytes {
		// The client writes content-length: the estimate is bounded like any other.
		c.req.Tokens = int(min(n, routing.MaxRequestBytes) / int64(cfg.CharsPerToken))
		c.decide(nil)
		return types.ActionContinue
	}
	// Hold the headers until the body is in: the decision needs it.
	return types.ActionPause
}

func (c *httpContext) OnHttpRequestBody(bodySize int, endOfStream bool) (action types.Action) {
	action = types.ActionContinue
	defer c.plugin.recoverFailOpen("request body", func() { action = types.ActionContinue })
	if !c.routed || c.decided {
		return types.ActionContinue
	}
	cfg := &c.plugin.cfg
	if int64(bodySize) > cfg.MaxBodyBytes {
		// A body without content-length that outgrew the buffer: route by its size.
		c.req.Tokens = bodySize / cfg.CharsPerToken
		c.decide(nil)
		return types.ActionContinue
	}
	if !endOfStream {
		return types.ActionPause
	}
	if c.decide(requestBody(bodySize)) {
		return types.ActionPause // an inline prefill resumes the request
	}
	return types.ActionContinue
}

// decide extracts what the body tells, asks the router and writes the headers. It
// returns true when the request must wait for an inline prefill.
func (c *httpContext) decide(body []byte) (wait bool) {
	p := c.plugin
	cfg := &p.cfg
	c.decided = true
	started := time.Since(monotonicBase) // one clock read, where time.Now makes two
	defer func() {
		p.metrics.decisionTime.Record(uint64((time.Since(monotonicBase) - started).Microseconds()))
	}()
	if body != nil {
		// The VM decides one request at a time: one prompt buffer serves them all.
		c.req.Prompt = p.promptBuf[:0]
		defer func() { p.promptBuf, c.req.Prompt = c.req.Prompt[:0], nil }()
		if err := routing.Extract(c.api, body, p.extractOpt, &c.req); err != nil {
			// Fail open: Extract left no prompt, so this routes by load alone, and the
			// body is forwarded untouched (never rewritten for an inline prefill).
			p.metrics.parseErrors.Increment(1)
			c.unparsable = true
		}
	}
	switch {
	case c.requestID != "":
		c.req.Identity = routing.FingerprintString(c.requestID)
	case body != nil:
		// Envoy gives every request an x-request-id; without one, the body's head and
		// length seed the tie-break well enough, at a bounded cost.
		c.req.Identity = routing.Fingerprint(body[:min(len(body), 4096)]) ^ uint64(len(body))*0x9e3779b97f4a7c15
	default:
		c.req.Identity = c.req.Conversation
	}
	if !c.pickFleet() {
		return true // answered 404: nothing goes upstream
	}
	c.decision = c.fleet.Router.Decide(&c.req, c.clientRank)
	d := &c.decision
	m := p.metrics
	m.requestsRouted.add()
	m.decisions[d.Kind].add()
	c.countModelDecision(d.Kind)
	if body != nil && !c.unparsable {
		m.promptTokens.addN(c.req.Tokens)
		m.matchedTokens.addN(d.MatchedTokens)
	}
	if d.StateFailed {
		m.stateConflicts.Increment(1)
	}
	h := &cfg.Headers
	if d.Target.Address != "" { // "": the pool has no endpoint, Envoy picks
		_ = proxywasm.ReplaceHttpRequestHeader(h.Destination, d.Target.Address)
	}
	if d.Target.DPSize > 1 {
		_ = proxywasm.ReplaceHttpRequestHeader(h.DPRank, d.Target.RankText)
	}
	c.body = body
	wait = c.startPD(body)
	if h.Decision != "" {
		_ = proxywasm.ReplaceHttpRequestHeader(h.Decision, d.Header())
	}
	if !wait {
		c.body = nil
	}
	return wait
}

func (c *httpContext) OnHttpResponseHeaders(numHeaders int, endOfStream bool) (action types.Action) {
	action = types.ActionContinue
	defer c.plugin.recoverFailOpen("response headers", func() { action = types.ActionContinue })
	if !c.decided {
		return types.ActionContinue
	}
	code, _ := strconv.Atoi(responseStatus())
	// Envoy's flags are worth a host call only on a 5xx: an upstream failure it
	// answers locally (a reset, a refused connection) shows as one.
	c.reportHealth(c.isFailureStatus(code) || code >= 500 && upstreamFailed())
	if pd := c.pdMode(); pd != nil {
		pd.decodeAnswered(c)
	}
	return types.ActionContinue
}

// OnHttpResponseBody marks the end of the request's prefill at the first response
// body chunk: an engine streams its first chunk once the first token exists (and a
// whole answer only after it), while its response headers may come before the prefill
// has started (a streamed response's headers open the event stream at once).
func (c *httpContext) OnHttpResponseBody(bodySize int, endOfStream bool) (action types.Action) {
	action = types.ActionContinue
	if c.firstChunk || !c.decided || c.released {
		return types.ActionContinue
	}
	defer c.plugin.recoverFailOpen("response body", func() { action = types.ActionContinue })
	c.firstChunk = true
	if err := c.fleet.Router.FirstChunk(&c.decision.Ticket); err != nil {
		c.plugin.metrics.stateConflicts.Increment(1)
	}
	return types.ActionContinue
}

func (c *httpContext) isFailureStatus(code int) bool {
	for _, s := range c.plugin.cfg.Health.FailureStatuses {
		if s == code {
			return true
		}
	}
	return false
}

// reportHealth tells the health board how the target that served did, once.
func (c *httpContext) reportHealth(failed bool) {
	if c.healthReported || c.prefillInFlight || c.answered {
		return // a local reply while the prefill runs is not the decoder's doing
	}
	c.healthReported = true
	ejected, err := c.fleet.Router.ReportHealth(c.decision.Target, false, failed)
	if err != nil {
		c.plugin.metrics.stateConflicts.Increment(1)
	}
	if ejected {
		c.plugin.metrics.ejections.Increment(1)
		proxywasm.LogWarnf("kvroute: endpoint %s ejected", c.decision.Target.Address)
	}
}

func (c *httpContext) OnHttpStreamDone() {
	defer c.plugin.recoverFailOpen("stream done", nil)
	if !c.decided {
		return
	}
	if !c.healthReported && upstreamFailed() {
		c.reportHealth(true)
	}
	c.release()
	c.releasePrefill() // a client that left while the prefill ran
}

// release hands the request's load back, exactly once.
func (c *httpContext) release() {
	if c.released {
		return
	}
	c.released = true
	if !c.decision.Ticket.Valid {
		return
	}
	// The release joins the VM's batch; a batch that could not be written (CAS
	// retries spent, a host error) is kept and written at the next flush.
	if err := c.fleet.Router.Release(c.decision.Ticket); err != nil {
		c.plugin.metrics.stateConflicts.Increment(1)
	}
}

// monotonicBase anchors the decision timer: time.Since of it reads only the
// monotonic clock.
var monotonicBase = time.Now()

// Envoy's response flags (StreamInfo::CoreResponseFlag) that mean the upstream failed
// rather than the client: UpstreamRemoteReset, UpstreamConnectionFailure,
// UpstreamConnectionTermination.
const upstreamFailureFlags = 0x10 | 0x20 | 0x40

// upstreamFailed reads Envoy's response.flags attribute (8 bytes, little endian).
func upstreamFailed() bool {
	v, err := proxywasm.GetProperty([]string{"response", "flags"})
	if err != nil || len(v) < 8 {
		return false
	}
	var flags uint64
	for i := 7; i >= 0; i-- {
		flags = flags<<8 | uint64(v[i])
	}
	return flags&upstreamFailureFlags != 0
}
