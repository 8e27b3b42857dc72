package config

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// configDocsPath is the operator's configuration reference, which must name every
// field of Config, with its type and default, and nothing else.
const configDocsPath = "../../docs/configuration.md"

// docRow is one field row of the reference: | `path` | type | default | range | meaning |.
type docRow struct {
	line          int
	typ, defaults string
}

// docFieldCell matches a first cell that is one backticked field path.
var docFieldCell = regexp.MustCompile("^`([a-z_<>\\[\\].]+)`$")

// docJSONCell matches a default cell that is one backticked JSON literal; other
// defaults ("— (required)", prose) are not compared.
var docJSONCell = regexp.MustCompile("^`([^`]*)`$")

func readConfigDocs(t *testing.T) map[string]docRow {
	t.Helper()
	f, err := os.Open(configDocsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows := map[string]docRow{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := splitTableRow(line)
		m := docFieldCell.FindStringSubmatch(cells[0])
		if m == nil {
			continue
		}
		if len(cells) != 5 {
			t.Errorf("%s:%d: want 5 cells (field, type, default, range, meaning), got %d", configDocsPath, n, len(cells))
			continue
		}
		if prev, dup := rows[m[1]]; dup {
			t.Errorf("%s:%d: %s documented twice (also line %d)", configDocsPath, n, m[1], prev.line)
		}
		rows[m[1]] = docRow{line: n, typ: cells[1], defaults: cells[2]}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rows
}

// splitTableRow splits a markdown table row on the pipes that are not escaped (\|).
func splitTableRow(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|")
	var cells []string
	var cur strings.Builder
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '\\' && i+1 < len(line) && line[i+1] == '|':
			cur.WriteByte('|')
			i++
		case line[i] == '|':
			cells = append(cells, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteByte(line[i])
		}
	}
	return append(cells, strings.TrimSpace(cur.String()))
}

// configField is one field of the Config structs, by its JSON path.
type configField struct {
	typ   reflect.Type
	value reflect.Value // in the parsed minimal configuration; invalid when it has none
}

// configFields walks the Config structs: every field that is not itself a struct of
// fields, by its JSON path. The pools' shared Endpoint fields are written once, under
// pools.<pool>.endpoints[].
func configFields(v reflect.Value) map[string]configField {
	out := map[string]configField{}
	var walk func(prefix string, t reflect.Type, v reflect.Value)
	walk = func(prefix string, t reflect.Type, v reflect.Value) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			path := prefix + snakeCase(f.Name)
			var fv reflect.Value
			if v.IsValid() {
				fv = v.Field(i)
			}
			switch {
			case f.Anonymous:
				walk(prefix, f.Type, fv)
			case strings.HasPrefix(path, "models[].") && f.Type.Kind() == reflect.Struct:
				// A fleet's pools and disaggregation are the top-level blocks again:
				// one row each, pointing to them.
				out[path] = configField{typ: f.Type, value: fv}
			case f.Type.Kind() == reflect.Struct:
				walk(path+".", f.Type, fv)
			case f.Type.Kind() == reflect.Pointer && f.Type.Elem().Kind() == reflect.Struct:
				// An optional block (pools.<pool>.discovery), written once for both pools.
				var el reflect.Value
				if fv.IsValid() && !fv.IsNil() {
					el = fv.Elem()
				}
				prefix := path + "."
				if strings.HasPrefix(path, "pools.") {
					prefix = "pools.<pool>." + path[strings.LastIndexByte(path, '.')+1:] + "."
					if _, seen := out[prefix+snakeCase(f.Type.Elem().Field(0).Name)]; seen && !el.IsValid() {
						continue // keep the pool that has one
					}
				}
				walk(prefix, f.Type.Elem(), el)
			case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
				out[path] = configField{typ: f.Type, value: fv}
				var el reflect.Value
				if fv.IsValid() && fv.Len() > 0 {
					el = fv.Index(0)
				}
				elPrefix := path + "[]."
				if strings.HasPrefix(path, "pools.") {
					elPrefix = "pools.<pool>.endpoints[]."
					if _, seen := out[elPrefix+"address"]; seen && !el.IsValid() {
						continue // keep the element of the pool that has one
					}
				}
				walk(elPrefix, f.Type.Elem(), el)
			default:
				out[path] = configField{typ: f.Type, value: fv}
			}
		}
	}
	walk("", v.Type(), v)
	return out
}

// snakeCase turns a Go field name into its JSON name: TrustClientDPRank →
// trust_client_dp_rank, MaxCASRetries → max_cas_retries.
func snakeCase(name string) string {
	r := []rune(name)
	var b strings.Builder
	for i, c := range r {
		if i > 0 && unicode.IsUpper(c) &&
			(unicode.IsLower(r[i-1]) || unicode.IsDigit(r[i-1]) ||
				i+1 < len(r) && unicode.IsUpper(r[i-1]) && unicode.IsLower(r[i+1])) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return b.String()
}

func docTypeOf(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int64:
		return "integer"
	case reflect.Float64:
		return "number"
	case reflect.String:
		return "string"
	case reflect.Struct:
		return "object"
	case reflect.Slice:
		switch t.Elem().Kind() {
		case reflect.String:
			return "array of strings"
		case reflect.Int:
			return "array of integers"
		case reflect.Struct:
			return "array of objects"
		}
	}
	return "unknown Go type " + t.String()
}

