package pdbody

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/kvroute/kvroute/routing/jsonscan"
	"github.com/tidwall/gjson"
)

// pdBodySeeds are request bodies of the shapes the builders see, and some they must refuse.
var pdBodySeeds = []string{
	pdChatBody, pdChatBodyPlain, pdCompletionBody, pdTokenIDsBody,
	`{"model":"m","input":"hi","instructions":"sys","stream":true}`,
	`{"stream":true,"str\u0065am":false,"stream":1,"max_tokens":5,"max_tokens":null}`,
	`{"m\u006fdel":"x","model":"y","messages":[],"messages":{"dup":true}}`,
	`{"kv_transfer_params":{"do_remote_prefill":true},"disaggregated_params":{"request_type":"x"},"bootstrap_room":-1}`,
	`{"":"","\"":"\\","a\u0000b":1}`,
	" \t\r\n{}\n",
	`{}`, `[]`, `"str"`, `null`, `1`, ``, `{`, `{"a":}`, `{"a":1}x`, `{"a":1,}`, "\xff{}",
}

// pdResponseSeeds are engine responses: vLLM prefill, TensorRT-LLM context, and junk.
var pdResponseSeeds = []string{
	pdPrefillResponse,
	pdContextResponse(`"length"`), pdContextResponse(`"not_finished"`), pdContextResponse(`"stop"`), pdContextResponse(`null`),
	`{"kv_transfer_params":{}}`, `{"kv_transfer_params":null}`, `{"kv_transfer_params":[1]}`,
	`{"choices":[]}`, `{"choices":[1]}`, `{"choices":[{"finish_reason":"length","disaggregated_params":{"request_type":"a","request_type":"b"}}]}`,
	`{"choices":[{"finish_reason":"length","disaggregated_params":{}}],"kv_transfer_params":{"a":1}}`,
	`[]`, ``, `<html>`, `{"choices":`,
}

// pdCheckOutput fails t unless out is a valid JSON object whose "model", "messages" and
// "prompt" are byte-identical to body's, and body is unchanged.
func pdCheckOutput(t *testing.T, name string, body, keep, out []byte, err error) {
	t.Helper()
	if !bytes.Equal(body, keep) {
		t.Fatalf("%s modified its input", name)
	}
	if err != nil {
		if !errors.Is(err, ErrPDBody) {
			t.Fatalf("%s: error %v does not wrap ErrPDBody", name, err)
		}
		if out != nil {
			t.Fatalf("%s: output with an error", name)
		}
		return
	}
	if !json.Valid(out) {
		t.Fatalf("%s: output is not JSON: %q (input %q)", name, out, body)
	}
	res := gjson.ParseBytes(out)
	if !res.IsObject() {
		t.Fatalf("%s: output is not an object: %q", name, out)
	}
	orig := gjson.ParseBytes(body)
	for _, k := range []string{"model", "messages", "prompt"} {
		if a, b := orig.Get(k).Raw, res.Get(k).Raw; a != b {
			t.Fatalf("%s: %s changed from %q to %q (input %q)", name, k, a, b, body)
		}
	}
}

// pdValidObject reports whether body is the kind of body the builders must accept.
// pdValidObject says a body must be accepted: a JSON object no deeper than the
// nesting bound (deeper ones are refused on purpose: jsonscan.ShapeOK).
func pdValidObject(body []byte) bool {
	return json.Valid(body) && gjson.ParseBytes(body).IsObject() && jsonscan.ShapeOK(string(body))
}

func FuzzVLLMPrefillBody(f *testing.F) {
	for _, s := range pdBodySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		keep := pdClone(body)
		out, err := VLLMPrefillBody(body)
		pdCheckOutput(t, "VLLMPrefillBody", body, keep, out, err)
		if err != nil {
			if pdValidObject(body) {
				t.Fatalf("refused a JSON object: %q: %v", body, err)
			}
			return
		}
		var m map[string]json.RawMessage
		if e := json.Unmarshal(out, &m); e != nil {
			t.Fatalf("output does not decode: %v", e)
		}
		if string(m["stream"]) != "false" || string(m["max_tokens"]) != "1" {
			t.Fatalf("stream/max_tokens not set: %q", out)
		}
		if _, ok := m["stream_options"]; ok {
			t.Fatalf("stream_options kept: %q", out)
		}
		if _, ok := m["min_tokens"]; ok {
			t.Fatalf("min_tokens kept: %q", out)
		}
		if !gjson.GetBytes(out, "kv_transfer_params.do_remote_decode").Bool() {
			t.Fatalf("kv_transfer_params not set: %q", out)
		}
	})
}

