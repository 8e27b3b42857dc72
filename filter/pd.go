package main

import (
	"strconv"

	"github.com/kvroute/kvroute/routing"
	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/pdbody"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
)

// The prefill/decode flows (docs/behaviour.md, Prefill/decode disaggregation). Each
// disaggregation mode is one pdMode, in its own pd_<mode>.go; startPD runs once the
// decision is made and says whether the request must wait (an inline prefill is in
// flight).

// pdMode is one disaggregation mode: it builds the prefill leg, reads its answer and
// edits the decode leg.
type pdMode interface {
	// inline says whether the filter makes the prefill call itself from the request
	// body: then a request whose body is not buffered and readable is decoded directly.
	inline() bool
	// start builds and sends the prefill leg (or hands it to the decode leg) for a
	// disaggregated request, and says whether the request must wait for its answer.
	start(c *httpContext, body []byte) (wait bool)
	// prefillAnswered reads the answer of the prefill call (status 0: none came) and
	// edits and resumes the decode leg.
	prefillAnswered(c *httpContext, status int, answer []byte)
	// decodeAnswered runs when the decode leg's response headers arrive.
	decodeAnswered(c *httpContext)
}

// pdModes are the disaggregation modes by their disaggregation.mode name; off has none.
var pdModes = map[string]pdMode{
	config.ModeSidecar: sidecarMode{},
	config.ModeVLLM:    vllmMode{},
	config.ModeTRTLLM:  trtllmMode{},
	config.ModeSGLang:  sglangMode{},
}

// pdMode returns the disaggregation mode of the request's fleet; nil when it is off
// or no fleet was chosen (the request was not routed).
func (c *httpContext) pdMode() pdMode {
	// Off, the usual case, is told without the map: a lookup is a call in wasm.
	if c.fleet == nil || c.fleet.Config.Disaggregation.Mode == config.ModeOff {
		return nil
	}
	return pdModes[c.fleet.Config.Disaggregation.Mode]
}

// inlineMode is what the modes whose filter makes the prefill call share.
type inlineMode struct{}

func (inlineMode) inline() bool                { return true }
func (inlineMode) decodeAnswered(*httpContext) {}

// startPD runs the request's P/D step: it strips a client's P/D members, and starts
// or prepares the prefill the decision asks for. decide skips the call when the
// decision's PD is off and no P/D mode is configured: anything startPD comes to do in
// that case must change that test too.
func (c *httpContext) startPD(body []byte) (wait bool) {
	d := &c.decision
	mode := c.pdMode()
	m := c.plugin.metrics
	if mode != nil && body != nil && !c.unparsable {
		// In a P/D fleet only kvroute sets the engines' P/D members: a client's go.
		if stripped, changed := pdbody.StripPDFields(body); changed {
			c.replaceBody(stripped)
			body, c.body = stripped, stripped
		}
	}
	if d.PD == routing.PDDisaggregated && (body == nil || c.unparsable) && (mode == nil || mode.inline()) {
		// An inline prefill rewrites the body; a body that streams through unbuffered
		// (or none at all), or one that failed open, can only be decoded directly.
		c.releasePrefill()
		d.PD = routing.PDDirect
	}
	switch d.PD {
	case routing.PDDirect:
		m.pdDirect.add()
		return false
	case routing.PDDisaggregated:
		m.pdDisaggregated.add()
	default:
		return false
	}
	if mode == nil {
		return false
	}
	return mode.start(c, body)
}

// sendPrefill sends the prefill leg a mode built (see dispatchPrefill). It returns
// false, having fallen back to direct decode, when the mode could not build it (err)
// or the host refuses it.
func (c *httpContext) sendPrefill(body []byte, err error) bool {
	if err != nil {
		c.prefillFailed()
		return false
	}
	return c.dispatchPrefill(body)
}

// dispatchPrefill sends the prefill leg to disaggregation.prefill_cluster, with the
// prefill target in the destination (and rank) header and the request's x-request-id.
// Its answer goes to the mode's prefillAnswered. It returns false, having fallen back
// to direct decode, when the host refuses.
func (c *httpContext) dispatchPrefill(body []byte) bool {
	cfg := c.fleet.Config
	d := &c.decision
	path, _ := proxywasm.GetHttpRequestHeader(":path")
	headers := [][2]string{
		{":method", "POST"},
		{":path", path},
		{":authority", d.Prefill.Address},
		{"content-type", "application/json"},
		{"x-request-id", c.requestIdentity()},
		{cfg.Headers.Destination, d.Prefill.Address},
	}
	if d.Prefill.DPSize > 1 {
		headers = append(headers, [2]string{cfg.Headers.DPRank, d.Prefill.RankText})
	}
	timeout := uint32(cfg.Disaggregation.PrefillTimeoutMS)
	if _, err := proxywasm.DispatchHttpCall(cfg.Disaggregation.PrefillCluster, headers, body, nil, timeout, c.onPrefillAnswer); err != nil {
		proxywasm.LogWarnf("kvroute: prefill call to cluster %q failed: %v", cfg.Disaggregation.PrefillCluster, err)
		c.prefillFailed()
		return false
	}
	c.phase = phasePrefilling
	return true
}

