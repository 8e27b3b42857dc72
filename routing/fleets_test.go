package routing

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/discovery"
	"github.com/kvroute/kvroute/routing/extract"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func fleetsConfig(t *testing.T, js string) *config.Config {
	t.Helper()
	cfg, err := config.ParseConfig([]byte(js))
	require.NoError(t, err)
	return &cfg
}

const fleetsJSON = `{"models":[
	{"names":["qwen3-32b","qwen3-32b-*"],"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"},{"address":"10.0.1.2:8000"}]}}},
	{"names":["llama","qwen3-32b-special"],"pools":{"decode":{"endpoints":[{"address":"10.0.2.1:8000"}]}}},
	{"names":["any","*"],"pools":{"decode":{"endpoints":[{"address":"10.0.3.1:8000"}]}}}
]}`

func TestFleetsPickTheFirstFleetThatNamesTheModel(t *testing.T) {
	clock := &fakeClock{ms: 1e6}
	f := NewFleets(fleetsConfig(t, fleetsJSON), state.NewMemoryStore(), clock.now)
	for model, want := range map[string]string{
		"qwen3-32b":         "qwen3-32b",
		"qwen3-32b-sql":     "qwen3-32b", // the LoRA prefix
		"qwen3-32b-special": "qwen3-32b", // the earlier fleet's prefix wins over a later exact name
		"llama":             "llama",
		"qwen3-32":          "any", // "qwen3-32b-" is not a prefix of it: the catch-all
		"mistral":           "any",
	} {
		got := f.Pick(model)
		require.NotNil(t, got, model)
		assert.Equal(t, want, got.Name, model)
	}
	assert.Same(t, f.Default, f.Pick(""), "no model: the default fleet")
}

func TestFleetsUnknownModel(t *testing.T) {
	clock := &fakeClock{ms: 1e6}
	two := `{"names":["a"],"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"}]}}}`
	f := NewFleets(fleetsConfig(t, `{"models":[`+two+`]}`), state.NewMemoryStore(), clock.now)
	assert.Nil(t, f.Pick("b"), "no default pool: not served")
	assert.Same(t, f.Default, f.Pick(""), "no model: the (empty) default passes it through")
	assert.Equal(t, KindFallback, f.Pick("").Router.Decide(&extract.Request{}, NoRank).Kind)

	f = NewFleets(fleetsConfig(t, `{"pools":{"decode":{"endpoints":[{"address":"10.0.0.11:8000"}]}},"models":[`+two+`]}`), state.NewMemoryStore(), clock.now)
	assert.Same(t, f.Default, f.Pick("b"), "the top-level pools serve unknown models")

	// Discovered top-level pools serve unknown models once they have endpoints.
	store := state.NewMemoryStore()
	cfg := fleetsConfig(t, `{"pools":{"decode":{"discovery":{"source":"http","cluster":"c","path":"/eps"}}},"models":[`+two+`]}`)
	f = NewFleets(cfg, store, clock.now)
	assert.Nil(t, f.Pick("b"))
	require.NoError(t, f.Default.Router.PublishDiscovered(false, []discovery.DiscoveredEndpoint{{Address: "10.0.9.9:8000"}}))
	other := NewFleets(cfg, store, clock.now) // another VM sees the published set
	assert.Same(t, other.Default, other.Pick("b"))
	assert.Equal(t, "10.0.9.9:8000", other.Default.Router.Decide(&extract.Request{Tokens: 1}, NoRank).Target.Address)
}

func TestFleetsKeepStateApart(t *testing.T) {
	clock := &fakeClock{ms: 1e6}
	store := state.NewMemoryStore()
	js := `{"models":[
		{"names":["a"],"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"}]}}},
		{"names":["b"],"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"}]}}}]}`
	f := NewFleets(fleetsConfig(t, js), store, clock.now)
	// One conversation id, two models: each fleet places its own first turn.
	da := f.Pick("a").Router.Decide(convRequest("c1"), NoRank)
	db := f.Pick("b").Router.Decide(convRequest("c1"), NoRank)
	assert.Equal(t, KindNewConversation, da.Kind)
	assert.Equal(t, KindNewConversation, db.Kind, "the other model's mapping is not this one's")
	assert.Equal(t, KindSticky, f.Pick("a").Router.Decide(convRequest("c1"), NoRank).Kind)
	require.NoError(t, f.Pick("a").Router.FlushLoad())
	require.NoError(t, f.Pick("b").Router.FlushLoad())
	// Every key of a fleet is under its own namespace; none under the top level's pools.
	nsA, nsB := FleetNamespace("kvroute", "a")+"/", FleetNamespace("kvroute", "b")+"/"
	var a, b int
	for _, k := range store.Keys() {
		switch {
		case strings.HasPrefix(k, nsA):
			a++
		case strings.HasPrefix(k, nsB):
			b++
		default:
			t.Errorf("key %q outside the fleets' namespaces", k)
		}
	}
	assert.Positive(t, a)
	assert.Positive(t, b)
	lb, err := f.Pick("b").Router.Loads()
	require.NoError(t, err)
	assert.Equal(t, int64(1), lb[0].Requests+lb[1].Requests, "b's ledger holds only b's request")

	// A reconfiguration that adds a fleet in front keeps a's and b's state.
	js2 := strings.Replace(js, `"models":[`, `"models":[{"names":["z"],"pools":{"decode":{"endpoints":[{"address":"10.0.0.3:8000"}]}}},`, 1)
	f2 := NewFleets(fleetsConfig(t, js2), store, clock.now)
	d := f2.Pick("a").Router.Decide(convRequest("c1"), NoRank)
	assert.Equal(t, KindSticky, d.Kind)
	assert.Equal(t, da.Target.ID, d.Target.ID)
}

func TestFleetsWithoutModelsAreTheRouterAsBefore(t *testing.T) {
	clock := &fakeClock{ms: 1e6}
	f := NewFleets(testConfig(t, ""), state.NewMemoryStore(), clock.now)
	assert.Empty(t, f.Models)
	assert.Same(t, f.Default, f.Pick("whatever"))
	assert.Equal(t, "kvroute", f.Default.Config.State.Namespace)
}

func TestFleetsBodies(t *testing.T) {
	clock := &fakeClock{ms: 1e6}
	f := NewFleets(fleetsConfig(t, fleetsJSON), state.NewMemoryStore(), clock.now)
	assert.JSONEq(t, `{"object":"list","data":[
		{"id":"qwen3-32b","object":"model","created":0,"owned_by":"kvroute"},
		{"id":"llama","object":"model","created":0,"owned_by":"kvroute"},
		{"id":"any","object":"model","created":0,"owned_by":"kvroute"}]}`, string(f.CatalogueBody()))
	assert.JSONEq(t, `{"object":"list","data":[]}`, string(NewFleets(testConfig(t, ""), state.NewMemoryStore(), clock.now).CatalogueBody()))
	assert.JSONEq(t, `{"error":{"message":"The model `+"`a\\\"b\\n`"+` does not exist.","type":"invalid_request_error",
		"param":"model","code":"model_not_found"}}`, string(ModelNotFoundBody("a\"b\n")))
	long := string(ModelNotFoundBody(strings.Repeat("é", 1000)))
	assert.Less(t, len(long), 600)
	assert.True(t, json.Valid([]byte(long)))
}
