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
		strings.Repeat(`{"a":`, 256) + `1` + strings.Repeat(`}`, 256): true,
		strings.Repeat(`{"a":`, 257) + `1` + strings.Repeat(`}`, 257): false,
		// Levels past the first 64 keep their kind.
		strings.Repeat(`[`, 100) + `{` + strings.Repeat(`]`, 100) + `}`: false,
	} {
		assert.Equal(t, want, ShapeOK(body), "%.60q", body)
		assert.Equal(t, want, shapeOKOracle(body), "%.60q", body)
	}
}

// shapeOKOracle is ShapeOK written plainly, with a stack of brackets: ShapeOK (a
// stack of bits, shared with ValueEnd) must answer as it does.
func shapeOKOracle(body string) bool {
	i := SkipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return false
	}
	var stack [MaxDepth]byte
	depth := 0
	for ; i < len(body); i++ {
		switch c := body[i]; c {
		case '"':
			e, _ := stringEnd(body, i)
			if e > len(body) || body[e-1] != '"' || e-1 == i {
				return false // not closed
			}
			i = e - 1
		case '{', '[':
			if depth == MaxDepth {
				return false
			}
			stack[depth] = c
			depth++
		case '}', ']':
			if depth == 0 || (c == '}') != (stack[depth-1] == '{') {
				return false
			}
			depth--
			if depth == 0 {
				return SkipSpace(body, i+1) == len(body)
			}
		default:
			if c < ' ' && c != '\t' && c != '\n' && c != '\r' {
				return false
			}
		}
	}
	return false
}

// valueEndOracle is ValueEnd without the shape check: ValueEnd must end every value
// where it does, odd or not.
func valueEndOracle(s string, i int) int {
	if i >= len(s) {
		return len(s)
	}
	switch s[i] {
	case '"':
		e, _ := stringEnd(s, i)
		return e
	case '{', '[':
		depth := 0
		for ; i < len(s); i++ {
			switch s[i] {
			case '"':
				e, _ := stringEnd(s, i)
				i = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return len(s)
	}
	e := i + 1
	for e < len(s) && s[e] > ' ' && s[e] != ',' && s[e] != '}' && s[e] != ']' {
		e++
	}
	return e
}

// nesting returns how deep the brackets of JSON text s nest, outside its strings.
func nesting(s string) int {
	depth, most, inString := 0, 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case inString && c == '\\':
			i++
		case inString:
			inString = c != '"'
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			depth++
			most = max(most, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return most
}

// A value ValueEnd does not find odd is shaped (ShapeOK passes it as a member's
// value), and every valid value within its depth bound is not odd.
func TestValueEndChecksShape(t *testing.T) {
	deep := MaxDepth - WalkDepth
	for value, wantOdd := range map[string]bool{
		`"a\"b"`:        false,
		`-1.5e+3`:       false,
		`true`:          false,
		`null`:          false,
		`{"a":[1,{}]}`:  false,
		` [ 1 , "]" ] `: false,
		`tr"ue`:         true,
		`1[2`:           true,
		`}`:             true,
		`]`:             true,
		`{"a":[1}]`:     true,
		`{"a":1]`:       true,
		"[1,\x01]":      true,
		"[1,\t\r\n2]":   false,
		`["open]`:       true,
		strings.Repeat(`[`, deep) + strings.Repeat(`]`, deep):     false,
		strings.Repeat(`[`, deep+1) + strings.Repeat(`]`, deep+1): true,
	} {
		s := value + `,`
		i := SkipSpace(s, 0)
		odd := false
		e := ValueEnd(s, i, &odd)
		assert.Equal(t, wantOdd, odd, "%.60q", value)
		assert.Equal(t, valueEndOracle(s, i), e, "%.60q", value)
		if !odd {
			assert.True(t, ShapeOK(`{"k":`+s[i:e]+`}`), "%.60q", value)
		}
	}
}

// A walk's readers set odd for an object or array that ends other than at its own
// bracket, and for white space ShapeOK refuses.
func TestReadersSetOdd(t *testing.T) {
	for _, tc := range []struct {
		s        string
		member   bool
		wantOdd  bool
		wantEnds bool
	}{
		{`}`, true, false, true},
		{` , }`, true, false, true},
		{`]`, true, true, true},
		{``, true, true, true},
		{`"k"`, true, true, true},
		{`"open`, true, true, true},
		{"\x01\"k\":1", true, true, false},
		{"\t\"k\"\r\n:\n1", true, false, false},
		{`]`, false, false, true},
		{``, false, true, true},
		{`}`, false, false, false}, // an element, which ValueEnd finds odd
		{"\x7f", false, false, false},
		{"\x1f1", false, true, false},
	} {
		odd := false
		var v int
		if tc.member {
			_, v, _ = MemberAt(tc.s, 0, &odd)
		} else {
			v, _ = ElementAt(tc.s, 0, &odd)
		}
		assert.Equal(t, tc.wantOdd, odd, "%q", tc.s)
		assert.Equal(t, tc.wantEnds, v < 0, "%q", tc.s)
	}
}