// requestIdentity returns the request's x-request-id, making one (and sending it on
// the decode leg too) when the client and Envoy gave none, so both legs share it.
func (c *httpContext) requestIdentity() string {
	if c.requestID == "" {
		c.requestID = "kvroute-" + strconv.FormatUint(c.req.Identity, 16)
		replaceRequestHeader("x-request-id", c.requestID)
	}
	return c.requestID
}

// prefillResponse reads the prefill's status and body, releases the prefill load and
// reports the prefill endpoint's health. status 0 means no response (a timeout or a
// reset: Envoy calls back with no headers).
func (c *httpContext) prefillResponse(bodySize int) (status int, body []byte) {
	if c.phase == phasePrefilling { // not once the client has left
		c.phase = phaseDecided
	}
	c.releasePrefill()
	headers, _ := proxywasm.GetHttpCallResponseHeaders()
	for _, kv := range headers {
		if kv[0] == ":status" {
			status, _ = strconv.Atoi(kv[1])
		}
	}
	if bodySize > 0 {
		body, _ = proxywasm.GetHttpCallResponseBody(0, bodySize)
	}
	failed := status == 0 || status >= 500
	if ejected, err := c.fleet.Router.ReportHealth(c.decision.Prefill, true, failed); err == nil && ejected {
		c.plugin.metrics.ejections.Increment(1)
	}
	return status, body
}

// onPrefillAnswer is the prefill call's callback: it hands the answer to the mode.
func (c *httpContext) onPrefillAnswer(_, bodySize, _ int) {
	defer c.plugin.recoverFailOpen("prefill callback", resumeRequest)
	status, body := c.prefillResponse(bodySize)
	c.pdMode().prefillAnswered(c, status, body)
}

// prefillSucceeded handles what every inline answer that the decode leg builds on
// needs: a 4xx goes back to the client, anything else but a 2xx falls back to direct
// decode and resumes. It says whether the answer is a 2xx for the mode to use.
func (c *httpContext) prefillSucceeded(status int, body []byte) bool {
	if c.prefillRejected(status, body) {
		return false
	}
	if status/100 != 2 {
		c.prefillFailed()
		_ = proxywasm.ResumeHttpRequest()
		return false
	}
	return true
}

// prefillRejected sends a 4xx from the prefill back to the client, as it is.
func (c *httpContext) prefillRejected(status int, body []byte) bool {
	if status < 400 || status >= 500 {
		return false
	}
	c.answered = true
	_ = proxywasm.SendHttpResponse(uint32(status), [][2]string{{"content-type", "application/json"}}, body, -1)
	return true
}

// prefillFailed falls back to direct decode and says so in the decision
// header.
func (c *httpContext) prefillFailed() {
	c.plugin.metrics.pdPrefillFailure.Increment(1)
	c.releasePrefill()
	c.decision.PD = routing.PDDirect
	if h := c.plugin.cfg.Headers.Decision; h != "" {
		replaceRequestHeader(h, c.decision.Header())
	}
}

// replaceBody swaps the buffered request body and keeps content-length true to it.
func (c *httpContext) replaceBody(body []byte) {
	_ = proxywasm.ReplaceHttpRequestBody(body)
	replaceRequestHeader("content-length", strconv.Itoa(len(body)))
}

// releasePrefill hands the prefill load back, once.
func (c *httpContext) releasePrefill() {
	if c.prefillReleased {
		return
	}
	c.prefillReleased = true
	if !c.decision.PrefillTicket.Valid { // no prefill leg (nearly every request): nothing to hand back
		return
	}
	if err := c.fleet.Router.ReleasePrefill(c.decision.PrefillTicket); err != nil {
		c.plugin.metrics.stateConflicts.Increment(1)
	}
}

// resumeRequest lets a request paused for its prefill call go on, so that a fault
// in the call's callback does not stall it.
func resumeRequest() { _ = proxywasm.ResumeHttpRequest() }
