package routing

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestJSONShape(t *testing.T) {
	for body, want := range map[string]bool{
		`{}`:                       true,
		` {"a":[1,{"b":"c\"}"}]} `: true,
		`{"a":"}"}`:                true,
		`{"a":"x\\"}`:              true,
		`[]`:                       false,
		`"str"`:                    false,
		`{"a":1`:                   false,
		`{"a":[1}`:                 false,
		`{"a":"open}`:              false,
		`{"a":1}}`:                 false,
		`{"a":1} x`:                false,
		"{\"a\":\x01}":             false,
		``:                         false,
		strings.Repeat(`{"a":`, 300) + `1` + strings.Repeat(`}`, 300): false, // deeper than maxJSONDepth
		strings.Repeat(`{"a":`, 200) + `1` + strings.Repeat(`}`, 200): true,
	} {
		assert.Equal(t, want, jsonShapeOK(body), "%.60q", body)
	}
}

func TestHugeNestingCostsBoundedWork(t *testing.T) {
	// 1 MiB of '[': refused at depth maxJSONDepth, without walking the rest.
	body := `{"messages":` + strings.Repeat("[", 1<<20) + `}`
	var req Request
	err := Extract(APIChatCompletions, []byte(body), ExtractOptions{CharsPerToken: 4, BlockTokens: 16}, &req)
	assert.ErrorIs(t, err, ErrUnparsable)
}
