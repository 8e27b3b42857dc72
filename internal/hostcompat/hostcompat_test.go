package hostcompat

import (
	"context"
	"reflect"
	"testing"
)

// moduleImporting returns a minimal wasm module that imports each of funcs
// ("module.name") as a function of type () -> ().
func moduleImporting(funcs ...[2]string) []byte {
	vec := func(b ...[]byte) []byte {
		var out []byte
		for _, x := range b {
			out = append(out, x...)
		}
		return out
	}
	name := func(s string) []byte { return append([]byte{byte(len(s))}, s...) }
	section := func(id byte, body []byte) []byte { return append([]byte{id, byte(len(body))}, body...) }
	imports := []byte{byte(len(funcs))}
	for _, f := range funcs {
		imports = append(imports, vec(name(f[0]), name(f[1]), []byte{0x00, 0x00})...)
	}
	return vec([]byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00},
		section(0x01, []byte{0x01, 0x60, 0x00, 0x00}),
		section(0x02, imports))
}

func TestImportListIsTheHosts(t *testing.T) {
	imports := Imports()
	if len(imports) != 61 {
		t.Fatalf("read %d imports, want the host's 61 (43 proxy-wasm, 18 WASI)", len(imports))
	}
	for _, want := range []string{"env.proxy_log", "wasi_snapshot_preview1.poll_oneoff", "wasi_snapshot_preview1.fd_prestat_dir_name"} {
		if !imports[want] {
			t.Errorf("%s missing from the list", want)
		}
	}
	if imports["wasi_snapshot_preview1.path_filestat_get"] {
		t.Error("path_filestat_get is not provided by that host")
	}
}

func TestForeignImports(t *testing.T) {
	mod := moduleImporting(
		[2]string{"env", "proxy_log"},
		[2]string{"wasi_snapshot_preview1", "path_filestat_get"},
		[2]string{"wasi_snapshot_preview1", "fd_write"},
		[2]string{"env", "proxy_log"},
	)
	all, err := ModuleImports(context.Background(), mod)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"env.proxy_log", "wasi_snapshot_preview1.fd_write", "wasi_snapshot_preview1.path_filestat_get"}
	if !reflect.DeepEqual(all, want) {
		t.Fatalf("imports %v, want %v", all, want)
	}
	foreign, err := ForeignImports(context.Background(), mod)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(foreign, []string{"wasi_snapshot_preview1.path_filestat_get"}) {
		t.Fatalf("foreign %v", foreign)
	}
}
