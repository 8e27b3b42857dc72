// Package pdbody builds the request bodies of the inline prefill/decode protocols.
package pdbody

import (
	"bytes"
	"errors"
	"strconv"
	"unsafe"

	"github.com/kvroute/kvroute/routing/hashx"
	"github.com/kvroute/kvroute/routing/jsonscan"
	"github.com/tidwall/gjson"
)

// This file builds the request bodies of the inline prefill/decode protocols
// (docs/behaviour.md, Prefill/decode disaggregation). The functions are pure: they never
// modify their input slices, never panic, and return an error wrapping ErrPDBody when a
// body (or an engine's response) is not of the shape they need.
//
// Every edit is made at the top level of a JSON object by one pass over its members
// (rewriteObject): the members that are replaced or removed are left out, however often they
// occur and however their keys are escaped, every other member is copied byte for byte, and
// the new members are appended. The engines parse bodies with Python's json module, where the
// last of duplicate keys wins and "str\u0065am" is "stream"; an in-place edit of the first
// occurrence (sjson's Set) would leave `{"stream":true,"stream":true}` streaming.

// ErrPDBody is wrapped by every error the P/D body builders return.
var ErrPDBody = errors.New("kvroute: cannot build the P/D request body")

// pdBodyError names what was wrong; it unwraps to ErrPDBody. The errors are constants, so
// failing allocates nothing.
type pdBodyError string

func (e pdBodyError) Error() string { return ErrPDBody.Error() + ": " + string(e) }
func (e pdBodyError) Unwrap() error { return ErrPDBody }

const (
	errPDBodyNotObject  = pdBodyError("request body is not a JSON object")
	errPDRespNotObject  = pdBodyError("engine response is not a JSON object")
	errPDNoKVParams     = pdBodyError("prefill response has no non-empty kv_transfer_params object")
	errPDNoChoice       = pdBodyError("context response has no choices[0] object")
	errPDNoDisaggParams = pdBodyError("context response has no choices[0].disaggregated_params object")
	errPDBootstrapHost  = pdBodyError("bootstrap host is empty")
	errPDBootstrapPort  = pdBodyError("bootstrap port is not in [1, 65535]")
)

const (
	maxBootstrapRoom     = 1<<63 - 1 // SGLang draws rooms from [0, 2^63)
	defaultBootstrapRoom = 1         // BootstrapRoom's answer where the mixed identity is 0
)

// The members the vLLM prefill leg sets. kv_transfer_params asks the prefill engine to keep
// the KV blocks for a remote decoder and to return where they are.
const (
	vllmPrefillKVParams = `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`
	trtllmContextParams = `{"request_type":"context_only"}`
)

// VLLMPrefillBody builds the body of the prefill leg of vLLM's NixlConnector protocol:
// the original body with kv_transfer_params =
// {"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
// "remote_block_ids": null, "remote_host": null, "remote_port": null}, "stream": false,
// "max_tokens": 1, "max_completion_tokens": 1 only where the body has it, and
// "stream_options", "min_tokens" and "min_completion_tokens" removed.
//
// Followed: vllm-project/vllm tests/v1/kv_connector/nixl_integration/toy_proxy_server.py
// (send_request_to_service; it also drops min_completion_tokens, "not supported for P"), and
// vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py, now
// .../v1/nixl/pull_scheduler.py (request_finished: only a request with do_remote_decode that
// finished length-capped hands its blocks over, in the kv_transfer_params of its response).
func VLLMPrefillBody(body []byte) ([]byte, error) {
	obj, ok := jsonObject(body)
	if !ok {
		return nil, errPDBodyNotObject
	}
	return rewriteObject(obj, []objectEdit{
		{key: "kv_transfer_params", raw: vllmPrefillKVParams, mode: editSet},
		{key: "stream", raw: "false", mode: editSet},
		{key: "max_tokens", raw: "1", mode: editSet},
		{key: "max_completion_tokens", raw: "1", mode: editSetIfPresent},
		{key: "stream_options", mode: editDrop},
		{key: "min_tokens", mode: editDrop},
		{key: "min_completion_tokens", mode: editDrop},
	}), nil
}

