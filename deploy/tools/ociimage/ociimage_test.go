package ociimage

import (
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// modules returns the Wasm modules to package: the compiled kvroute filter when `make
// build` has produced it, and always a small synthetic module.
func modules(t *testing.T) map[string][]byte {
	t.Helper()
	synthetic := append(append([]byte{}, wasmMagic...),
		// a custom section named "kvroute" with some payload
		0x00, 0x0c, 0x07, 'k', 'v', 'r', 'o', 'u', 't', 'e', 1, 2, 3, 4)
	mods := map[string][]byte{"synthetic": synthetic}
	if b, err := os.ReadFile(filepath.Join("..", "..", "..", "build", "kvroute.wasm")); err == nil {
		mods["build/kvroute.wasm"] = b
	} else {
		t.Logf("build/kvroute.wasm not built (%v): packaging the synthetic module only", err)
	}
	return mods
}

func rawManifest(t *testing.T, img v1.Image) []byte {
	t.Helper()
	b, err := img.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPushPull pushes the image to an in-process registry, pulls it back and checks
// that everything is byte-identical and that plugin.wasm comes out as Istio reads it.
func TestPushPull(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	for label, wasm := range modules(t) {
		t.Run(label, func(t *testing.T) {
			img, err := Build(wasm, map[string]string{"org.opencontainers.image.source": "https://github.com/kvroute/kvroute"})
			if err != nil {
				t.Fatal(err)
			}
			ref, err := name.ParseReference(host + "/kvroute/kvroute:test")
			if err != nil {
				t.Fatal(err)
			}
			if err := remote.Write(ref, img); err != nil {
				t.Fatal(err)
			}
			pulled, err := remote.Image(ref)
			if err != nil {
				t.Fatal(err)
			}

			// Byte-identical: manifest, config, layer, and the module inside.
			if !bytes.Equal(rawManifest(t, img), rawManifest(t, pulled)) {
				t.Fatalf("manifest differs after the round trip:\n%s\n%s", rawManifest(t, img), rawManifest(t, pulled))
			}
			d1, _ := img.Digest()
			d2, _ := pulled.Digest()
			if d1 != d2 {
				t.Fatalf("digest %s pushed, %s pulled", d1, d2)
			}
			c1, _ := img.RawConfigFile()
			c2, err := pulled.RawConfigFile()
			if err != nil || !bytes.Equal(c1, c2) {
				t.Fatalf("config differs after the round trip (%v)", err)
			}
			want, _ := LayerArchive(wasm)
			layers, err := pulled.Layers()
			if err != nil || len(layers) != 1 {
				t.Fatalf("want one layer, got %d (%v)", len(layers), err)
			}
			rc, err := layers[0].Compressed()
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(rc)
			rc.Close()
			if !bytes.Equal(got, want) {
				t.Fatal("layer blob differs after the round trip")
			}
			plugin, err := ExtractPlugin(pulled)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(plugin, wasm) {
				t.Fatalf("plugin.wasm differs: %d bytes in, %d out", len(wasm), len(plugin))
			}

			// The layout Istio reads (compat variant, OCI media types).
			m, err := pulled.Manifest()
			if err != nil {
				t.Fatal(err)
			}
			if m.MediaType != types.OCIManifestSchema1 || m.Config.MediaType != types.OCIConfigJSON ||
				len(m.Layers) != 1 || m.Layers[0].MediaType != types.OCILayer {
				t.Fatalf("manifest %s, config %s, layers %+v", m.MediaType, m.Config.MediaType, m.Layers)
			}
			if m.Annotations["org.opencontainers.image.source"] == "" {
				t.Error("manifest annotation lost")
			}
			cf, err := pulled.ConfigFile()
			if err != nil || cf.OS != "wasip1" || cf.Architecture != "wasm" {
				t.Fatalf("config platform %s/%s (%v)", cf.OS, cf.Architecture, err)
			}
		})
	}
}

func TestReproducible(t *testing.T) {
	for label, wasm := range modules(t) {
		a, err := Build(wasm, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Build(wasm, nil)
		if err != nil {
			t.Fatal(err)
		}
		da, _ := a.Digest()
		db, _ := b.Digest()
		if da != db {
			t.Fatalf("%s: two builds, two digests: %s %s", label, da, db)
		}
	}
}

func TestRejectsNonWasm(t *testing.T) {
	if _, err := Build([]byte("#!/bin/sh\necho not wasm\n"), nil); err == nil {
		t.Fatal("accepted a file that is not a Wasm module")
	}
}

// TestLayout writes the image as an OCI image layout (what `make image` leaves in
// build/oci) and reads it back.
func TestLayout(t *testing.T) {
	wasm := modules(t)["synthetic"]
	img, err := Build(wasm, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := WriteLayout(dir, img, "kvroute:test"); err != nil {
		t.Fatal(err)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("index: %v %v", im, err)
	}
	if im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "kvroute:test" {
		t.Errorf("ref name annotation: %v", im.Manifests[0].Annotations)
	}
	back, err := p.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ExtractPlugin(back)
	if err != nil || !bytes.Equal(got, wasm) {
		t.Fatalf("plugin.wasm from the layout: %v", err)
	}
	// Writing again replaces the image instead of adding a second one.
	if err := WriteLayout(dir, img, "kvroute:test"); err != nil {
		t.Fatal(err)
	}
	p, _ = layout.FromPath(dir)
	idx, _ = p.ImageIndex()
	if im, _ := idx.IndexManifest(); len(im.Manifests) != 1 {
		t.Fatalf("rewriting the layout left %d images", len(im.Manifests))
	}
}
