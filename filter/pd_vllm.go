package main

import (
	"github.com/kvroute/kvroute/routing/pdbody"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
)

// vllmMode runs the prefill inline as vLLM's NixlConnector expects: a prefill leg that
// asks for remote decode, then the decode leg with the kv_transfer_params it answered.
type vllmMode struct{ inlineMode }

func (vllmMode) start(c *httpContext, body []byte) bool {
	return c.sendPrefill(pdbody.VLLMPrefillBody(body))
}

func (vllmMode) prefillAnswered(c *httpContext, status int, answer []byte) {
	if !c.prefillSucceeded(status, answer) {
		return
	}
	decodeBody, err := pdbody.VLLMDecodeBody(c.body, answer)
	if err != nil {
		c.prefillFailed()
	} else {
		c.replaceBody(decodeBody)
	}
	_ = proxywasm.ResumeHttpRequest()
}
