package extract

import (
	"bytes"
	"math/rand"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/routing/jsonscan"
	"github.com/tidwall/gjson"
)

// shapeSeeds are bodies whose shape the walk must judge as jsonscan.ShapeOK does:
// valid ones, and ones ShapeOK passes though they are not JSON, or refuses.
var shapeSeeds = append([]string{
	"{\n  \"model\" : \"m\",\r\n\t\"messages\" : [ { \"role\" : \"user\" , \"content\" : [ { \"type\" : \"text\" , \"text\" : \"a\" } ] } ]\n}\n",
	`{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":["string","null"]}}}}}],"temperature":-0.5e+1,"n":null,"stream":false}`,
	`{"messages":[{"role":"user","content":"hi"}]} x`,
	`{"messages":[{"role":"user","content":"hi"}]}}`,
	`{"messages":[{"role":"user","content":"hi"}],"x":{"a":1]}`,
	`{"messages":[{"role":"user","content":"hi"}],"x":[1}}`,
	`{"model":tru"e","messages":[{"role":"user","content":"hi"}]}`,
	`{"model":x"}"}`,
	`{"a" 1 "messages" [{"role" "user" "content" "hi"}]}`,
	`{"messages":[{"role":"user","content":"hi", 5:1}]}`,
	`{"messages":[{"role":"user","content":[{"type":"image", 5}]}]}`,
	`{"messages":[{"role":"user","content":"hi"}],"a":}}`,
	`{"messages":[{"role":"user","content":"hi"}],"a":}`,
	`{"messages":[{"role":"user","content":"hi"}],,"a":1}`,
	"{\"messages\":\x01[{\"role\":\"user\",\"content\":\"hi\"}]}",
	"{\"messages\":[{\"role\":\"user\",\"content\":\"h\x01i\"}]}",
	"\x01 {\"prompt\":\"p\"} \x02",
	`{"messages":[{"role":"user","content":"hi}]}`,
	`{"messages":[{"role":"user","content":"a\\"}]}`,
	`{"messages":[{"role":"user","content":"a\"}]}`,
	`{"prompt":[[1,2],[3,[4]]]}`,
	`{"prompt":"p","x":` + strings.Repeat(`[`, jsonscan.MaxDepth-jsonscan.WalkDepth) + strings.Repeat(`]`, jsonscan.MaxDepth-jsonscan.WalkDepth) + `}`,
	`{"prompt":"p","x":` + strings.Repeat(`[`, jsonscan.MaxDepth-1) + strings.Repeat(`]`, jsonscan.MaxDepth-1) + `}`,
	`{"prompt":"p","x":` + strings.Repeat(`[`, jsonscan.MaxDepth) + strings.Repeat(`]`, jsonscan.MaxDepth) + `}`,
	`{"input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"x","v":[1,{"y":"}"}]}],"instructions":"s"}`,
}, extractSeeds...)

// checkWalkShape asserts that Extract answers on body as walking the body and then
// checking its whole shape with jsonscan.ShapeOK would, and that the walk
// vouches for the shape of every valid body it reads through (else ShapeOK runs too).
func checkWalkShape(t *testing.T, api API, body string) {
	t.Helper()
	var req Request
	err := Extract(api, []byte(body), defaultExtractOptions(), &req)
	root := jsonscan.SkipSpace(body, 0)
	if api < APIChatCompletions || api > APIResponses || root >= len(body) || body[root] != '{' {
		return
	}

	// The walk, then the whole-body check.
	var w promptWriter
	var top topLevel
	walkErr := readTopLevel(api, body, root, &w, nil, &top)
	shapeOK := jsonscan.ShapeOK(body)
	if top.shaped && !shapeOK {
		t.Fatalf("api %d: the walk vouches for the shape of %q, which ShapeOK refuses", api, body)
	}
	want := walkErr
	switch {
	case !shapeOK:
		want = errNotJSON
	case walkErr == nil:
		want = w.finish(api, &top)
	}
	if err != want {
		t.Fatalf("api %d: %q: error %v, walk then shape check %v", api, body, err, want)
	}
	if err == nil && !bytes.Equal(req.Prompt, w.buf) {
		t.Fatalf("api %d: %q: prompt %q, walk then shape check %q", api, body, req.Prompt, w.buf)
	}

	if walkErr == nil && !top.shaped && gjson.Valid(body) && nesting(body) <= jsonscan.MaxDepth-jsonscan.WalkDepth {
		t.Fatalf("api %d: the walk read valid %q through without vouching for its shape", api, body)
	}
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

func FuzzShapeCheck(f *testing.F) {
	for _, s := range shapeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for api := APIChatCompletions; api <= APIResponses; api++ {
			checkWalkShape(t, api, string(body))
		}
	})
}

// The walk judges the shape as ShapeOK does on bodies mutated where shape is made:
// brackets, quotes, backslashes, separators and white space, good and bad.
func TestShapeCheckOnMutatedBodies(t *testing.T) {
	const shapeBytes = "{}[]\"\\,: \t\n\r\x01\x1fa0"
	rng := rand.New(rand.NewSource(1))
	n := 20000
	if testing.Short() {
		n = 2000
	}
	for k := 0; k < n; k++ {
		b := []byte(shapeSeeds[rng.Intn(len(shapeSeeds))])
		for m := 1 + rng.Intn(3); m > 0 && len(b) > 0; m-- {
			p := rng.Intn(len(b))
			c := shapeBytes[rng.Intn(len(shapeBytes))]
			switch rng.Intn(4) {
			case 0:
				b[p] = c
			case 1:
				b = append(b[:p], append([]byte{c}, b[p:]...)...)
			case 2:
				b = append(b[:p], b[p+1:]...)
			default:
				b = b[:p]
			}
		}
		for api := APIChatCompletions; api <= APIResponses; api++ {
			checkWalkShape(t, api, string(b))
		}
	}
	for _, s := range shapeSeeds {
		for api := APIChatCompletions; api <= APIResponses; api++ {
			checkWalkShape(t, api, s)
		}
	}
}
