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
	panels := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			if !strings.Contains(tg.Expr, "kvroute_target_active_requests") {
				continue
			}
			panels++
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
				stat, ep := TargetGaugeName(target)
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
	if panels < 2 {
		t.Fatalf("want the per-target panels, found %d queries", panels)
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