// VLLMDecodeBody builds the body of the decode leg of vLLM's NixlConnector protocol: the
// original body with kv_transfer_params = the prefill response's top-level
// kv_transfer_params, copied as raw JSON. It fails when the response is not a JSON object
// or its kv_transfer_params is missing, not an object, or empty (the prefill then handed
// no KV over, and the caller should fall back to a direct decode).
//
// Followed: vllm-project/vllm tests/v1/kv_connector/nixl_integration/toy_proxy_server.py
// (_handle_completions: `if kv_transfer_params: req_data["kv_transfer_params"] = ...`).
func VLLMDecodeBody(body, prefillResponse []byte) ([]byte, error) {
	obj, ok := jsonObject(body)
	if !ok {
		return nil, errPDBodyNotObject
	}
	resp, ok := jsonObject(prefillResponse)
	if !ok {
		return nil, errPDRespNotObject
	}
	kv, ok := lastMember(resp, "kv_transfer_params")
	if !ok || !kv.IsObject() || isEmptyObject(kv) {
		return nil, errPDNoKVParams
	}
	return rewriteObject(obj, []objectEdit{
		{key: "kv_transfer_params", raw: kv.Raw, mode: editSet},
	}), nil
}

// TRTLLMContextBody builds the body of the context (prefill) leg of TensorRT-LLM's
// disaggregated serving: the original body with
// "disaggregated_params": {"request_type": "context_only"}, "stream": false and
// "stream_options" removed.
//
// Followed: NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_disagg_server.py
// (_send_context_request: request_type="context_only", stream=False, stream_options=None) and
// tensorrt_llm/serve/openai_disagg_service.py (_get_ctx_request, which also sends the server's
// own disagg_request_id, schedule_style and conversation_id; a worker falls back to its
// ctx_request_id when disagg_request_id is absent). max_tokens is left alone: a context_only
// request runs the prefill and returns the first token whatever it asks for.
func TRTLLMContextBody(body []byte) ([]byte, error) {
	obj, ok := jsonObject(body)
	if !ok {
		return nil, errPDBodyNotObject
	}
	return rewriteObject(obj, []objectEdit{
		{key: "disaggregated_params", raw: trtllmContextParams, mode: editSet},
		{key: "stream", raw: "false", mode: editSet},
		{key: "stream_options", mode: editDrop},
	}), nil
}

// TRTLLMGenerationBody builds the body of the generation (decode) leg of TensorRT-LLM's
// disaggregated serving from the original body and the context leg's response.
//
// When choices[0].finish_reason is neither "length" nor "not_finished" (for example "stop":
// the answer ended with the first token), no generation leg is needed: it returns
// passthrough=true and no body, and the caller returns the context response to the client.
// Otherwise it returns the original body with "disaggregated_params" = the response's
// choices[0].disaggregated_params (raw JSON) with "request_type" set to "generation_only".
//
// Followed: NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_disagg_service.py (_need_gen,
// _get_gen_request, _verify_ctx_response) and tensorrt_llm/serve/openai_protocol.py
// (DisaggregatedParams: request_type, first_gen_tokens, ctx_request_id, encoded_opaque_state,
// draft_tokens, disagg_request_id, ...).
func TRTLLMGenerationBody(body, contextResponse []byte) (out []byte, passthrough bool, err error) {
	obj, ok := jsonObject(body)
	if !ok {
		return nil, false, errPDBodyNotObject
	}
	resp, ok := jsonObject(contextResponse)
	if !ok {
		return nil, false, errPDRespNotObject
	}
	choices, ok := lastMember(resp, "choices")
	if !ok || !choices.IsArray() {
		return nil, false, errPDNoChoice
	}
	var choice gjson.Result
	choices.ForEach(func(_, v gjson.Result) bool {
		choice = v
		return false
	})
	if !choice.IsObject() {
		return nil, false, errPDNoChoice
	}
	reason, _ := lastMember(choice.Raw, "finish_reason")
	if reason.Type != gjson.String || (reason.Str != "length" && reason.Str != "not_finished") {
		return nil, true, nil
	}
	params, ok := lastMember(choice.Raw, "disaggregated_params")
	if !ok || !params.IsObject() {
		return nil, false, errPDNoDisaggParams
	}
	gen := rewriteObject(params.Raw, []objectEdit{
		{key: "request_type", raw: `"generation_only"`, mode: editSet},
	})
	return rewriteObject(obj, []objectEdit{
		{key: "disaggregated_params", raw: bytesToString(gen), mode: editSet},
	}), false, nil
}

