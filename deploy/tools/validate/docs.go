// Package validate checks kvroute's deployment files strictly: Envoy bootstraps
// against Envoy's API (go-control-plane), Istio resources against Istio's API
// (istio.io/api), Kubernetes and Gateway API objects against their Go types,
// kustomizations by rendering them, and every embedded plugin configuration with
// kvroute's own parser (routing.ParseConfig). On top of the schemas it checks that
// the pieces fit together: the clusters the plugin names exist, the destination
// header is honoured only for hosts of the fleet, the owned headers are stripped
// before any filter, buffers are large enough and the stats tags produce labels.
package validate

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/reflect/protoreflect"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Doc is one YAML document of a file.
type Doc struct {
	Source string // file path, with the document index when the file holds several
	Raw    []byte // the YAML text of this document
	JSON   []byte // the same document as JSON (duplicate keys refused)
	Kind   string // "Bootstrap", "PluginConfig" (kvroute's own JSON), else the Kubernetes kind
	Group  string // API group ("" for core and for Envoy bootstraps)
	Ver    string // API version within the group
}

// SplitDocs cuts a YAML stream into documents, skipping empty ones, and converts each
// to JSON, refusing duplicate keys.
func SplitDocs(source string, data []byte) ([]Doc, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs []Doc
	for i := 0; ; i++ {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		if len(bytes.TrimSpace(stripComments(raw))) == 0 {
			continue
		}
		src := source
		if bytes.HasPrefix(data, []byte("---")) || bytes.Contains(data, []byte("\n---")) {
			src = fmt.Sprintf("%s[doc %d]", source, i)
		}
		if err := syntaxCheck(raw, strings.HasSuffix(source, ".json")); err != nil {
			return nil, fmt.Errorf("%s:%w", src, err)
		}
		js, err := yaml.YAMLToJSONStrict(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", src, err)
		}
		d := Doc{Source: src, Raw: raw, JSON: js}
		if err := d.classify(); err != nil {
			return nil, err
		}
		docs = append(docs, d)
	}
	return docs, nil
}

func stripComments(b []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] == '#' {
			continue
		}
		out = append(out, l)
	}
	return bytes.Join(out, []byte("\n"))
}

func (d *Doc) classify() error {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(d.JSON, &head); err != nil {
		return fmt.Errorf("%s: %w", d.Source, err)
	}
	if head.APIVersion == "" && head.Kind == "" {
		// No Kubernetes header: an Envoy bootstrap, or kvroute's plugin configuration
		// on its own (the JSON a WasmPlugin's pluginConfig or the wasm filter's
		// configuration holds). A bootstrap has at least one of its fields at the top.
		d.Kind = "PluginConfig"
		var top map[string]json.RawMessage
		if err := json.Unmarshal(d.JSON, &top); err != nil {
			return fmt.Errorf("%s: neither an Envoy bootstrap nor a kvroute plugin configuration: not a mapping", d.Source)
		}
		for k := range top {
			if isBootstrapField(k) {
				d.Kind = "Bootstrap"
			}
		}
		return nil
	}
	if head.APIVersion == "" || head.Kind == "" {
		return fmt.Errorf("%s: apiVersion and kind must both be set", d.Source)
	}
	d.Kind = head.Kind
	if g, v, ok := strings.Cut(head.APIVersion, "/"); ok {
		d.Group, d.Ver = g, v
	} else {
		d.Ver = head.APIVersion
	}
	return nil
}

// ShippedFiles lists every YAML file under deploy/ and istio/ of the repository
// root, except the Go tooling's own tree.
func ShippedFiles(root string) ([]string, error) {
	var files []string
	for _, top := range []string{"deploy", "istio"} {
		dir := filepath.Join(root, top)
		err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if e.IsDir() && p == filepath.Join(root, "deploy", "tools") {
				return fs.SkipDir
			}
			if !e.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
				files = append(files, p)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	sort.Strings(files)
	return files, nil
}

// RepoRoot finds the kvroute repository root from dir upwards.
func RepoRoot(dir string) (string, error) {
	d, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && bytes.HasPrefix(bytes.TrimSpace(b), []byte("module github.com/kvroute/kvroute\n")) {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("no kvroute repository root above %s", dir)
		}
		d = parent
	}
}

