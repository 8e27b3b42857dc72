package main

import (
	"encoding/binary"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/kvroute/kvroute/routing"
	"github.com/kvroute/kvroute/routing/extract"
	"github.com/kvroute/kvroute/routing/hashx"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

// httpContext follows one request through its phases: headers, maybe the body, the
// decision, maybe an inline prefill, the response and the release of its load.
type httpContext struct {
	types.DefaultHttpContext
	plugin *pluginContext // the plugin (config, router fleets, metrics) the request runs in

	phase      phase            // where the request is in its life
	api        extract.API      // the API of the route the request came in on
	fleet      *routing.Fleet   // the fleet that serves the request's model
	clientRank int              // the DP rank a trusted client asked for; routing.NoRank if none
	requestID  string           // the request's x-request-id ("" until one is known)
	req        extract.Request  // what the router is told about the request
	decision   routing.Decision // the router's answer, with the load tickets to hand back
	body       []byte           // the buffered body, kept while an inline prefill runs
	head       requestHead      // what the headers told (a local would be zeroed by memory.fill)

	unparsable      bool // the body failed open: routed by load, forwarded untouched
	answered        bool // the filter answered the client itself (a 404, a prefill's reply)
	firstChunk      bool // the first response body chunk came back: the prefill is over
	healthReported  bool // the target that served has been reported to the health board
	prefillReleased bool // the prefill load was handed back (it is handed back once)
}

// phase is where a request is in its life. It only moves forward, but for an answered
// prefill, which takes the request from phasePrefilling back to phaseDecided.
type phase uint8

const (
	// phaseHeaders: the request headers are not read yet, or the request is not one
	// kvroute routes (it passes untouched).
	phaseHeaders phase = iota
	// phaseAwaitingBody: a POST on a configured route whose headers are held until
	// its body is in.
	phaseAwaitingBody
	// phaseDecided: the body is read (or will not be) and the request decided: its
	// target is in the headers, or the filter answered it (a model no fleet serves).
	phaseDecided
	// phasePrefilling: decided, and the request waits for its inline prefill call.
	phasePrefilling
	// phaseReleased: the stream is done and the request's load is handed back.
	phaseReleased
)

// decided says whether the request is past its decision (in phaseDecided or later).
func (p phase) decided() bool { return p >= phaseDecided }

func (c *httpContext) OnHttpRequestHeaders(numHeaders int, endOfStream bool) (action types.Action) {
	action = types.ActionContinue
	defer func() {
		if r := recover(); r != nil { // as recoverFailOpen
			c.plugin.failedOpen("request headers", r)
			action = types.ActionContinue
		}
	}()
	h := c.readRequestHeaders(requestHeaderMap())
	route := c.plugin.routes.find(h.values[headPath])
	api, ok := extract.API(route), route >= 0
	method := h.values[headMethod]
	if ok && method == "GET" && h.values[headPath] == catalogueRoute && c.answerCatalogue() {
		return types.ActionPause
	}
	if method != "POST" || !ok {
		return types.ActionContinue
	}
	c.phase, c.api = phaseAwaitingBody, api
	if h.conversation != "" {
		c.req.Conversation, c.req.HasConversation = hashx.FingerprintString(h.conversation), true
	}
	if c.decidedByHeaders(h.values[headContentLength], endOfStream) {
		c.decide(nil)
		return types.ActionContinue
	}
	// Hold the headers until the body is in: the decision needs it.
	return types.ActionPause
}

// requestHead is what the request headers tell before the route is known.
type requestHead struct {
	values       [headFields]string // by headField; the path without its query
	conversation string             // the first configured conversation header sent, "" if none
	convRank     int                // conversation's rank in conversation.headers
	stripped     uint32             // bit i: owned header i was sent and is removed
}

// readRequestHeaders reads the request headers (their serialized map, in one host
// call) into c.head, looks at each once, takes the request id and a trusted client's
// DP rank, and strips the headers kvroute owns so that no client can spoof them.
//
// It walks the ABI's serialized map in place — a count, the lengths of each name and
// value, then the names and values, each followed by a NUL — and stops at the first
// pair that does not fit. The strings point into the host's buffer. In wasm each
// jump and each call is dear, so the common header is a lookup and a store: the
// value goes to the field its role names (none for most), and only owned and
// conversation headers go out of line.
func (c *httpContext) readRequestHeaders(m []byte) *requestHead {
	p := c.plugin
	h := &c.head
	h.convRank = len(p.cfg.Conversation.Headers)
	if len(m) < 4 {
		return h
	}
	n := int(binary.LittleEndian.Uint32(m))
	if 4+8*n > len(m) {
		return h
	}
	sizes, data := m[4:4+8*n], m[4+8*n:]
	for ; len(sizes) >= 8; sizes = sizes[8:] {
		nl := int(binary.LittleEndian.Uint32(sizes))
		vl := int(binary.LittleEndian.Uint32(sizes[4:8]))
		if nl+1+vl > len(data) {
			break
		}
		name := unsafe.String(unsafe.SliceData(data), nl)
		value := unsafe.String(unsafe.SliceData(data[nl+1:]), vl)
		data = data[min(nl+1+vl+1, len(data)):]
		r := p.roles.of(name)
		h.values[r.field] = value
		if r.special {
			c.specialHeader(h, r, name, value)
		}
	}
	c.requestID = h.values[headRequestID]
	if i := strings.IndexByte(h.values[headPath], '?'); i >= 0 {
		h.values[headPath] = h.values[headPath][:i]
	}
	return h
}

// specialHeader takes an owned header (stripped, and a trusted client's DP rank read
// from it) or a conversation header (the first configured one sent wins).
func (c *httpContext) specialHeader(h *requestHead, r *headerRole, name, value string) {
	cfg := &c.plugin.cfg
	for _, i := range r.owned {
		if h.stripped&(1<<i) == 0 && name == cfg.Headers.DPRank && cfg.TrustClientDPRank {
			if r, err := strconv.Atoi(strings.TrimSpace(value)); err == nil && r >= 0 {
				c.clientRank = r
			}
		}
		h.stripped |= 1 << i
		// Once per line: Envoy drops every line of the name at the first call, but
		// a host that drops one at a time must not leave a spoofed copy behind.
		_ = proxywasm.RemoveHttpRequestHeader(name)
	}
	if r.conversation >= 0 && r.conversation < h.convRank && value != "" {
		h.conversation, h.convRank = value, r.conversation
	}
}

// decidedByHeaders says whether a routed request is decided without its body: it has
// none, or its content-length says the body outgrows max_body_bytes, and then the
// length, bounded like any other estimate, gives its tokens.
func (c *httpContext) decidedByHeaders(contentLength string, endOfStream bool) bool {
	if endOfStream {
		return true
	}
	cfg := &c.plugin.cfg
	if n, ok := parseInt(contentLength); ok && n > cfg.MaxBodyBytes {
		c.req.Tokens = int(min(n, routing.MaxRequestBytes) / int64(cfg.CharsPerToken))
		return true
	}
	return false
}

// parseInt is strconv.ParseInt(s, 10, 64), ok when it has no error. The plain
// decimals headers carry are read here, as strconv is costly in wasm; anything else
// goes to strconv.
func parseInt(s string) (int64, bool) {
	if len(s) == 0 || len(s) > 18 { // 18 digits cannot overflow
		n, err := strconv.ParseInt(s, 10, 64)
		return n, err == nil
	}
	var n int64
	for i := 0; i < len(s); i++ {
		d := s[i] - '0'
		if d > 9 { // a sign, a space, anything else: strconv says
			n, err := strconv.ParseInt(s, 10, 64)
			return n, err == nil
		}
		n = n*10 + int64(d)
	}
	return n, true
}

func (c *httpContext) OnHttpRequestBody(bodySize int, endOfStream bool) (action types.Action) {
	action = types.ActionContinue
	defer func() {
		if r := recover(); r != nil { // as recoverFailOpen
			c.plugin.failedOpen("request body", r)
			action = types.ActionContinue
		}
	}()
	if c.phase != phaseAwaitingBody {
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
	c.phase = phaseDecided
	if p.metrics.timeDecision() {
		started := time.Since(monotonicBase) // one clock read, where time.Now makes two
		defer func() {
			p.metrics.decisionTime.Record(uint64((time.Since(monotonicBase) - started).Microseconds()))
		}()
	}
	if body != nil {
		// The VM decides one request at a time: one prompt buffer serves them all.
		c.req.Prompt = p.promptBuf[:0]
		defer func() { p.promptBuf, c.req.Prompt = c.req.Prompt[:0], nil }()
		if err := extract.Extract(c.api, body, p.extractOpt, &c.req); err != nil {
			// Fail open: Extract left no prompt, so this routes by load alone, and the
			// body is forwarded untouched (never rewritten for an inline prefill).
			p.metrics.parseErrors.Increment(1)
			c.unparsable = true
		}
	}
	switch {
	case c.requestID != "":
		c.req.Identity = hashx.FingerprintString(c.requestID)
	case body != nil:
		// Envoy gives every request an x-request-id; without one, the body's head and
		// length seed the tie-break well enough, at a bounded cost.
		c.req.Identity = hashx.Fingerprint(body[:min(len(body), 4096)]) ^ uint64(len(body))*0x9e3779b97f4a7c15
	default:
		c.req.Identity = c.req.Conversation
	}
	if !c.pickFleet() {
		return true // answered 404: nothing goes upstream
	}
	c.fleet.Router.DecideInto(&c.decision, &c.req, c.clientRank) // still zero: decide runs once
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
		replaceRequestHeader(h.Destination, d.Target.Address)
	}
	if d.Target.DPSize > 1 {
		replaceRequestHeader(h.DPRank, d.Target.RankText)
	}
	c.body = body
	if d.PD != routing.PDOff || c.pdMode() != nil { // else startPD has nothing to do: spare the call
		wait = c.startPD(body)
	}
	if h.Decision != "" {
		replaceRequestHeader(h.Decision, d.Header())
	}
	if !wait {
		c.body = nil
	}
	return wait
}

func (c *httpContext) OnHttpResponseHeaders(numHeaders int, endOfStream bool) (action types.Action) {
	action = types.ActionContinue
	defer func() {
		if r := recover(); r != nil { // as recoverFailOpen
			c.plugin.failedOpen("response headers", r)
			action = types.ActionContinue
		}
	}()
	if !c.phase.decided() {
		return types.ActionContinue
	}
	status, _ := parseInt(responseStatus()) // as strconv.Atoi: int is 64 bits in wasm
	code := int(status)
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
	if c.firstChunk || !c.phase.decided() || c.phase == phaseReleased {
		return types.ActionContinue
	}
	defer func() {
		if r := recover(); r != nil { // as recoverFailOpen
			c.plugin.failedOpen("response body", r)
			action = types.ActionContinue
		}
	}()
	c.firstChunk = true
	if err := c.fleet.Router.FirstChunk(&c.decision.Ticket); err != nil {
		c.plugin.metrics.stateConflicts.Increment(1)
	}
	if endOfStream {
		// A body that ends at its first chunk was not streamed: how long its reply
		// decoded is unknown, not nothing.
		c.decision.Ticket.ChunkMS = 0
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
	if c.healthReported || c.phase == phasePrefilling || c.answered {
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
	defer func() {
		if r := recover(); r != nil { // as recoverFailOpen
			c.plugin.failedOpen("stream done", r)
		}
	}()
	if !c.phase.decided() {
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
	if c.phase == phaseReleased {
		return
	}
	c.phase = phaseReleased
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
