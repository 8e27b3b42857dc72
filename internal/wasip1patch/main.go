// Command wasip1patch writes a `go build -overlay` that lets a Go wasip1 module run in
// the proxy-wasm hosts of Envoy and Istio releases built before proxy-wasm-cpp-host
// #533.
//
// Those hosts answer every wasi_snapshot_preview1.poll_oneoff with ENOSYS. Go's wasip1
// runtime throws on any poll_oneoff error, in usleep and in netpoll, and the garbage
// collector reaches both, so an unpatched module dies at its first collection. Newer
// hosts answer 0 with no events; the patch makes the runtime read ENOSYS the same way.
// A proxy-wasm guest is single-threaded and is only ever entered by the host, so it
// has nothing to wait for: returning at once is what the newer hosts do too.
//
// The patched files are generated from the installed Go's own source at build time
// (no Go source is committed). If a Go release changes the lines the patch expects,
// the command fails and names the file, rather than build a module that would die.
//
//	go run ./internal/wasip1patch -goroot "$(go env GOROOT)" -out build/wasip1patch
//	GOOS=wasip1 GOARCH=wasm go build -overlay build/wasip1patch/overlay.json ...
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// edit replaces one exact, unique piece of a runtime source file.
type edit struct {
	file string // under GOROOT/src/runtime
	old  string // must occur exactly once
	new  string
}

var edits = []edit{
	{
		file: "netpoll_wasip1.go",
		old:  "const _EINTR = 27\n",
		new: "const _EINTR = 27\n\n" +
			"// _ENOSYS is what proxy-wasm hosts before proxy-wasm-cpp-host #533 answer to every\n" +
			"// poll_oneoff (kvroute's wasip1patch).\n" +
			"const _ENOSYS = 52\n",
	},
	{
		file: "netpoll_wasip1.go",
		old: "\terrno := poll_oneoff(&pollsubs[0], &evts[0], uint32(len(pollsubs)), &nevents)\n" +
			"\tif errno != 0 {\n",
		new: "\terrno := poll_oneoff(&pollsubs[0], &evts[0], uint32(len(pollsubs)), &nevents)\n" +
			"\tif errno == _ENOSYS { // nothing to wait for (kvroute's wasip1patch)\n" +
			"\t\tunlock(&mtx)\n" +
			"\t\treturn gList{}, 0\n" +
			"\t}\n" +
			"\tif errno != 0 {\n",
	},
	{
		file: "os_wasip1.go",
		old: "\tif poll_oneoff(&in, &out, 1, &nevents) != 0 {\n" +
			"\t\tthrow(\"wasi_snapshot_preview1.poll_oneoff\")\n",
		new: "\tif errno := poll_oneoff(&in, &out, 1, &nevents); errno != 0 && errno != _ENOSYS { // kvroute's wasip1patch\n" +
			"\t\tthrow(\"wasi_snapshot_preview1.poll_oneoff\")\n",
	},
}

// overlay is the file format of `go build -overlay`.
type overlay struct {
	Replace map[string]string
}

func main() {
	goroot := flag.String("goroot", "", "the Go installation to patch (go env GOROOT)")
	out := flag.String("out", "build/wasip1patch", "directory for the patched files and overlay.json")
	flag.Parse()
	if err := write(*goroot, *out); err != nil {
		fmt.Fprintln(os.Stderr, "wasip1patch:", err)
		os.Exit(1)
	}
}

// write patches the runtime files of goroot into out and writes out/overlay.json.
func write(goroot, out string) error {
	if goroot == "" {
		return errors.New("-goroot is required")
	}
	runtimeDir := filepath.Join(goroot, "src", "runtime")
	patched, err := patch(func(name string) ([]byte, error) {
		return os.ReadFile(filepath.Join(runtimeDir, name))
	})
	if err != nil {
		return err
	}
	absOut, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(absOut, 0o755); err != nil {
		return err
	}
	ov := overlay{Replace: map[string]string{}}
	for name, text := range patched {
		dst := filepath.Join(absOut, name)
		if err := os.WriteFile(dst, []byte(text), 0o644); err != nil {
			return err
		}
		ov.Replace[filepath.Join(runtimeDir, name)] = dst
	}
	js, err := json.MarshalIndent(ov, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(absOut, "overlay.json"), append(js, '\n'), 0o644)
}

// patch applies every edit to the files read returns, and returns the patched files
// by name. An edit whose text is missing or not unique is an error naming the file.
func patch(read func(name string) ([]byte, error)) (map[string]string, error) {
	files := map[string]string{}
	for _, e := range edits {
		text, ok := files[e.file]
		if !ok {
			b, err := read(e.file)
			if err != nil {
				return nil, fmt.Errorf("runtime/%s: %w", e.file, err)
			}
			text = string(b)
		}
		if n := strings.Count(text, e.old); n != 1 {
			return nil, fmt.Errorf("runtime/%s: expected exactly one %q, found %d: this Go release "+
				"changed the code the patch edits; update internal/wasip1patch", e.file, firstLine(e.old), n)
		}
		files[e.file] = strings.Replace(text, e.old, e.new, 1)
	}
	return files, nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
