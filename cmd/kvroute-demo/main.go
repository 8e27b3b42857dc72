// Command kvroute-demo routes the sample requests under testdata/requests through the
// compiled filter in the proxy-wasm SDK host emulator and prints each decision.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
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
	vm, err := proxytest.NewWasmVMContext(bin)
	if err != nil {
		log.Fatalf("kvroute-demo: loading %s: %v", *wasmPath, err)
	}
	defer vm.Close()
	// The emulator logs every host call; the demo prints only its own lines.
	log.SetOutput(io.Discard)
	if err := run(vm, *dir, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kvroute-demo:", err)
		os.Exit(1)
	}
}

// counters are the counters the demo prints at the end.
var counters = []string{"kvroute_requests_routed", "kvroute_decision_sticky", "kvroute_decision_new_conversation",
	"kvroute_decision_continuation", "kvroute_decision_prefix", "kvroute_decision_load", "kvroute_parse_errors",
	"kvroute_prompt_tokens", "kvroute_prefix_matched_tokens"}

// run routes every request of dir's *.jsonl files through the filter in vm, with
// dir/config.json as the plugin configuration, and writes one line per decision and
// then the counters.
func run(vm types.VMContext, dir string, out io.Writer) error {
	config, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return err
	}
	host, reset := proxytest.NewHostEmulator(proxytest.NewEmulatorOption().
		WithVMContext(vm).WithPluginConfiguration(config))
	defer reset()
	if host.StartVM() != types.OnVMStartStatusOK || host.StartPlugin() != types.OnPluginStartStatusOK {
		return fmt.Errorf("the plugin refused the config: %v", host.GetCriticalLogs())
	}
	// Parse errors are counted at once, so each row's shows as the counter moves.
	parseErrors := func() uint64 { v, _ := host.GetCounterMetric("kvroute_parse_errors"); return v }

	files, _ := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	sort.Strings(files)
	fmt.Fprintf(out, "%-4s %-31s %-22s %-6s %-26s %s\n", "#", "file:row", "endpoint", "rank", "decision", "conversation")
	n := 0
	var unparsable []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for row := 1; sc.Scan(); row++ {
			line := sc.Bytes()
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			n++
			where := filepath.Base(f) + ":" + strconv.Itoa(row)
			if !gjson.ValidBytes(line) {
				return fmt.Errorf("%s: not a JSON request line", where)
			}
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
			before := parseErrors()
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
			decision := get("x-kvroute-decision")
			if parseErrors() > before {
				decision += " (parse error)"
				unparsable = append(unparsable, where)
			}
			fmt.Fprintf(out, "%-4d %-31s %-22s %-6s %-26s %s\n", n, where, get("x-gateway-destination-endpoint"),
				get("x-data-parallel-rank"), decision, conv)
			host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
			host.CompleteHttpContext(id)
		}
	}
	// The filter adds per-request counts up in the VM and hands them to Envoy on its
	// tick; tick once, as Envoy would within 100 ms, before reading them.
	host.Tick()
	fmt.Fprintln(out)
	for _, name := range counters {
		v, _ := host.GetCounterMetric(name)
		fmt.Fprintf(out, "%-36s %d\n", name, v)
	}
	for _, w := range unparsable {
		fmt.Fprintf(out, "parse error: %s (its body is not a request the filter can read: routed by load)\n", w)
	}
	return nil
}
