package validate

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/kvroute/kvroute/routing/config"
)

// Result is what checking a set of files found.
type Result struct {
	Files          []string // every YAML file checked
	Bootstraps     map[string][]config.Config
	Kustomizations map[string][]config.Config // rendered kustomization dir → plugin configs
	Docs           int
}

// CheckFile validates every document of one file on its own: an Envoy bootstrap fully
// (API and kvroute's needs), kvroute's plugin configuration on its own with kvroute's
// parser, a Kubernetes-style document against its kind's API.
func CheckFile(path string) ([]config.Config, []*Object, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	docs, err := SplitDocs(path, data)
	if err != nil {
		return nil, nil, err
	}
	if len(docs) == 0 {
		return nil, nil, fmt.Errorf("%s: no YAML document", path)
	}
	var cfgs []config.Config
	var objs []*Object
	var errs []error
	for _, d := range docs {
		switch d.Kind {
		case "Bootstrap":
			c, err := CheckBootstrap(d.Source, d.JSON)
			errs = append(errs, err)
			cfgs = append(cfgs, c...)
			continue
		case "PluginConfig":
			c, err := CheckPluginConfig(d.Source, d.JSON)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			cfgs = append(cfgs, c)
			continue
		}
		o, err := CheckObject(d)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		objs = append(objs, o)
	}
	return cfgs, objs, errors.Join(errs...)
}

// Render builds a kustomization directory with kustomize and validates every
// resource it produces, then the set as a whole (CheckIstioSet).
func Render(dir string) ([]config.Config, []*Object, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: kustomize build: %w", dir, err)
	}
	out, err := rm.AsYaml()
	if err != nil {
		return nil, nil, err
	}
	docs, err := SplitDocs("kustomize build "+dir, out)
	if err != nil {
		return nil, nil, err
	}
	var objs []*Object
	var errs []error
	for _, d := range docs {
		o, err := CheckObject(d)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		objs = append(objs, o)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	cfgs, err := CheckIstioSet("kustomize build "+dir, objs)
	return cfgs, objs, err
}

// CheckTree validates every YAML file under root's deploy/ and istio/: each on its
// own, each kustomization rendered and checked as a set, and every Kubernetes-style
// file part of at least one kustomization (so that the set checks cover it).
func CheckTree(root string) (*Result, error) {
	files, err := ShippedFiles(root)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no YAML files under %s/deploy or %s/istio", root, root)
	}
	res := &Result{Files: files, Bootstraps: map[string][]config.Config{}, Kustomizations: map[string][]config.Config{}}
	var errs []error
	var kdirs []string
	covered := map[string]bool{}
	var objectFiles []string
	for _, f := range files {
		cfgs, objs, err := CheckFile(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		res.Docs += len(cfgs) + len(objs)
		if len(cfgs) > 0 {
			res.Bootstraps[f] = cfgs
		}
		for _, o := range objs {
			if o.Kustomization != nil {
				dir := filepath.Dir(f)
				kdirs = append(kdirs, dir)
				for _, r := range o.Kustomization.Resources {
					covered[filepath.Join(dir, r)] = true
				}
				for _, p := range o.Kustomization.Patches {
					if p.Path != "" {
						covered[filepath.Join(dir, p.Path)] = true
					}
				}
			} else if len(objectFiles) == 0 || objectFiles[len(objectFiles)-1] != f {
				objectFiles = append(objectFiles, f)
			}
		}
	}
	for _, f := range objectFiles {
		if !covered[f] {
			errs = append(errs, fmt.Errorf("%s: not part of any kustomization, so no set check covers it", f))
		}
	}
	sort.Strings(kdirs)
	for _, dir := range kdirs {
		cfgs, _, err := Render(dir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		res.Kustomizations[dir] = cfgs
	}
	return res, errors.Join(errs...)
}

// CheckPluginConfig validates kvroute's plugin configuration on its own (a file that
// holds only the JSON, or its YAML form) with kvroute's parser.
func CheckPluginConfig(src string, js []byte) (config.Config, error) {
	cfg, err := parsePluginConfig(js)
	if err != nil {
		return config.Config{}, fmt.Errorf("%s: plugin configuration: %w", src, err)
	}
	return cfg, nil
}

// parsePluginConfig is routing.ParseConfig, with the line and column of a JSON syntax
// error (the plugin says only that the JSON is invalid).
func parsePluginConfig(js []byte) (config.Config, error) {
	if err := jsonSyntax(js); err != nil {
		return config.Config{}, fmt.Errorf("line %w", err)
	}
	return config.ParseConfig(js)
}