// isBootstrapField says whether a top-level key names a field of Envoy's Bootstrap,
// in either of the spellings Envoy accepts.
func isBootstrapField(k string) bool {
	fields := (&bootstrapv3.Bootstrap{}).ProtoReflect().Descriptor().Fields()
	return fields.ByName(protoreflect.Name(k)) != nil || fields.ByJSONName(k) != nil
}

// syntaxCheck reports where a document stops being valid: a JSON document (a .json
// file, or one that opens with '{"') at its line and column by JSON's rules, which
// are stricter than YAML's (YAML takes a trailing comma, for one); YAML at the line
// the YAML parser names, with that line's text. The message starts with the position, to follow
// "file:".
func syntaxCheck(raw []byte, isJSON bool) error {
	if isJSON || looksJSON(raw) {
		return jsonSyntax(raw)
	}
	var v any
	err := yaml.Unmarshal(raw, &v)
	if err == nil {
		return nil
	}
	msg := strings.TrimPrefix(err.Error(), "error converting YAML to JSON: ")
	msg = strings.TrimPrefix(msg, "yaml: ")
	var line int
	if _, scanErr := fmt.Sscanf(msg, "line %d:", &line); scanErr == nil && line > 0 {
		msg = strings.TrimSpace(msg[strings.IndexByte(msg, ':')+1:])
		lines := strings.Split(string(raw), "\n")
		text := ""
		if line <= len(lines) {
			text = strings.TrimSpace(lines[line-1])
		}
		// The YAML parsers name a line only, and for a structure error the line
		// where the enclosing block starts: show it rather than guess a column.
		return fmt.Errorf("%d: invalid YAML: %s (at or after line %d: %q)", line, msg, line, text)
	}
	return fmt.Errorf(" invalid YAML: %s", msg)
}

// looksJSON says whether a document opens as a JSON object: '{' then '"'.
func looksJSON(raw []byte) bool {
	t := bytes.TrimLeft(raw, " \t\r\n")
	if len(t) == 0 || t[0] != '{' {
		return false
	}
	t = bytes.TrimLeft(t[1:], " \t\r\n")
	return len(t) > 0 && (t[0] == '"' || t[0] == '}')
}

// jsonSyntax reports the first JSON syntax error of data as "LINE:COLUMN: ...".
func jsonSyntax(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var v any
	err := dec.Decode(&v)
	if err == nil {
		if _, err2 := dec.Token(); err2 != io.EOF {
			off := dec.InputOffset()
			line, col := lineCol(data, off)
			return fmt.Errorf("%d:%d: invalid JSON: more after the end of the value", line, col)
		}
		return nil
	}
	var off int64 = int64(len(data))
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		off = se.Offset
	case errors.As(err, &te):
		off = te.Offset
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		// Just past the last character written.
		line, col := lineCol(data, int64(len(bytes.TrimRight(data, " \t\r\n"))))
		return fmt.Errorf("%d:%d: invalid JSON: unexpected end of input", line, col+1)
	}
	line, col := lineCol(data, off)
	return fmt.Errorf("%d:%d: invalid JSON: %s", line, col, err)
}

// lineCol turns a byte offset into a 1-based line and column (in bytes). A syntax
// error's offset is just past the offending byte.
func lineCol(data []byte, off int64) (int, int) {
	off = max(0, min(off, int64(len(data))))
	before := data[:off]
	line := bytes.Count(before, []byte("\n")) + 1
	col := len(before) - (bytes.LastIndexByte(before, '\n') + 1)
	return line, max(col, 1)
}
