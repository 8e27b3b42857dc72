package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func TestPatchAppliesToTheInstalledGo(t *testing.T) {
	out := t.TempDir()
	if err := write(runtime.GOROOT(), out); err != nil {
		t.Fatal(err)
	}
	js, err := os.ReadFile(filepath.Join(out, "overlay.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ov overlay
	if err := json.Unmarshal(js, &ov); err != nil {
		t.Fatal(err)
	}
	if len(ov.Replace) != 2 {
		t.Fatalf("overlay replaces %d files, want os_wasip1.go and netpoll_wasip1.go", len(ov.Replace))
	}
	for orig, patched := range ov.Replace {
		text, err := os.ReadFile(patched)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(text), "_ENOSYS") {
			t.Errorf("%s: patched copy %s does not handle ENOSYS", orig, patched)
		}
	}
}

func TestPatchFailsLoudlyWhenGoChanged(t *testing.T) {
	stock := func(name string) ([]byte, error) {
		return os.ReadFile(filepath.Join(runtime.GOROOT(), "src", "runtime", name))
	}
	changed := func(name string) ([]byte, error) {
		b, err := stock(name)
		if name == "os_wasip1.go" {
			b = []byte(strings.ReplaceAll(string(b), "poll_oneoff(&in, &out, 1, &nevents)", "pollOneoff(&in, &out)"))
		}
		return b, err
	}
	if _, err := patch(stock); err != nil {
		t.Fatalf("stock runtime: %v", err)
	}
	_, err := patch(changed)
	if err == nil || !strings.Contains(err.Error(), "runtime/os_wasip1.go") {
		t.Fatalf("a runtime without the expected lines must be refused naming the file, got %v", err)
	}
}
