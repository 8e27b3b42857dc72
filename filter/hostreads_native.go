//go:build !wasm

package main

import (
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
)

// The native build (the Go plugin in the SDK's emulator) reads through the SDK; the
// wasm build reads the host directly (hostreads_wasm.go). Both give the same values.

func wallClockMS() int64 { return time.Now().UnixMilli() }

func requestHeaders() headerPairs {
	hs, _ := proxywasm.GetHttpRequestHeaders()
	return headerPairs{pairs: hs}
}

func responseStatus() string {
	s, _ := proxywasm.GetHttpResponseHeader(":status")
	return s
}

func requestBody(size int) []byte {
	b, err := proxywasm.GetHttpRequestBody(0, size)
	if err != nil {
		return nil
	}
	return b
}

type headerPairs struct {
	pairs [][2]string
	i     int
}

func (h *headerPairs) next() (name, value string, ok bool) {
	if h.i >= len(h.pairs) {
		return "", "", false
	}
	h.i++
	return h.pairs[h.i-1][0], h.pairs[h.i-1][1], true
}
