//go:build wasm

package main

import (
	"time"
	"unsafe"
)

// The three reads every routed request makes — its headers, its body, the response
// status — and its header writes go to the host directly rather than through the
// SDK's wrappers, which allocate their out-parameters and a slice of pairs on every
// call and turn every status into an error. The host still allocates the returned
// bytes through the SDK's proxy_on_memory_allocate, as the ABI requires.

//go:wasmimport env proxy_get_header_map_pairs
func hostGetHeaderMapPairs(mapType int32, returnData unsafe.Pointer, returnSize *int32) int32

//go:wasmimport env proxy_get_header_map_value
func hostGetHeaderMapValue(mapType int32, keyData *byte, keySize int32, returnData unsafe.Pointer, returnSize *int32) int32

//go:wasmimport env proxy_replace_header_map_value
func hostReplaceHeaderMapValue(mapType int32, keyData *byte, keySize int32, valueData *byte, valueSize int32) int32

//go:wasmimport env proxy_get_buffer_bytes
func hostGetBufferBytes(bufferType int32, start int32, maxSize int32, returnData unsafe.Pointer, returnSize *int32) int32

//go:wasmimport wasi_snapshot_preview1 clock_time_get
func hostClockTimeGet(clockID uint32, precision uint64, time *uint64) uint32

const (
	mapRequestHeaders  = 0
	mapResponseHeaders = 2
	bufferRequestBody  = 0
	statusOK           = 0
)

// The out-parameters live outside the stack so the calls allocate nothing: a VM runs
// one callback at a time.
var (
	hostData  *byte
	hostSize  int32
	hostClock uint64
)

func hostBytes() []byte {
	if hostData == nil || hostSize <= 0 {
		return nil
	}
	return unsafe.Slice(hostData, hostSize)
}

// wallClockMS reads the host's realtime clock with one call: time.Now reads the
// monotonic clock as well, and the router asks the time on every request.
func wallClockMS() int64 {
	const realtime, millisecond = 0, 1_000_000
	if hostClockTimeGet(realtime, millisecond, &hostClock) != 0 {
		return time.Now().UnixMilli()
	}
	return int64(hostClock / millisecond)
}

// requestHeaderMap returns the request's headers as the ABI's serialized map, read
// with one host call (readRequestHeaders walks it).
func requestHeaderMap() []byte {
	hostData, hostSize = nil, 0
	if hostGetHeaderMapPairs(mapRequestHeaders, unsafe.Pointer(&hostData), &hostSize) != statusOK {
		return nil
	}
	return hostBytes()
}

// responseStatus returns the response's :status.
func responseStatus() string {
	const key = ":status"
	hostData, hostSize = nil, 0
	if hostGetHeaderMapValue(mapResponseHeaders, unsafe.StringData(key), int32(len(key)), unsafe.Pointer(&hostData), &hostSize) != statusOK {
		return ""
	}
	b := hostBytes()
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// replaceRequestHeader sets a request header (every line of it) to value. Its status
// goes unread, as every caller would ignore it.
func replaceRequestHeader(name, value string) {
	hostReplaceHeaderMapValue(mapRequestHeaders, stringData(name), int32(len(name)), stringData(value), int32(len(value)))
}

// stringData is s's bytes for the host: nil for "", as the SDK passes.
func stringData(s string) *byte {
	if s == "" {
		return nil
	}
	return unsafe.StringData(s)
}

// requestBody returns the buffered request body.
func requestBody(size int) []byte {
	hostData, hostSize = nil, 0
	if hostGetBufferBytes(bufferRequestBody, 0, int32(size), unsafe.Pointer(&hostData), &hostSize) != statusOK {
		return nil
	}
	return hostBytes()
}
