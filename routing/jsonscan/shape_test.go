package jsonscan

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
		strings.Repeat(`{"a":`, 300) + `1` + strings.Repeat(`}`, 300): false, // deeper than MaxDepth
		strings.Repeat(`{"a":`, 200) + `1` + strings.Repeat(`}`, 200): true,
	} {
		assert.Equal(t, want, ShapeOK(body, nil), "%.60q", body)
	}
}
