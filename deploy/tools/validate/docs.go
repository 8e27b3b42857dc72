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
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Doc is one YAML document of a file.
type Doc struct {
	Source string // file path, with the document index when the file holds several
	Raw    []byte // the YAML text of this document
	JSON   []byte // the same document as JSON (duplicate keys refused)
	Kind   string // "Bootstrap" for an Envoy bootstrap, else the Kubernetes kind
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
		// No Kubernetes header: the only other thing shipped is an Envoy bootstrap.
		d.Kind = "Bootstrap"
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
