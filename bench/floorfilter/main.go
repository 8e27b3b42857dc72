// Command floorfilter is the cost floor kvroute is measured against: a
// proxy-wasm filter that only buffers the request body, reads it once with gjson and
// writes one header. Built to build/floor.wasm by `make bench`.
package main

import (
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/tidwall/gjson"
)

func main() {}

func init() {
	proxywasm.SetHttpContext(func(uint32) types.HttpContext { return &floor{} })
}

type floor struct{ types.DefaultHttpContext }

func (*floor) OnHttpRequestHeaders(_ int, endOfStream bool) types.Action {
	if endOfStream {
		return types.ActionContinue
	}
	return types.ActionPause
}

func (*floor) OnHttpRequestBody(size int, endOfStream bool) types.Action {
	if !endOfStream {
		return types.ActionPause
	}
	body, err := proxywasm.GetHttpRequestBody(0, size)
	if err != nil {
		return types.ActionContinue
	}
	r := gjson.ParseBytes(body)
	model, messages := r.Get("model"), r.Get("messages")
	if model.Exists() && messages.IsArray() {
		_ = proxywasm.ReplaceHttpRequestHeader("x-gateway-destination-endpoint", "10.0.0.1:8000")
	}
	return types.ActionContinue
}
