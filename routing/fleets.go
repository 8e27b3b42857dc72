package routing

import (
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/hashx"
	"github.com/kvroute/kvroute/routing/jsonscan"
	"github.com/kvroute/kvroute/routing/state"
)

// Fleets picks the Router that serves a request's model (docs/behaviour.md, Several
// models). Each fleet of Config.Models is a Router of its own, over a Config that is
// the top-level one with the fleet's pools and disaggregation, and with its state under
// a namespace of its own (FleetNamespace); the top-level pools are the default fleet,
// under the top-level namespace as in a configuration without models. Picking costs a
// map lookup and a prefix test per prefix name, however many fleets there are.
type Fleets struct {
	Default  *Fleet   // the top-level pools
	Models   []*Fleet // Config.Models, in order
	exact    map[string]int
	prefixes []fleetPrefix // in fleet order
	all      []*Fleet
}

// Fleet is one Router and what it serves.
type Fleet struct {
	Name   string // Names[0]; "" for the default fleet
	Index  int    // position in Config.Models; -1 for the default fleet
	Config *config.Config
	Router *Router
}

type fleetPrefix struct {
	prefix string
	fleet  int
}

// FleetNamespace is the state namespace of the fleet whose first name is name: keyed
// by the name, not the position, so adding or removing other fleets keeps its state.
// "/" cannot occur in state.namespace, so it never meets another filter's keys.
func FleetNamespace(namespace, name string) string {
	return namespace + "/m/" + strconv.FormatUint(hashx.FingerprintString(name), 16)
}

// NewFleets builds the default fleet over cfg and one fleet per cfg.Models entry.
func NewFleets(cfg *config.Config, store state.Store, now func() int64) *Fleets {
	f := &Fleets{
		Default: &Fleet{Index: -1, Config: cfg, Router: NewRouter(cfg, store, now)},
		exact:   map[string]int{},
	}
	for i, m := range cfg.Models {
		fc := *cfg
		fc.Models = nil
		fc.Pools = m.Pools
		fc.Disaggregation = m.Disaggregation
		fc.State.Namespace = FleetNamespace(cfg.State.Namespace, m.Names[0])
		f.Models = append(f.Models, &Fleet{Name: m.Names[0], Index: i, Config: &fc, Router: NewRouter(&fc, store, now)})
		for _, n := range m.Names {
			if p, ok := strings.CutSuffix(n, "*"); ok {
				f.prefixes = append(f.prefixes, fleetPrefix{prefix: p, fleet: i})
			} else if _, dup := f.exact[n]; !dup {
				f.exact[n] = i
			}
		}
	}
	f.all = append([]*Fleet{f.Default}, f.Models...)
	return f
}

// Pick returns the fleet that serves model: the first fleet that names it. A request
// that names no model (missing, not a string, or an unreadable body) goes to the
// default fleet, which passes it through when it has no endpoint. A model no fleet
// names goes to the default fleet when that has endpoints now (static or discovered);
// otherwise Pick returns nil: the model is not served here.
func (f *Fleets) Pick(model string) *Fleet {
	if model == "" || len(f.Models) == 0 {
		return f.Default
	}
	best := -1
	if i, ok := f.exact[model]; ok {
		best = i
	}
	for _, p := range f.prefixes {
		if best >= 0 && p.fleet >= best {
			break
		}
		if strings.HasPrefix(model, p.prefix) {
			best = p.fleet
			break
		}
	}
	if best >= 0 {
		return f.Models[best]
	}
	if f.Default.Router.HasEndpoints() {
		return f.Default
	}
	return nil
}

// All returns every fleet, the default first.
func (f *Fleets) All() []*Fleet { return f.all }

// CatalogueBody is the answer to GET /v1/models: OpenAI's model list, one entry per
// fleet, named by its first name.
func (f *Fleets) CatalogueBody() []byte {
	b := []byte(`{"object":"list","data":[`)
	for i, m := range f.Models {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = jsonscan.AppendQuoted(b, m.Name)
		b = append(b, `,"object":"model","created":0,"owned_by":"kvroute"}`...)
	}
	return append(b, "]}"...)
}

// modelInErrorMax bounds how much of a client's model name an error body repeats.
const modelInErrorMax = 256

// ModelNotFoundBody is the 404 body for a model no fleet serves, in OpenAI's error
// format.
func ModelNotFoundBody(model string) []byte {
	if len(model) > modelInErrorMax {
		model = model[:modelInErrorMax] + "..." // a split rune becomes U+FFFD
	}
	b := []byte(`{"error":{"message":`)
	b = jsonscan.AppendQuoted(b, "The model `"+model+"` does not exist.")
	return append(b, `,"type":"invalid_request_error","param":"model","code":"model_not_found"}}`...)
}
