package main

import (
	"bytes"
	"fmt"
	"log"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

func TestTmpCountCalls(t *testing.T) {
	saved := nowMS
	goClock = 1_700_000_000_000
	nowMS = func() int64 { return goClock }
	defer func() { nowMS = saved }()
	h := startHost(t, types.VMContext(&vmContext{}), `{"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":2},{"address":"10.0.0.2:8000","dp_size":2}]}}}`)
	body := []byte(chat(strings.Repeat("hello world ", 300)))
	for i := 0; i < 5; i++ {
		id, _ := h.send(request{method: "POST", path: "/v1/chat/completions", body: body, headers: [][2]string{{"x-request-id", fmt.Sprint("r", i)}}})
		h.respond(id, 200)
	}
	var buf bytes.Buffer
	log.SetOutput(&buf)
	id, _ := h.send(request{method: "POST", path: "/v1/chat/completions", body: body, headers: [][2]string{{"x-request-id", "zz"}}})
	h.respond(id, 200)
	log.SetOutput(io_discard{})
	fmt.Println(buf.String())
}

type io_discard struct{}

func (io_discard) Write(p []byte) (int, error) { return len(p), nil }