// SGLangBootstrapBody builds the body SGLang's bootstrap protocol sends to both the prefill
// and the decode target: the original body with "bootstrap_host" (the prefill
// endpoint's host; an IPv6 literal is written in brackets, as SGLang's router does, because
// the decoder builds host:port from it), "bootstrap_port" and "bootstrap_room" (a JSON
// integer; only its low 63 bits are used). It fails on an empty host or a port outside
// [1, 65535].
//
// Followed: sgl-project/sglang python/sglang/srt/disaggregation/mini_lb.py
// (_forward_to_backend: bootstrap_host = maybe_wrap_ipv6_address(hostname), bootstrap_port,
// bootstrap_room = random.randint(0, 2**63 - 1); the same request goes to both servers).
func SGLangBootstrapBody(body []byte, host string, port int, room uint64) ([]byte, error) {
	obj, ok := jsonObject(body)
	if !ok {
		return nil, errPDBodyNotObject
	}
	if host == "" {
		return nil, errPDBootstrapHost
	}
	if port < 1 || port > 65535 {
		return nil, errPDBootstrapPort
	}
	if isIPv6Literal(host) {
		host = "[" + host + "]"
	}
	hostJSON := jsonscan.AppendQuoted(make([]byte, 0, len(host)+2), host)
	return rewriteObject(obj, []objectEdit{
		{key: "bootstrap_host", raw: bytesToString(hostJSON), mode: editSet},
		{key: "bootstrap_port", raw: strconv.Itoa(port), mode: editSet},
		{key: "bootstrap_room", raw: strconv.FormatUint(room&maxBootstrapRoom, 10), mode: editSet},
	}), nil
}

// BootstrapRoom derives an SGLang bootstrap room from a request identity: a non-zero 63-bit
// value (SGLang draws rooms from [0, 2^63)), the same for the same identity on every VM and
// replica. It is the splitmix64 step: the finaliser over identity + the golden gamma.
func BootstrapRoom(identity uint64) uint64 {
	room := hashx.Mix64(identity+0x9e3779b97f4a7c15) & maxBootstrapRoom
	if room == 0 {
		return defaultBootstrapRoom
	}
	return room
}

// HostOfAddress returns the host of a host:port address: "10.0.0.1:8000" → "10.0.0.1",
// "[::1]:8000" → "::1", "svc.ns:80" → "svc.ns". An address without a port is returned as it
// is, less the brackets of a bracketed IPv6 literal ("::1" → "::1", "[::1]" → "::1").
func HostOfAddress(address string) string {
	if len(address) > 0 && address[0] == '[' {
		for i := 1; i < len(address); i++ {
			if address[i] == ']' {
				return address[1:i]
			}
		}
		return address
	}
	colon := -1
	for i := 0; i < len(address); i++ {
		if address[i] == ':' {
			if colon >= 0 {
				return address // two colons and no brackets: a bare IPv6 literal
			}
			colon = i
		}
	}
	if colon < 0 {
		return address
	}
	return address[:colon]
}

// isIPv6Literal reports whether host is a bare IPv6 literal (it has a colon and is not
// already bracketed). Host names and IPv4 addresses never contain a colon.
func isIPv6Literal(host string) bool {
	if host == "" || host[0] == '[' {
		return false
	}
	for i := 0; i < len(host); i++ {
		if host[i] == ':' {
			return true
		}
	}
	return false
}

// editMode says what rewriteObject does with a key.
type editMode uint8

const (
	editSet          editMode = iota // remove every occurrence, then append key: raw
	editSetIfPresent                 // as editSet, but only when the object had the key
	editDrop                         // remove every occurrence
)

// objectEdit is one change to the top level of a JSON object. key is written as is between
// quotes, so it must need no escaping; raw is a valid JSON value.
type objectEdit struct {
	key  string
	raw  string
	mode editMode
}

