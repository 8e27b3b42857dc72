package main

import (
	"github.com/kvroute/kvroute/routing/pdbody"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
)

// trtllmMode runs the prefill inline as TensorRT-LLM's disaggregated serving expects: a
// context-only leg, then a generation-only leg carrying its disaggregated_params.
type trtllmMode struct{ inlineMode }

func (trtllmMode) start(c *httpContext, body []byte) bool {
	return c.sendPrefill(pdbody.TRTLLMContextBody(body))
}

func (trtllmMode) prefillAnswered(c *httpContext, status int, answer []byte) {
	if !c.prefillSucceeded(status, answer) {
		return
	}
	generation, passthrough, err := pdbody.TRTLLMGenerationBody(c.body, answer)
	switch {
	case err != nil:
		c.prefillFailed()
	case passthrough:
		// The context phase already finished the answer: it goes back as it is.
		c.answered = true
		_ = proxywasm.SendHttpResponse(uint32(status), [][2]string{{"content-type", "application/json"}}, answer, -1)
		return
	default:
		c.replaceBody(generation)
	}
	_ = proxywasm.ResumeHttpRequest()
}
