package main

import (
	"bytes"
	"io"
	"log"
	"os"
	"regexp"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
)

// TestSamples runs the demo over the shipped samples with the compiled filter, as
// `make samples` does.
func TestSamples(t *testing.T) {
	bin, err := os.ReadFile("../../build/kvroute.wasm")
	if err != nil {
		t.Fatalf("the compiled module is needed (run `make build`): %v", err)
	}
	vm, err := proxytest.NewWasmVMContext(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	log.SetOutput(io.Discard)
	defer log.SetOutput(os.Stderr)
	var out bytes.Buffer
	if err := run(vm, "../../testdata/requests", &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		`(?m)^kvroute_requests_routed +21$`, // counted in the VM until the tick hands them over
		`(?m)^kvroute_parse_errors +1$`,
		`(?m)^kvroute_prompt_tokens +[1-9][0-9]*$`,
		`(?m)^20 +20-api-shapes\.jsonl:8 .* \(parse error\)`,
		`(?m)^parse error: 20-api-shapes\.jsonl:8 `,
	} {
		if !regexp.MustCompile(want).MatchString(got) {
			t.Errorf("output does not match %s:\n%s", want, got)
		}
	}
}
