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
