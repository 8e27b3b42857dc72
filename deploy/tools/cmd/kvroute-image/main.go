// Command kvroute-image packages the compiled kvroute filter as an OCI image in the
// layout Istio pulls for a WasmPlugin url oci://… (one tar+gzip layer holding
// plugin.wasm), without a container daemon. It always writes an OCI image layout
// directory; with -push it also uploads the image to a registry, using the
// credentials of the local Docker config (docker login, crane auth login).
//
//	make image                                   # build/kvroute.wasm → build/oci
//	make image PUSH=ghcr.io/you/kvroute:0.1.0    # … and push it
//
//	go run ./cmd/kvroute-image -wasm ../../build/kvroute.wasm -layout ../../build/oci [-push REF] [-insecure]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/kvroute/kvroute/deploy/tools/ociimage"
)

func main() {
	wasmPath := flag.String("wasm", "build/kvroute.wasm", "the compiled filter")
	layoutDir := flag.String("layout", "build/oci", "OCI image layout directory to write")
	refName := flag.String("name", "kvroute:latest", "name of the image inside the layout")
	push := flag.String("push", "", "registry reference to push to, e.g. ghcr.io/you/kvroute:0.1.0")
	insecure := flag.Bool("insecure", false, "allow a plain-HTTP registry for -push")
	source := flag.String("source", "https://github.com/kvroute/kvroute", "org.opencontainers.image.source annotation")
	flag.Parse()

	wasm, err := os.ReadFile(*wasmPath)
	if err != nil {
		fail("%v (run `make build` first)", err)
	}
	img, err := ociimage.Build(wasm, map[string]string{"org.opencontainers.image.source": *source})
	if err != nil {
		fail("%s: %v", *wasmPath, err)
	}
	digest, err := img.Digest()
	if err != nil {
		fail("%v", err)
	}
	if err := ociimage.WriteLayout(*layoutDir, img, *refName); err != nil {
		fail("writing %s: %v", *layoutDir, err)
	}
	fmt.Printf("kvroute-image: %s (%d bytes of wasm) → OCI layout %s, %s\n", *wasmPath, len(wasm), *layoutDir, digest)
	if *push != "" {
		d, err := ociimage.Push(context.Background(), *push, img, *insecure)
		if err != nil {
			fail("pushing %s: %v", *push, err)
		}
		fmt.Printf("kvroute-image: pushed %s@%s\n", *push, d)
		fmt.Printf("kvroute-image: WasmPlugin url: oci://%s (pin it with sha256: %s)\n", *push, d.Hex)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kvroute-image: "+format+"\n", args...)
	os.Exit(1)
}
