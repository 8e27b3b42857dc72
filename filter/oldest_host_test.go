package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/emulatorext"
	"github.com/kvroute/kvroute/internal/hostcompat"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/require"
)

// The compiled module must load and run in the oldest proxy-wasm host it claims (the
// one behind Envoy 1.33 and Istio 1.25; see internal/hostcompat). The emulator's
// wazero provides every WASI function and answers each fully, so only these tests
// show what that host would do to the module.

func compiledModule(t *testing.T) []byte {
	bin, err := os.ReadFile(shipped.path)
	if err != nil {
		t.Fatalf("the compiled module is needed (run `make build`): %v", err)
	}
	return bin
}

func TestModuleImportsOnlyWhatTheOldestHostProvides(t *testing.T) {
	imports, err := hostcompat.ModuleImports(context.Background(), compiledModule(t))
	require.NoError(t, err)
	require.Contains(t, imports, "env.proxy_get_buffer_bytes", "the import section was not read")

	foreign, err := hostcompat.ForeignImports(context.Background(), compiledModule(t))
	require.NoError(t, err)
	require.Empty(t, foreign, "the module imports what the oldest supported host lacks; "+
		"it would fail to load there with \"missing import\" and Envoy would run without it")
}

func TestModuleSurvivesTheOldestHostsWASI(t *testing.T) {
	wasi := &hostcompat.WASI{}
	var logged strings.Builder
	wasi.Log = func(level int, msg string) {
		if logged.Len() < 2000 {
			logged.WriteString(msg)
		}
	}
	vm, err := emulatorext.NewWasmVMContextWithWASI(compiledModule(t), wasi.Instantiate)
	require.NoError(t, err, "the module does not load against the oldest supported host's WASI")
	defer vm.Close()

	const requests = 400
	died := func() (died any) {
		defer func() { died = recover() }()
		h := startHost(t, vm, `{"pools":{"decode":{"endpoints":[
			{"address":"10.0.0.11:8000","dp_size":2},{"address":"10.0.0.12:8000"}]}}}`)
		// Enough garbage to force collections: each request buffers a 64 KiB prompt.
		filler := strings.Repeat("kv cache ", 64<<10/9)
		for i := 0; i < requests; i++ {
			id, action := h.send(post("/v1/chat/completions", chat(fmt.Sprintf("%d %s", i, filler)),
				[2]string{"x-session-id", fmt.Sprint(i % 50)}))
			require.Equal(t, types.ActionContinue, action)
			dest, _ := h.header(id, "x-gateway-destination-endpoint")
			require.Contains(t, []string{"10.0.0.11:8000", "10.0.0.12:8000"}, dest)
			h.respond(id, 200)
			if i%20 == 0 {
				h.Tick()
			}
		}
		require.Equal(t, uint64(requests), h.counter("kvroute_requests_routed"))
		return nil
	}()
	require.Nil(t, died, "the module died under the oldest supported host's WASI answers; it logged:\n%s", logged.String())
	require.Positive(t, wasi.PollCalls(),
		"the module never called poll_oneoff, so the test did not reach the ENOSYS answer it is for")
}
