package jsonscan

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

var scanSeeds = []string{
	``,
	`{}`,
	`{"a":1,"b":[1,2,{"c":"d"}],"e":null}`,
	`{"m\u0065ssages":[{"r\u006fle":"user","content":"escaped keys"}],"model":"a\"b"}`,
	`"Hi \"there\"\n\u00e9\ud83d\ude00"`,
	`"\ud83d"`,
	`"\ud83d\u0"`,
	`"\u00"`,
	`"a\\"`,
	`"open`,
	`{"a":"x\\\"y"}`,
	`[[[[1]]]],`,
	`{"a" "b"}`,
	"{\"a\":\x01}",
	` {"k" : [ 1 , "two" , { } ] } `,
	`{"prompt":[1.5, 1e3, -0, 4294967295]}`,
	`{"model":"llama","stream":true,"messages":[{"role":"system","content":"Be brief."}]}`,
	`{"conversation_id":"c","a":1,"b":"x\"y","c\"d":2,"tool_calls":[],"e" :3,"f": 4}`,
	`{"a": 1,"b":` + "\n" + `2,"12345678":3,"1234567":4,"123456789012345":5,"1234567890123456":6,"k":[ {} ], "padding":"............"}`,
	`{"a\:b":1,"padding":"...................."}`,
}

// FuzzScan: on any text, even text that is not JSON, the readers never index out of
// range and always move forward; a string decodes to where stringEnd says it ends, and
// a valid JSON string decodes as gjson decodes it. ValueEnd ends values where
// valueEndOracle (no shape check) does, and vouches only for values ShapeOK passes;
// ShapeOK answers as shapeOKOracle does. (The walk's use of the readers' check is fuzzed by
// extract's FuzzShapeCheck.)
func FuzzScan(f *testing.F) {
	for _, s := range scanSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for i := 0; i < len(s) && i < 64; i++ {
			odd := false
			e := ValueEnd(s, i, &odd)
			if e <= i || e > len(s) {
				t.Fatalf("ValueEnd(%q, %d) = %d", s, i, e)
			}
			if want := valueEndOracle(s, i); e != want {
				t.Fatalf("ValueEnd(%q, %d) = %d, unchecked %d", s, i, e, want)
			}
			if !odd && e < len(s) && !ShapeOK(`{"k":`+s[i:e]+`}`) {
				t.Fatalf("ValueEnd(%q, %d) vouches for %q, which ShapeOK refuses", s, i, s[i:e])
			}
			odd = false
			k, v, end := MemberAt(s, i, &odd)
			if v >= len(s) || (v < 0 && (end <= 0 || end > len(s))) {
				t.Fatalf("MemberAt(%q, %d) = %d, %d", s, i, v, end)
			}
			oddGeneral := false
			if k2, v2, end2 := memberAt(s, i, &oddGeneral); k != k2 || v != v2 || end != end2 || odd != oddGeneral {
				t.Fatalf("MemberAt(%q, %d) = %q, %d, %d, %v; the general way %q, %d, %d, %v", s, i, k, v, end, odd, k2, v2, end2, oddGeneral)
			}
			if v, end := ElementAt(s, i, &odd); v >= len(s) || (v < 0 && (end <= 0 || end > len(s))) {
				t.Fatalf("ElementAt(%q, %d) = %d, %d", s, i, v, end)
			}
			if s[i] == '"' {
				// The walk decodes some strings and skips others: both must agree on
				// where every string ends.
				text, end := AppendString(nil, s, i)
				e, escaped := stringEnd(s, i)
				if end != e {
					t.Fatalf("AppendString(%q, %d) ends at %d, stringEnd at %d", s, i, end, e)
				}
				closed := e-1 > i && s[e-1] == '"' && !escaped
				if e2, plain := StringEnd(s, i); e2 != e || plain != closed || plain && string(text) != s[i+1:e-1] {
					t.Fatalf("StringEnd(%q, %d) = %d, %v; stringEnd %d, escaped %v", s, i, e2, plain, e, escaped)
				}
				if want := strings.IndexByte(s[i:e], '\\') >= 0; escaped != want {
					t.Fatalf("stringEnd(%q, %d) says escaped %v", s, i, escaped)
				}
			}
			want := len(s)
			if k := strings.IndexAny(s[i:], `"\`); k >= 0 {
				want = i + k
			}
			if got := quoteOrEscape(s, i); got != want {
				t.Fatalf("quoteOrEscape(%q, %d) = %d, want %d", s, i, got, want)
			}
		}
		if got, want := ShapeOK(s), shapeOKOracle(s); got != want {
			t.Fatalf("ShapeOK(%q) = %v, shapeOKOracle %v", s, got, want)
		}

		// A valid value within the depth bound is never odd.
		if i := SkipSpace(s, 0); i < len(s) && gjson.Valid(s) && nesting(s) <= MaxDepth-WalkDepth {
			odd := false
			if e := ValueEnd(s, i, &odd); odd || SkipSpace(s, e) != len(s) {
				t.Fatalf("ValueEnd(%q) = %d, odd %v", s, e, odd)
			}
		}

		// Strings decode as gjson decodes them.
		if len(s) > 0 && s[0] == '"' && gjson.Valid(s) {
			got, end := AppendString(nil, s, 0)
			if want := gjson.Parse(s).Str; string(got) != want || end != len(strings.TrimRight(s, " \t\r\n")) {
				t.Fatalf("AppendString(%q) = %q, %d; want %q", s, got, end, want)
			}
		}
	})
}
