package main

import "github.com/kvroute/kvroute/routing/pdbody"

// sglangMode sends the same body, with the prefill's bootstrap address and a room, to
// the prefill and the decode target at once; the decoder pulls the KV cache through
// the bootstrap, and the request does not wait for the prefill.
type sglangMode struct{ inlineMode }

func (sglangMode) start(c *httpContext, body []byte) bool {
	d := &c.decision
	room := pdbody.BootstrapRoom(c.req.Identity)
	both, err := pdbody.SGLangBootstrapBody(body, pdbody.HostOfAddress(d.Prefill.Address), d.Prefill.BootstrapPort, room)
	// The same body goes to both at once: the prefill's answer is only drained.
	if c.sendPrefill(both, err) {
		c.replaceBody(both)
	}
	return false
}

func (sglangMode) prefillAnswered(c *httpContext, status int, _ []byte) {
	if status/100 != 2 {
		// The decode leg already left with the bootstrap fields; SGLang's decoder
		// times the bootstrap out. Count it.
		c.plugin.metrics.pdPrefillFailure.Increment(1)
	}
}
