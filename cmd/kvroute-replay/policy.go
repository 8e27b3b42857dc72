package main

// A policy is one router under test: kvroute (the compiled filter, driven through
// the proxy-wasm host emulator: kvroute_wasmhost.go) or a baseline implemented from
// its published description (baseline_*.go). The fleet model (fleet.go) asks it for
// a target per request and tells it of each completion.
//
// (kvroute's file is not named kvroute_wasm.go: a _wasm.go suffix would make it
// build for GOARCH=wasm only.)

// Policy chooses a target for each request. Done is called once per request, at its
// modelled completion, in time order, before any later arrival is chosen.
type Policy interface {
	Name() string
	Choose(r *Request, f *Fleet) int
	Done(r *Request, target int)
}

// FirstTokenPolicy is a Policy that also hears of each request's first token (its
// first response chunk), in time order with the completions: a router in the path
// of a streamed response sees the prefill end there.
type FirstTokenPolicy interface {
	Policy
	FirstToken(r *Request, target int)
}
