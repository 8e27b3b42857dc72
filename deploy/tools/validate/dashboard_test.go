package validate

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/routing"
	"github.com/kvroute/kvroute/routing/config"
)

// promName is the name Envoy's /stats/prometheus gives a stat that no tag was lifted
// from: without the custom "wasmcustom." namespace, every character outside
// [a-zA-Z0-9_] written as '_'.
func promName(stat string) string {
	stat = strings.TrimPrefix(stat, "wasmcustom.")
	return regexp.MustCompile(`[^a-zA-Z0-9_]`).ReplaceAllString(stat, "_")
}

// The dashboard's per-target panels work with the stats_tags of deploy/envoy (labels)
// and without them, as on Istio's gateways (one metric name per target): their
// label_replace calls lift the same endpoint and rank out of the name.
func TestDashboardPerTargetQueriesWorkWithoutTags(t *testing.T) {
	root := repoRoot(t)
	data, err := os.ReadFile(filepath.Join(root, "deploy/grafana/kvroute-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	docs, err := SplitDocs("override-host.yaml", mustRead(t, filepath.Join(root, "deploy/envoy/override-host.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	cfgs, err := CheckBootstrap(docs[0].Source, docs[0].JSON)
	if err != nil || len(cfgs) != 1 {
		t.Fatal(err)
	}
	tags := loadBootstrap(t, docs[0].JSON).GetStatsConfig().GetStatsTags()
	lifted := regexp.MustCompile(`"(kvroute_endpoint|kvroute_rank)", "\$1", "__name__", "([^"]+)"`)
	nameSel := regexp.MustCompile(`__name__=~"([^"]+)"`)
	panels := map[string]int{} // by gauge family
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			family := ""
			for _, f := range TargetGaugeFamilies {
				if strings.Contains(tg.Expr, f) {
					family = f
				}
			}
			if family == "" {
				continue
			}
			panels[family]++
			all := strings.ReplaceAll(tg.Expr, "$endpoint", ".*") // the variable's "All"
			sel := nameSel.FindStringSubmatch(all)
			if sel == nil {
				t.Fatalf("%s: no __name__ selector in %s", p.Title, tg.Expr)
			}
			selRe := regexp.MustCompile("^(?:" + sel[1] + ")$")
			rules := lifted.FindAllStringSubmatch(all, -1)
			if len(rules) != 2 {
				t.Fatalf("%s: want label_replace for kvroute_endpoint and kvroute_rank, got %q", p.Title, rules)
			}
			for _, target := range routingTargets(cfgs[0]) {
				stat, ep := TargetGaugeName(family, target)
				tagged, tagVals, err := ExtractTags(stat, tags)
				if err != nil {
					t.Fatal(err)
				}
				for _, name := range []string{promName(tagged), promName(stat)} {
					if !selRe.MatchString(name) {
						t.Errorf("%s: the selector %s misses %s", p.Title, sel[1], name)
					}
				}
				// With tags the name does not match and the labels stay; without,
				// the name gives the same values.
				for _, r := range rules {
					re := regexp.MustCompile("^(?:" + r[2] + ")$")
					if re.MatchString(promName(tagged)) {
						t.Errorf("%s: %s would overwrite the tagged series' %s", p.Title, r[2], r[1])
					}
					m := re.FindStringSubmatch(promName(stat))
					want := map[string]string{"kvroute_endpoint": ep, "kvroute_rank": strconv.Itoa(target.Rank)}[r[1]]
					if m == nil || m[1] != want || tagVals[r[1]] != want {
						t.Errorf("%s: %s from %s gives %v, stats_tags give %q, want %q", p.Title, r[1], promName(stat), m, tagVals[r[1]], want)
					}
				}
			}
		}
	}
	if panels[TargetGaugeFamilies[0]] < 2 {
		t.Fatalf("want the per-target panels of %s, found %d queries", TargetGaugeFamilies[0], panels[TargetGaugeFamilies[0]])
	}
	for _, f := range TargetGaugeFamilies[1:] {
		if panels[f] == 0 {
			t.Errorf("no panel shows %s", f)
		}
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func routingTargets(cfg config.Config) []routing.Target {
	return routing.NewPoolTargets(cfg.Pools.Decode).Targets
}

// The per-target gauges checked here are the ones the filter defines, and the metric
// reference lists each.
func TestTargetGaugeFamiliesAreTheFiltersOwn(t *testing.T) {
	root := repoRoot(t)
	src := string(mustRead(t, filepath.Join(root, "filter/metrics.go")))
	defined := regexp.MustCompile(`"(kvroute_target_[a-z_]+)"`).FindAllStringSubmatch(src, -1)
	var names []string
	for _, m := range defined {
		names = append(names, m[1])
	}
	if strings.Join(names, " ") != strings.Join(TargetGaugeFamilies, " ") {
		t.Errorf("filter/metrics.go defines %v, the validator checks %v", names, TargetGaugeFamilies)
	}
	docs := string(mustRead(t, filepath.Join(root, "docs/metrics.md")))
	for _, f := range TargetGaugeFamilies {
		if !strings.Contains(docs, "| `"+f+".<endpoint>.rank_<r>` | gauge |") {
			t.Errorf("docs/metrics.md has no row for %s", f)
		}
	}
}
