package main

import "github.com/tidwall/gjson"

// The P/D legs a request can be, as x-mock-leg names them.
const (
	legDirect     = "direct"
	legVLLMPre    = "vllm-prefill"
	legVLLMDec    = "vllm-decode"
	legTRTContext = "trtllm-context"
	legTRTGen     = "trtllm-generation"
	legSGLPre     = "sglang-prefill"
	legSGLDec     = "sglang-decode"
)

// requestLeg names the P/D leg a body asks for, and whether it is a prefill leg.
func (w *worker) requestLeg(body, kvParams, dpParams gjson.Result) (string, bool) {
	switch {
	case kvParams.Get("do_remote_decode").Bool():
		return legVLLMPre, true
	case kvParams.Get("do_remote_prefill").Bool():
		return legVLLMDec, false
	case dpParams.Get("request_type").String() == "context_only":
		return legTRTContext, true
	case dpParams.Get("request_type").String() == "generation_only":
		return legTRTGen, false
	case body.Get("bootstrap_room").Exists() || body.Get("bootstrap_host").Exists():
		if w.cfg.Role == rolePrefill {
			return legSGLPre, true
		}
		return legSGLDec, false
	}
	return legDirect, false
}

// trtllmContextParams is choices[0].disaggregated_params of a TensorRT-LLM context leg's
// answer.
func trtllmContextParams() map[string]any {
	return map[string]any{
		"request_type":         "context_only",
		"first_gen_tokens":     []int{42},
		"ctx_request_id":       123,
		"encoded_opaque_state": "b3BhcXVl",
		"draft_tokens":         nil,
	}
}

// vllmPrefillParams is the kv_transfer_params of a vLLM prefill answer: this worker holds
// the KV blocks the decode leg pulls.
func (w *worker) vllmPrefillParams(req *request) map[string]any {
	return map[string]any{
		"do_remote_prefill": true,
		"do_remote_decode":  false,
		"remote_engine_id":  w.cfg.Name,
		"remote_block_ids":  []int{1, 2, 3},
		"remote_request_id": req.seen["x-request-id"],
		"remote_host":       w.host,
		"remote_port":       w.port,
		"tp_size":           1,
	}
}
