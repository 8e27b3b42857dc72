package main

// sidecarMode names the prefill target in headers and leaves the prefill to a sidecar
// beside the decoder (the llm-d convention); the body is not touched.
type sidecarMode struct{}

func (sidecarMode) inline() bool { return false }

func (sidecarMode) start(c *httpContext, _ []byte) bool {
	h := &c.plugin.cfg.Headers
	d := &c.decision
	replaceRequestHeader(h.PrefillDestination, d.Prefill.Address)
	if d.Prefill.DPSize > 1 {
		replaceRequestHeader(h.PrefillDPRank, d.Prefill.RankText)
	}
	return false
}

// prefillAnswered never runs: the filter makes no prefill call.
func (sidecarMode) prefillAnswered(*httpContext, int, []byte) {}

// decodeAnswered releases the prefill load: the sidecar's prefill and KV transfer are
// over once the decoder answers.
func (sidecarMode) decodeAnswered(c *httpContext) { c.releasePrefill() }