// rewriteObject applies edits to obj, a valid JSON object: every member whose (unescaped)
// key an edit names is left out, every other member is copied byte for byte, and the members
// of the editSet edits (and of the editSetIfPresent edits whose key was seen) are appended in
// the order given. The result is a new slice; obj is not modified.
func rewriteObject(obj string, edits []objectEdit) []byte {
	var seen uint64 // bit i: edits[i].key occurred; there are never more than 64 edits
	extra := 0
	for _, e := range edits {
		extra += len(e.key) + len(e.raw) + 4
	}
	out := make([]byte, 0, len(obj)+extra)
	out = append(out, '{')
	members := 0
	gjson.Parse(obj).ForEach(func(key, value gjson.Result) bool {
		for i := range edits {
			if edits[i].key == key.Str {
				seen |= 1 << uint(i)
				return true
			}
		}
		end := value.Index + len(value.Raw)
		if key.Index < 0 || key.Index >= end || end > len(obj) {
			return true // cannot happen for a valid object; never slice out of range
		}
		if members > 0 {
			out = append(out, ',')
		}
		out = append(out, obj[key.Index:end]...)
		members++
		return true
	})
	for i, e := range edits {
		if e.mode == editDrop || (e.mode == editSetIfPresent && seen&(1<<uint(i)) == 0) {
			continue
		}
		if members > 0 {
			out = append(out, ',')
		}
		out = append(out, '"')
		out = append(out, e.key...)
		out = append(out, '"', ':')
		out = append(out, e.raw...)
		members++
	}
	return append(out, '}')
}

// jsonObject returns body as a string (sharing its memory, never written) when it is valid
// JSON whose top level is an object.
func jsonObject(body []byte) (string, bool) {
	s := bytesToString(body)
	// The shape check first: it bounds the nesting, so gjson's recursive validation
	// can never run the stack out (in wasm a stack overflow is a trap, not a panic).
	if !jsonscan.ShapeOK(s) || !gjson.Valid(s) {
		return "", false
	}
	if !gjson.Parse(s).IsObject() {
		return "", false
	}
	return s, true
}

// lastMember returns the value of the last top-level member of obj named key (unescaped), as
// the engines' JSON parsers see it when a key is duplicated.
func lastMember(obj string, key string) (gjson.Result, bool) {
	var found gjson.Result
	ok := false
	gjson.Parse(obj).ForEach(func(k, v gjson.Result) bool {
		if k.Str == key {
			found, ok = v, true
		}
		return true
	})
	return found, ok
}

// isEmptyObject reports whether v, a JSON object, has no members.
func isEmptyObject(v gjson.Result) bool {
	empty := true
	v.ForEach(func(_, _ gjson.Result) bool {
		empty = false
		return false
	})
	return empty
}

// bytesToString views b as a string without copying. The caller never writes b afterwards.
func bytesToString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// pdControlFields are the body members with which a request steers a P/D-enabled
// engine: where to pull KV from, which context to continue, which bootstrap room to
// join. Only kvroute may set them.
var pdControlFields = []string{"kv_transfer_params", "disaggregated_params", "bootstrap_host", "bootstrap_port", "bootstrap_room"}

// StripPDFields removes the P/D control members a client put in its body, so that a
// request kvroute sends straight to a decoder cannot make it pull KV blocks from a
// host of the client's choosing. It returns the body unchanged (and false) when none
// is there — the common case costs a substring scan — or when the body is not a JSON
// object (it is forwarded as it is, like any body that fails open).
func StripPDFields(body []byte) ([]byte, bool) {
	present := false
	for _, k := range pdControlFields {
		if bytes.Contains(body, []byte(k)) {
			present = true
			break
		}
	}
	if !present {
		return body, false
	}
	obj, ok := jsonObject(body)
	if !ok {
		return body, false
	}
	edits := make([]objectEdit, 0, len(pdControlFields))
	for _, k := range pdControlFields {
		edits = append(edits, objectEdit{key: k, mode: editDrop})
	}
	out := rewriteObject(obj, edits)
	if len(out) == len(body) {
		return body, false // the names were in a string or a nested object: nothing dropped
	}
	return out, true
}
