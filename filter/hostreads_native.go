//go:build !wasm

package main

import (
	"encoding/binary"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
)

// The native build (the Go plugin in the SDK's emulator) reads through the SDK; the
// wasm build reads the host directly (hostreads_wasm.go). Both give the same values.

func wallClockMS() int64 { return time.Now().UnixMilli() }

// requestHeaderMap serializes the SDK's headers as the host's
// proxy_get_header_map_pairs does, for readRequestHeaders.
func requestHeaderMap() []byte {
	hs, _ := proxywasm.GetHttpRequestHeaders()
	return serializeHeaderMap(hs)
}

// serializeHeaderMap is the ABI's serialized header map of hs: a count, the lengths
// of each name and value, then the names and values, each followed by a NUL.
func serializeHeaderMap(hs [][2]string) []byte {
	m := binary.LittleEndian.AppendUint32(nil, uint32(len(hs)))
	for _, h := range hs {
		m = binary.LittleEndian.AppendUint32(m, uint32(len(h[0])))
		m = binary.LittleEndian.AppendUint32(m, uint32(len(h[1])))
	}
	for _, h := range hs {
		m = append(append(append(append(m, h[0]...), 0), h[1]...), 0)
	}
	return m
}

func responseStatus() string {
	s, _ := proxywasm.GetHttpResponseHeader(":status")
	return s
}

func replaceRequestHeader(name, value string) {
	_ = proxywasm.ReplaceHttpRequestHeader(name, value)
}

func requestBody(size int) []byte {
	b, err := proxywasm.GetHttpRequestBody(0, size)
	if err != nil {
		return nil
	}
	return b
}
