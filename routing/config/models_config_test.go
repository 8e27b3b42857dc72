package config

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const twoModels = `{"models":[
	{"names":["qwen3-32b","qwen3-32b-*"],"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"}]}}},
	{"names":["llama-70b"],"pools":{"decode":{"endpoints":[{"address":"10.0.2.1:8000"}]},
		"prefill":{"endpoints":[{"address":"10.0.2.9:8000"}]}},
	 "disaggregation":{"mode":"sidecar","threshold_tokens":2048}}
], "disaggregation":{"prefill_timeout_ms":5000}, "headers":{"model":"X-Gateway-Model-Name"}}`

func TestParseConfigModels(t *testing.T) {
	c, err := ParseConfig([]byte(twoModels))
	require.NoError(t, err)
	assert.Empty(t, c.Pools.Decode.Endpoints, "the top-level pools may stay empty beside models")
	require.Len(t, c.Models, 2)
	assert.Equal(t, []string{"qwen3-32b", "qwen3-32b-*"}, c.Models[0].Names)
	assert.Equal(t, "10.0.1.1:8000", c.Models[0].Pools.Decode.Endpoints[0].Address)
	assert.Equal(t, ModeOff, c.Models[0].Disaggregation.Mode)
	// A fleet's disaggregation is the top-level block with its own fields over it,
	// whichever comes first in the document.
	assert.Equal(t, int64(5000), c.Models[0].Disaggregation.PrefillTimeoutMS)
	d := c.Models[1].Disaggregation
	assert.Equal(t, ModeSidecar, d.Mode)
	assert.Equal(t, 2048, d.ThresholdTokens)
	assert.Equal(t, int64(5000), d.PrefillTimeoutMS)
	assert.Equal(t, "kvroute_prefill", d.PrefillCluster)
	assert.Equal(t, "x-gateway-model-name", c.Headers.Model, "lower-cased")

	// Without models nothing changes: no fleets, no model header.
	c, err = ParseConfig([]byte(cfgMinimal))
	require.NoError(t, err)
	assert.Empty(t, c.Models)
	assert.Equal(t, "", c.Headers.Model)
}

func TestParseConfigModelsOnlyFirstNamesNameMetrics(t *testing.T) {
	// A later name is matched against requests but names no counter, so it may write
	// like another fleet's first name.
	c, err := ParseConfig([]byte(`{"models":[
		{"names":["llama-3.1","x"],"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"}]}}},
		{"names":["y","llama-3_1"],"pools":{"decode":{"endpoints":[{"address":"10.0.1.2:8000"}]}}}]}`))
	require.NoError(t, err)
	assert.Equal(t, "llama-3_1", ModelMetricTag(c.Models[0].Names[0]))
	assert.Equal(t, "y", ModelMetricTag(c.Models[1].Names[0]))
}

