// Command kvroute-check validates kvroute deployment files the way the test suite
// validates the shipped ones: Envoy bootstraps against Envoy's API (every typed_config
// unpacked and validated) and what kvroute needs (owned headers stripped early, the
// destination honoured only for fleet hosts, buffers, timeouts, stats tags, the
// clusters the plugin calls), Istio and Kubernetes objects against their APIs,
// kustomization directories rendered and checked as a whole, and every embedded plugin
// configuration with kvroute's own parser. A file that holds only kvroute's plugin
// configuration (JSON or YAML, no Envoy bootstrap field at its top) is checked as
// one. Syntax errors name the line (and, in JSON, the column). Run it before loading
// a configuration: Envoy refuses to start when the plugin refuses its configuration.
//
//	cd deploy/tools && go run ./cmd/kvroute-check ../envoy/override-host.yaml ../../istio/examples/vllm-dp
//	cd deploy/tools && go run ./cmd/kvroute-check ../../testdata/replay/kvroute.json
//	cd deploy/tools && go run ./cmd/kvroute-check            # every shipped file
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/kvroute/kvroute/deploy/tools/validate"
)

func main() {
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: kvroute-check [FILE.yaml | PLUGIN-CONFIG.json | KUSTOMIZATION-DIR]...  (no argument: every file under deploy/ and istio/)")
	}
	flag.Parse()
	if flag.NArg() == 0 {
		root, err := validate.RepoRoot(".")
		if err != nil {
			fail(err)
		}
		res, err := validate.CheckTree(root)
		if err != nil {
			fail(err)
		}
		fmt.Printf("kvroute-check: ok: %d files, %d kustomizations\n", len(res.Files), len(res.Kustomizations))
		return
	}
	bad := false
	for _, arg := range flag.Args() {
		st, err := os.Stat(arg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			bad = true
			continue
		}
		if st.IsDir() {
			_, _, err = validate.Render(arg)
		} else {
			_, _, err = validate.CheckFile(arg)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "kvroute-check: %v\n", err)
			bad = true
			continue
		}
		fmt.Printf("kvroute-check: ok: %s\n", arg)
	}
	if bad {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "kvroute-check: %v\n", err)
	os.Exit(1)
}