// nullAt is a configuration with null at path (pools.<pool> becomes pool): the
// parser answers "must not be null" for a field it knows and "unknown field" for one
// it does not.
func nullAt(path, pool string) string {
	path = strings.Replace(path, "<pool>", pool, 1)
	parts := strings.Split(path, ".")
	doc := "null"
	for i := len(parts) - 1; i >= 0; i-- {
		name, isArray := strings.CutSuffix(parts[i], "[]")
		if isArray {
			doc = "[" + doc + "]"
		}
		doc = `{"` + name + `":` + doc + `}`
	}
	return doc
}

// TestConfigDocs holds docs/configuration.md to the code: one row per field of the
// Config structs, every row a field the parser knows, with the field's JSON type and,
// where the row gives one as a JSON literal, its default.
func TestConfigDocs(t *testing.T) {
	rows := readConfigDocs(t)
	minimal, err := ParseConfig([]byte(`{"pools": {"decode": {"endpoints": [{"address": "10.0.0.1:8000"}],
		"discovery": {"service_cluster": "vllm"}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	fields := configFields(reflect.ValueOf(minimal))

	var paths []string
	for p := range fields {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		f := fields[p]
		row, ok := rows[p]
		if !ok {
			t.Errorf("%s: no row for the config field %s (add `| `%s` | %s | default | range | meaning |`)",
				configDocsPath, p, p, docTypeOf(f.typ))
			continue
		}
		if want := docTypeOf(f.typ); row.typ != want {
			t.Errorf("%s:%d: %s has type %q, the code has %q", configDocsPath, row.line, p, row.typ, want)
		}
		m := docJSONCell.FindStringSubmatch(row.defaults)
		if m == nil || !f.value.IsValid() {
			continue
		}
		var doc any
		if err := json.Unmarshal([]byte(m[1]), &doc); err != nil {
			t.Errorf("%s:%d: default of %s is not a JSON literal: %v", configDocsPath, row.line, p, err)
			continue
		}
		v := f.value.Interface()
		if f.value.Kind() == reflect.Slice && f.value.IsNil() {
			v = []any{}
		}
		raw, _ := json.Marshal(v)
		var code any
		_ = json.Unmarshal(raw, &code)
		if !reflect.DeepEqual(doc, code) {
			t.Errorf("%s:%d: %s defaults to %s in the docs, %s in the code", configDocsPath, row.line, p, m[1], raw)
		}
	}

	var docPaths []string
	for p := range rows {
		docPaths = append(docPaths, p)
	}
	sort.Strings(docPaths)
	for _, p := range docPaths {
		if _, ok := fields[p]; !ok {
			t.Errorf("%s:%d: %s is not a field of the Config structs", configDocsPath, rows[p].line, p)
		}
		pools := []string{""}
		if strings.Contains(p, "<pool>") {
			pools = []string{"decode", "prefill"}
		}
		for _, pool := range pools {
			doc := nullAt(p, pool)
			_, err := ParseConfig([]byte(doc))
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Reason != "must not be null" {
				t.Errorf("%s:%d: the parser does not take %s: %s gives %v", configDocsPath, rows[p].line, p, doc, err)
			}
		}
	}
}

// TestConfigDocsCatchesDrift shows the check can fail: a field the docs lack, a type
// that differs, and a path the parser does not know.
func TestConfigDocsCatchesDrift(t *testing.T) {
	type extra struct {
		Config
		Fresh struct{ NewKnob int }
	}
	fields := configFields(reflect.ValueOf(extra{Config: DefaultConfig()}))
	if _, ok := fields["fresh.new_knob"]; !ok {
		t.Fatalf("a new nested field is not seen: %v", fields)
	}
	if _, ok := fields["routes"]; !ok {
		t.Fatal("an embedded Config's fields are not seen")
	}
	if got := docTypeOf(reflect.TypeOf(1.5)); got != "number" {
		t.Errorf("float type: %q", got)
	}
	_, err := ParseConfig([]byte(nullAt("prefix.no_such_knob", "")))
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Reason != "unknown field" {
		t.Errorf("an unknown path is not refused as unknown: %v", err)
	}
	for name, want := range map[string]string{
		"TrustClientDPRank": "trust_client_dp_rank",
		"MaxCASRetries":     "max_cas_retries",
		"PrefillTimeoutMS":  "prefill_timeout_ms",
		"DPSize":            "dp_size",
		"EngineMetrics":     "engine_metrics",
	} {
		if got := snakeCase(name); got != want {
			t.Errorf("snakeCase(%s) = %s, want %s", name, got, want)
		}
	}
	if got := nullAt("pools.<pool>.endpoints[].address", "prefill"); got != `{"pools":{"prefill":{"endpoints":[{"address":null}]}}}` {
		t.Errorf("nullAt: %s", got)
	}
}
