// Command kvroute-demo routes the sample requests under testdata/requests through the
// compiled filter in the proxy-wasm SDK host emulator and prints each decision.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/tidwall/gjson"
)

func main() {
	wasmPath := flag.String("wasm", "build/kvroute.wasm", "compiled filter")
	dir := flag.String("requests", "testdata/requests", "directory of *.jsonl request files and config.json")
	flag.Parse()
	log.SetFlags(0)

	bin, err := os.ReadFile(*wasmPath)
	if err != nil {
		log.Fatalf("kvroute-demo: %v (run `make build`)", err)
	}
	config, err := os.ReadFile(filepath.Join(*dir, "config.json"))
	if err != nil {
		log.Fatalf("kvroute-demo: %v", err)
	}
	vm, err := proxytest.NewWasmVMContext(bin)
	if err != nil {
		log.Fatalf("kvroute-demo: loading %s: %v", *wasmPath, err)
	}
	defer vm.Close()
	// The emulator logs every host call; the demo prints only its own lines.
	log.SetOutput(bytes.NewBuffer(nil))
	host, reset := proxytest.NewHostEmulator(proxytest.NewEmulatorOption().
		WithVMContext(vm).WithPluginConfiguration(config))
	defer reset()
	if host.StartVM() != types.OnVMStartStatusOK || host.StartPlugin() != types.OnPluginStartStatusOK {
		fmt.Fprintln(os.Stderr, "kvroute-demo: the plugin refused the config:", host.GetCriticalLogs())
		os.Exit(1)
	}

	files, _ := filepath.Glob(filepath.Join(*dir, "*.jsonl"))
	sort.Strings(files)
	fmt.Printf("%-4s %-28s %-22s %-6s %-26s %s\n", "#", "file", "endpoint", "rank", "decision", "conversation")
	n := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			log.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			line := sc.Bytes()
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			n++
			rec := gjson.ParseBytes(line)
			body := []byte(rec.Get("body").Raw)
			if s := rec.Get("raw_body"); s.Exists() {
				body = []byte(s.String())
			}
			headers := [][2]string{{":method", "POST"}, {":path", rec.Get("path").String()},
				{"content-length", strconv.Itoa(len(body))}}
			conv := "-"
			rec.Get("headers").ForEach(func(k, v gjson.Result) bool {
				headers = append(headers, [2]string{k.String(), v.String()})
				if k.String() == "x-session-id" {
					conv = v.String()
				}
				return true
			})
			id := host.InitializeHttpContext()
			if host.CallOnRequestHeaders(id, headers, false) == types.ActionPause {
				host.CallOnRequestBody(id, body, true)
			}
			get := func(name string) string {
				for _, kv := range host.GetCurrentRequestHeaders(id) {
					if kv[0] == name {
						return kv[1]
					}
				}
				return "-"
			}
			fmt.Printf("%-4d %-28s %-22s %-6s %-26s %s\n", n, filepath.Base(f), get("x-gateway-destination-endpoint"),
				get("x-data-parallel-rank"), get("x-kvroute-decision"), conv)
			host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
			host.CompleteHttpContext(id)
		}
	}
	fmt.Println()
	for _, name := range []string{"kvroute_requests_routed", "kvroute_decision_sticky", "kvroute_decision_new_conversation",
		"kvroute_decision_continuation", "kvroute_decision_prefix", "kvroute_decision_load", "kvroute_parse_errors"} {
		v, _ := host.GetCounterMetric(name)
		fmt.Printf("%-36s %d\n", name, v)
	}
}
