// Package ociimage packages kvroute's compiled Wasm module as an OCI image in the
// layout Istio pulls for a WasmPlugin url oci://…: the "compat" variant of the Wasm
// image specification (solo-io/wasm spec-compat, the format Istio's image fetcher reads
// first) — an OCI image manifest whose single layer, of media type
// application/vnd.oci.image.layer.v1.tar+gzip, is a tar archive holding plugin.wasm.
//
// The image is built without a container daemon, with go-containerregistry, and is
// reproducible: the same module gives the same digest (fixed timestamps, owners and
// modes in the tar, a fixed gzip header, no creation time in the config).
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// PluginFileName is the file Istio looks for in the layer.
const PluginFileName = "plugin.wasm"

// wasmMagic is the start of every binary Wasm module: "\0asm" and version 1.
var wasmMagic = []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}

// Build returns the image of a Wasm module. annotations go on the manifest (for
// example org.opencontainers.image.source or .version); nil is fine.
func Build(wasm []byte, annotations map[string]string) (v1.Image, error) {
	if !bytes.HasPrefix(wasm, wasmMagic) {
		return nil, errors.New("not a binary Wasm module (no \\0asm version 1 header)")
	}
	layerBytes, err := LayerArchive(wasm)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:       layer,
		MediaType:   types.OCILayer,
		Annotations: map[string]string{"org.opencontainers.image.title": PluginFileName},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture = "wasm"
	cf.OS = "wasip1"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	if len(annotations) > 0 {
		a, ok := mutate.Annotations(img, annotations).(v1.Image)
		if !ok {
			return nil, errors.New("annotating the manifest did not yield an image")
		}
		img = a
	}
	return img, nil
}

// WriteLayout writes img as the only image of an OCI image layout at dir (created if
// needed; an index already there is replaced), named refName in the index.
func WriteLayout(dir string, img v1.Image, refName string) error {
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": refName,
	}))
}

// Push uploads img to a registry reference such as ghcr.io/you/kvroute:0.1.0, with the
// credentials of the local Docker config (docker login, crane auth login, …). insecure
// allows a plain-HTTP registry.
func Push(ctx context.Context, ref string, img v1.Image, insecure bool) (v1.Hash, error) {
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := remote.Write(r, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return v1.Hash{}, err
	}
	return img.Digest()
}

// LayerArchive is the layer's content: a gzip-compressed tar holding only
// plugin.wasm, byte-for-byte reproducible.
func LayerArchive(wasm []byte) ([]byte, error) {
	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     PluginFileName,
		Mode:     0o644,
		Size:     int64(len(wasm)),
		Format:   tar.FormatPAX,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(wasm); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	var gzBuf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gzBuf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(tarBuf.Bytes()); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return gzBuf.Bytes(), nil
}

// ExtractPlugin reads plugin.wasm back out of an image the way Istio's image fetcher
// does for the compat variant: the last layer must be an OCI tar+gzip layer, and the
// file named plugin.wasm in it is the module.
func ExtractPlugin(img v1.Image) ([]byte, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	if len(layers) == 0 {
		return nil, errors.New("image has no layer")
	}
	l := layers[len(layers)-1]
	mt, err := l.MediaType()
	if err != nil {
		return nil, err
	}
	if mt != types.OCILayer {
		return nil, fmt.Errorf("layer media type %s, Istio wants %s", mt, types.OCILayer)
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	zr, err := gzip.NewReader(rc)
	if err != nil {
		return nil, fmt.Errorf("layer is not gzip: %w", err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s not found in the layer", PluginFileName)
		}
		if err != nil {
			return nil, err
		}
		if h.Name == PluginFileName {
			return io.ReadAll(tr)
		}
	}
}