func TestParseConfigModelsRefusals(t *testing.T) {
	fleet := func(names string) string {
		return `{"names":` + names + `,"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"}]}}}`
	}
	for _, tc := range []struct {
		name, config, field, reason string
	}{
		{"not an array", `{"models":{}}`, "models", "must be an array, got object"},
		{"names missing", `{"models":[{"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"}]}}}]}`,
			"models[0].names", "required field missing"},
		{"pools missing", `{"models":[{"names":["a"]}]}`, "models[0].pools", "required field missing"},
		{"empty names", `{"models":[` + fleet(`[]`) + `]}`, "models[0].names", "must hold at least one name"},
		{"empty name", `{"models":[` + fleet(`["a",""]`) + `]}`, "models[0].names[1]", "must not be empty"},
		{"non-string name", `{"models":[` + fleet(`[7]`) + `]}`, "models[0].names[0]", "must be a string, got number"},
		{"first name a prefix", `{"models":[` + fleet(`["qwen-*"]`) + `]}`, "models[0].names[0]",
			`the first name names the fleet (catalogue, headers.model, metrics) and must be exact, got "qwen-*"`},
		{"star inside", `{"models":[` + fleet(`["a","q*n"]`) + `]}`, "models[0].names[1]",
			`"*" may only end a name (a prefix), got "q*n"`},
		{"control character", `{"models":[` + fleet(`["a\nb"]`) + `]}`, "models[0].names[0]",
			`must not contain control characters, got "a\nb"`},
		{"name twice", `{"models":[` + fleet(`["a"]`) + `,` + fleet(`["b","a"]`) + `]}`, "models[1].names[1]",
			`"a" is already named by models[0].names[0]`},
		{"first names alike as metrics", `{"models":[` + fleet(`["llama-3.1"]`) + `,` + fleet(`["llama-3_1"]`) + `]}`,
			"models[1].names[0]", `"llama-3_1" names its fleet's metrics "llama-3_1", as models[0].names[0] does: ` +
				`the two fleets' counters would be one; rename one, or put another of its names first`},
		{"no decode endpoint", `{"models":[{"names":["a"],"pools":{"decode":{"endpoints":[]}}}]}`,
			"models[0].pools.decode.endpoints", "must hold at least one endpoint (or set models[0].pools.decode.discovery)"},
		{"bad address", `{"models":[{"names":["a"],"pools":{"decode":{"endpoints":[{"address":"nope"}]}}}]}`,
			"models[0].pools.decode.endpoints[0].address", `"nope" is not host:port (want host:port or [ipv6]:port)`},
		{"unknown fleet field", `{"models":[{"names":["a"],"weight":1}]}`, "models[0].weight", "unknown field"},
		{"bad mode", `{"models":[{"names":["a"],"disaggregation":{"mode":"x"}}]}`, "models[0].disaggregation.mode",
			`must be one of off, sidecar, vllm, trtllm, sglang, got "x"`},
		{"fleet P/D without prefill", `{"models":[` + fleet(`["a"]`) + `,{"names":["b"],"pools":{"decode":{"endpoints":[{"address":"10.0.1.2:8000"}]}},"disaggregation":{"mode":"vllm"}}]}`,
			"models[1].pools.prefill.endpoints",
			`disaggregation.mode "vllm" needs at least one prefill endpoint (or models[1].pools.prefill.discovery; or set models[1].disaggregation.mode "off")`},
		{"inherited P/D without prefill", `{"disaggregation":{"mode":"sidecar"},"models":[` + fleet(`["a"]`) + `]}`,
			"models[0].pools.prefill.endpoints",
			`disaggregation.mode "sidecar" needs at least one prefill endpoint (or models[0].pools.prefill.discovery; or set models[0].disaggregation.mode "off")`},
		{"model header reserved", cfgWith(`"headers":{"model":"host"}`), "headers.model", `"host" is a header the filter must not strip`},
		{"model header clash", cfgWith(`"headers":{"model":"x-kvroute-decision"}`), "headers.model",
			`"x-kvroute-decision" is already used by headers.decision`},
		{"model header is a conversation header", cfgWith(`"headers":{"model":"x-session-id"}`), "headers.model",
			`"x-session-id" is also in conversation.headers (the filter strips its own headers)`},
		{"no pools at all", `{"models":[]}`, "pools.decode.endpoints",
			"must hold at least one endpoint (or set pools.decode.discovery, or models)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.config))
			var ce *ConfigError
			require.True(t, errors.As(err, &ce), "want a ConfigError, got %v", err)
			assert.Equal(t, tc.field, ce.Field)
			assert.Equal(t, tc.reason, ce.Reason)
		})
	}
}

func TestParseConfigModelsAccepts(t *testing.T) {
	for _, config := range []string{
		// A discovered fleet, and top-level pools that serve unknown models.
		cfgWith(`"models":[{"names":["a"],"pools":{"decode":{"discovery":{"service_cluster":"a"}}}}]`),
		// A catch-all fleet after an exact one.
		`{"models":[{"names":["a"],"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"}]}}},
		  {"names":["b","*"],"pools":{"decode":{"endpoints":[{"address":"10.0.1.2:8000"}]}}}]}`,
		// Top-level P/D with empty top-level pools: only the fleets serve.
		`{"disaggregation":{"mode":"vllm"},"models":[{"names":["a"],"pools":{
		  "decode":{"endpoints":[{"address":"10.0.1.1:8000"}]},"prefill":{"endpoints":[{"address":"10.0.1.9:8000"}]}}}]}`,
		// Top-level P/D, a fleet that turns it off.
		`{"disaggregation":{"mode":"vllm"},"models":[{"names":["a"],"disaggregation":{"mode":"off"},"pools":{
		  "decode":{"endpoints":[{"address":"10.0.1.1:8000"}]}}}]}`,
		// The same endpoint in two fleets (one server, two models).
		`{"models":[{"names":["a"],"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"}]}}},
		  {"names":["b"],"pools":{"decode":{"endpoints":[{"address":"10.0.1.1:8000"}]}}}]}`,
	} {
		_, err := ParseConfig([]byte(config))
		assert.NoError(t, err, config)
	}
}
