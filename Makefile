# kvroute — build, test and demo. Every target works on a fresh machine with Go >= 1.26.
# The product module (the filter, `build`, `demo`, `samples`) needs only Go >= 1.25; `test`
# and `image` also build deploy/tools, whose Envoy, Kubernetes and kustomize modules need 1.26.
GO        ?= go
WASM      := build/kvroute.wasm
# The same module with injected faults armed by a host property (filter/fault_inject.go),
# for the tests of what the filter does when it panics; never shipped.
FAULT_WASM := build/kvroute-faults.wasm
WASM_SRC  := $(shell find filter routing internal -name '*.go' -not -name '*_test.go') go.mod go.sum

# Every wasm module is built with a patch of Go's wasip1 runtime (internal/wasip1patch):
# without it, the proxy-wasm hosts of Envoy and Istio releases built before
# proxy-wasm-cpp-host #533 kill the module at its first garbage collection. The patched
# files are generated from the installed Go at build time; the build fails if they
# cannot be.
GOROOT_RUNTIME := $(shell $(GO) env GOROOT)/src/runtime
OVERLAY   := build/wasip1patch/overlay.json
WASM_GO   := GOOS=wasip1 GOARCH=wasm $(GO) build -overlay $(OVERLAY) -buildmode=c-shared -trimpath

.PHONY: all build demo samples test bench soak fuzz clean image

all: build

build: $(WASM)

$(OVERLAY): internal/wasip1patch/main.go $(GOROOT_RUNTIME)/os_wasip1.go $(GOROOT_RUNTIME)/netpoll_wasip1.go
	$(GO) run ./internal/wasip1patch -goroot "$$($(GO) env GOROOT)" -out $(dir $(OVERLAY))

$(WASM): $(WASM_SRC) $(OVERLAY)
	$(WASM_GO) -o $(WASM) ./filter

$(FAULT_WASM): $(WASM_SRC) $(OVERLAY)
	$(WASM_GO) -tags kvroute_faults -o $(FAULT_WASM) ./filter

# The main job: build the wasm and replay the Mooncake trace and the chat trace (with
# conversation ids) through it in the SDK host emulator against a modelled fleet, next
# to the baselines, at 1x and 2x the traces' arrival rates, over DRAWS tie-break draws,
# printing the report. The routing-quality bar is judged over 8 draws: make demo DRAWS=8.
DRAWS ?= 2
demo: build
	$(GO) build -o build/kvroute-replay ./cmd/kvroute-replay
	build/kvroute-replay -wasm $(WASM) -config testdata/replay/kvroute.json -speed 1,2 -draws $(DRAWS) \
		-trace testdata/traces/mooncake_synthetic_trace.jsonl -svg build/replay.svg
	build/kvroute-replay -wasm $(WASM) -config testdata/replay/kvroute.json -speed 1,2 -draws $(DRAWS) \
		-trace testdata/replay/chat_sessions.jsonl -svg build/replay-chat.svg

# Route the hand-written sample requests and print one line per decision.
samples: build
	$(GO) run ./cmd/kvroute-demo -wasm $(WASM) -requests testdata/requests

# go vet and every test; the wasm is built first so wasm-mode tests test this code.
test: build $(FAULT_WASM)
	$(GO) vet ./...
	$(GO) test -count=1 ./...
	$(GO) test -count=1 -race -run 'Concurren|NoLostUpdates|Lease|Board|Batches' ./routing/...
	cd deploy/tools && $(GO) vet -mod=mod ./... && $(GO) test -mod=mod -count=1 ./...

# The plugin as an OCI image in the layout Istio pulls (WasmPlugin url: oci://...), built
# without a container daemon: build/oci is an OCI image layout; PUSH=<registry>/<repo>:<tag>
# also pushes it (credentials from the Docker config).
image: build
	cd deploy/tools && $(GO) run -mod=mod ./cmd/kvroute-image -wasm ../../$(WASM) -layout ../../build/oci $(if $(PUSH),-push $(PUSH))

bench: build
	@mkdir -p build
	$(WASM_GO) -o build/floor.wasm ./bench/floorfilter
	$(GO) test ./bench -run '^$$' -bench . -benchtime 2700x
	$(GO) test -run '^$$' -bench . -benchmem ./routing/... ./filter

# 1 000 000 requests through the compiled filter in the emulator (minutes).
soak: build
	KVROUTE_SOAK=1 $(GO) test ./soak -run TestSoak -v -count=1 -timeout 2h

clean:
	rm -rf build
