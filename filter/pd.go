package main

import (
	"strconv"

	"github.com/kvroute/kvroute/routing"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
)

// The prefill/decode flows (docs/behaviour.md, Prefill/decode disaggregation). startPD
// runs once the decision is made and says whether the request must wait (an inline prefill
// is in flight).

func (c *httpContext) startPD(body []byte) (wait bool) {
	d := &c.decision
	cfg := &c.plugin.cfg
	m := c.plugin.metrics
	if body != nil && !c.unparsable && cfg.Disaggregation.Mode != routing.ModeOff {
		// In a P/D fleet only kvroute sets the engines' P/D members: a client's go.
		if stripped, changed := routing.StripPDFields(body); changed {
			c.replaceBody(stripped)
			body, c.body = stripped, stripped
		}
	}
	if d.PD == routing.PDDisaggregated && (body == nil || c.unparsable) && cfg.Disaggregation.Mode != routing.ModeSidecar {
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
	h := &cfg.Headers
	switch cfg.Disaggregation.Mode {
	case routing.ModeSidecar:
		_ = proxywasm.ReplaceHttpRequestHeader(h.PrefillDestination, d.Prefill.Address)
		if d.Prefill.DPSize > 1 {
			_ = proxywasm.ReplaceHttpRequestHeader(h.PrefillDPRank, d.Prefill.RankText)
		}
		return false
	case routing.ModeVLLM:
		prefillBody, err := routing.VLLMPrefillBody(body)
		if err != nil {
			c.prefillFailed()
			return false
		}
		return c.dispatchPrefill(prefillBody, c.onVLLMPrefill)
	case routing.ModeTRTLLM:
		prefillBody, err := routing.TRTLLMContextBody(body)
		if err != nil {
			c.prefillFailed()
			return false
		}
		return c.dispatchPrefill(prefillBody, c.onTRTLLMContext)
	case routing.ModeSGLang:
		room := routing.BootstrapRoom(c.req.Identity)
		both, err := routing.SGLangBootstrapBody(body, routing.HostOfAddress(d.Prefill.Address), d.Prefill.BootstrapPort, room)
		if err != nil {
			c.prefillFailed()
			return false
		}
		// The same body goes to both at once: the prefill's answer is only drained.
		if c.dispatchPrefill(both, c.onSGLangPrefill) {
			c.replaceBody(both)
		}
		return false
	}
	return false
}

// dispatchPrefill sends the prefill leg to disaggregation.prefill_cluster, with the
// prefill target in the destination (and rank) header and the request's x-request-id.
// It returns false, having fallen back to direct decode, when the host refuses.
func (c *httpContext) dispatchPrefill(body []byte, onResponse func(int, int, int)) bool {
	cfg := &c.plugin.cfg
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
	if _, err := proxywasm.DispatchHttpCall(cfg.Disaggregation.PrefillCluster, headers, body, nil, timeout, onResponse); err != nil {
		proxywasm.LogWarnf("kvroute: prefill call to cluster %q failed: %v", cfg.Disaggregation.PrefillCluster, err)
		c.prefillFailed()
		return false
	}
	c.prefillInFlight = true
	return true
}

// requestIdentity returns the request's x-request-id, making one (and sending it on
// the decode leg too) when the client and Envoy gave none, so both legs share it.
func (c *httpContext) requestIdentity() string {
	if c.requestID == "" {
		c.requestID = "kvroute-" + strconv.FormatUint(c.req.Identity, 16)
		_ = proxywasm.ReplaceHttpRequestHeader("x-request-id", c.requestID)
	}
	return c.requestID
}

// prefillResponse reads the prefill's status and body, releases the prefill load and
// reports the prefill endpoint's health. status 0 means no response (a timeout or a
// reset: Envoy calls back with no headers).
func (c *httpContext) prefillResponse(bodySize int) (status int, body []byte) {
	c.prefillInFlight = false
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
	if ejected, err := c.plugin.router.ReportHealth(c.decision.Prefill, true, failed); err == nil && ejected {
		c.plugin.metrics.ejections.Increment(1)
	}
	return status, body
}

// prefillSucceeded handles what every inline answer needs: a 4xx goes back to the
// client, anything else but a 2xx falls back to direct decode and resumes. It returns
// the 2xx answer for the mode to use.
func (c *httpContext) prefillSucceeded(bodySize int) (status int, body []byte, ok bool) {
	status, body = c.prefillResponse(bodySize)
	if c.prefillRejected(status, body) {
		return status, nil, false
	}
	if status/100 != 2 {
		c.prefillFailed()
		_ = proxywasm.ResumeHttpRequest()
		return status, nil, false
	}
	return status, body, true
}

func (c *httpContext) onVLLMPrefill(_, bodySize, _ int) {
	defer c.resumeOnPanic()
	_, body, ok := c.prefillSucceeded(bodySize)
	if !ok {
		return
	}
	decodeBody, err := routing.VLLMDecodeBody(c.body, body)
	if err != nil {
		c.prefillFailed()
	} else {
		c.replaceBody(decodeBody)
	}
	_ = proxywasm.ResumeHttpRequest()
}

func (c *httpContext) onTRTLLMContext(_, bodySize, _ int) {
	defer c.resumeOnPanic()
	status, body, ok := c.prefillSucceeded(bodySize)
	if !ok {
		return
	}
	generation, passthrough, err := routing.TRTLLMGenerationBody(c.body, body)
	switch {
	case err != nil:
		c.prefillFailed()
	case passthrough:
		// The context phase already finished the answer: it goes back as it is.
		c.answered = true
		_ = proxywasm.SendHttpResponse(uint32(status), [][2]string{{"content-type", "application/json"}}, body, -1)
		return
	default:
		c.replaceBody(generation)
	}
	_ = proxywasm.ResumeHttpRequest()
}

func (c *httpContext) onSGLangPrefill(_, bodySize, _ int) {
	defer c.resumeOnPanic()
	status, _ := c.prefillResponse(bodySize)
	if status/100 != 2 {
		// The decode leg already left with the bootstrap fields; SGLang's decoder
		// times the bootstrap out. Count it.
		c.plugin.metrics.pdPrefillFailure.Increment(1)
	}
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
		_ = proxywasm.ReplaceHttpRequestHeader(h, c.decision.Header())
	}
}

// replaceBody swaps the buffered request body and keeps content-length true to it.
func (c *httpContext) replaceBody(body []byte) {
	_ = proxywasm.ReplaceHttpRequestBody(body)
	_ = proxywasm.ReplaceHttpRequestHeader("content-length", strconv.Itoa(len(body)))
}

// releasePrefill hands the prefill load back, once.
func (c *httpContext) releasePrefill() {
	if c.prefillReleased {
		return
	}
	c.prefillReleased = true
	if err := c.plugin.router.ReleasePrefill(c.decision.PrefillTicket); err != nil {
		c.plugin.metrics.stateConflicts.Increment(1)
	}
}

// resumeOnPanic keeps a fault in a prefill callback from stalling the request.
func (c *httpContext) resumeOnPanic() {
	if r := recover(); r != nil {
		c.plugin.metrics.failOpen.Increment(1)
		logFailOpen("kvroute: recovered in prefill callback, resuming: %v", r)
		_ = proxywasm.ResumeHttpRequest()
	}
}