func FuzzVLLMDecodeBody(f *testing.F) {
	for _, b := range pdBodySeeds {
		for _, r := range pdResponseSeeds {
			f.Add([]byte(b), []byte(r))
		}
	}
	f.Fuzz(func(t *testing.T, body, resp []byte) {
		keep, keepResp := pdClone(body), pdClone(resp)
		out, err := VLLMDecodeBody(body, resp)
		if !bytes.Equal(resp, keepResp) {
			t.Fatalf("modified the response")
		}
		pdCheckOutput(t, "VLLMDecodeBody", body, keep, out, err)
		if err == nil {
			var m map[string]json.RawMessage
			if e := json.Unmarshal(out, &m); e != nil || len(m["kv_transfer_params"]) == 0 || m["kv_transfer_params"][0] != '{' {
				t.Fatalf("kv_transfer_params not an object: %q", out)
			}
		}
	})
}

func FuzzTRTLLMContextBody(f *testing.F) {
	for _, s := range pdBodySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		keep := pdClone(body)
		out, err := TRTLLMContextBody(body)
		pdCheckOutput(t, "TRTLLMContextBody", body, keep, out, err)
		if err != nil {
			if pdValidObject(body) {
				t.Fatalf("refused a JSON object: %q: %v", body, err)
			}
			return
		}
		var m map[string]json.RawMessage
		if e := json.Unmarshal(out, &m); e != nil {
			t.Fatalf("output does not decode: %v", e)
		}
		if string(m["stream"]) != "false" || string(m["disaggregated_params"]) != `{"request_type":"context_only"}` {
			t.Fatalf("context fields not set: %q", out)
		}
	})
}

func FuzzTRTLLMGenerationBody(f *testing.F) {
	for _, b := range pdBodySeeds {
		for _, r := range pdResponseSeeds {
			f.Add([]byte(b), []byte(r))
		}
	}
	f.Fuzz(func(t *testing.T, body, resp []byte) {
		keep, keepResp := pdClone(body), pdClone(resp)
		out, pass, err := TRTLLMGenerationBody(body, resp)
		if !bytes.Equal(resp, keepResp) {
			t.Fatalf("modified the response")
		}
		if pass {
			if err != nil || out != nil {
				t.Fatalf("passthrough with an output or an error")
			}
			if !bytes.Equal(body, keep) {
				t.Fatalf("modified its input")
			}
			return
		}
		pdCheckOutput(t, "TRTLLMGenerationBody", body, keep, out, err)
		if err == nil {
			var m map[string]json.RawMessage
			if e := json.Unmarshal(out, &m); e != nil {
				t.Fatalf("output does not decode: %v", e)
			}
			var dp map[string]json.RawMessage
			if e := json.Unmarshal(m["disaggregated_params"], &dp); e != nil || string(dp["request_type"]) != `"generation_only"` {
				t.Fatalf("disaggregated_params not generation_only: %q", out)
			}
		}
	})
}

func FuzzSGLangBootstrapBody(f *testing.F) {
	for _, s := range pdBodySeeds {
		f.Add([]byte(s), "10.0.0.1", 8998, uint64(12345))
	}
	f.Add([]byte(`{}`), "::1", 1, ^uint64(0))
	f.Add([]byte(`{}`), "a\"b\\c\x00\xff", 65535, uint64(0))
	f.Add([]byte(`{}`), "", 0, uint64(0))
	f.Fuzz(func(t *testing.T, body []byte, host string, port int, room uint64) {
		keep := pdClone(body)
		out, err := SGLangBootstrapBody(body, host, port, room)
		pdCheckOutput(t, "SGLangBootstrapBody", body, keep, out, err)
		if err != nil {
			if pdValidObject(body) && host != "" && port >= 1 && port <= 65535 {
				t.Fatalf("refused valid arguments: %v", err)
			}
			return
		}
		var m map[string]json.RawMessage
		if e := json.Unmarshal(out, &m); e != nil {
			t.Fatalf("output does not decode: %v", e)
		}
		var gotRoom uint64
		if e := json.Unmarshal(m["bootstrap_room"], &gotRoom); e != nil || gotRoom != room&(1<<63-1) {
			t.Fatalf("bootstrap_room %s, want %d", m["bootstrap_room"], room&(1<<63-1))
		}
		var gotHost string
		if e := json.Unmarshal(m["bootstrap_host"], &gotHost); e != nil || gotHost == "" {
			t.Fatalf("bootstrap_host %s", m["bootstrap_host"])
		}
	})
}
