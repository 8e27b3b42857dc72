package pdbody

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
)

const (
	pdChatBody = `{"model":"llama","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi \"there\" \u00e9"}],` +
		`"stream":true,"stream_options":{"include_usage":true},"max_tokens":256,"max_completion_tokens":300,"min_tokens":5,"temperature":0.7,"user":"u1"}`
	pdChatBodyPlain  = `{"model":"llama","messages":[{"role":"user","content":"hello"}]}`
	pdCompletionBody = `{ "model" : "llama", "prompt" : ["a b c"], "max_tokens": 32, "stream": false, "seed": 7 }`
	pdTokenIDsBody   = `{"prompt":[1,2,3,4],"model":"m","min_tokens":1,"min_completion_tokens":2}`
)

// pdCheck asserts what every successful builder output must be: valid JSON, an object, its
// input untouched, and "model", "messages" and "prompt" byte-identical to the original.
func pdCheck(t *testing.T, in, out []byte) gjson.Result {
	t.Helper()
	require.True(t, json.Valid(out), "output is not JSON: %s", out)
	res := gjson.ParseBytes(out)
	require.True(t, res.IsObject())
	orig := gjson.ParseBytes(in)
	for _, k := range []string{"model", "messages", "prompt"} {
		assert.Equal(t, orig.Get(k).Raw, res.Get(k).Raw, "field %s", k)
	}
	return res
}

// pdClone returns a copy of b, to check afterwards that a builder left b alone.
func pdClone(b []byte) []byte { return append([]byte(nil), b...) }

// pdDecode decodes out with encoding/json (last duplicate wins, as in Python).
func pdDecode(t *testing.T, out []byte) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(out, &m))
	return m
}

func TestVLLMPrefillBodyChat(t *testing.T) {
	in := []byte(pdChatBody)
	keep := pdClone(in)
	out, err := VLLMPrefillBody(in)
	require.NoError(t, err)
	assert.Equal(t, keep, in, "input modified")
	res := pdCheck(t, in, out)

	kv := res.Get("kv_transfer_params")
	require.True(t, kv.IsObject())
	assert.Equal(t, gjson.True, kv.Get("do_remote_decode").Type)
	assert.Equal(t, gjson.False, kv.Get("do_remote_prefill").Type)
	for _, k := range []string{"remote_engine_id", "remote_block_ids", "remote_host", "remote_port"} {
		v := kv.Get(k)
		assert.True(t, v.Exists(), k)
		assert.Equal(t, gjson.Null, v.Type, k)
	}
	assert.Len(t, kv.Map(), 6)

	assert.Equal(t, gjson.False, res.Get("stream").Type, "stream true → false")
	assert.Equal(t, "1", res.Get("max_tokens").Raw)
	assert.Equal(t, "1", res.Get("max_completion_tokens").Raw)
	assert.False(t, res.Get("stream_options").Exists())
	assert.False(t, res.Get("min_tokens").Exists())
	assert.Equal(t, "0.7", res.Get("temperature").Raw)
	assert.Equal(t, `"u1"`, res.Get("user").Raw)
}

func TestVLLMPrefillBodyWithoutOptionalFields(t *testing.T) {
	in := []byte(pdChatBodyPlain)
	out, err := VLLMPrefillBody(in)
	require.NoError(t, err)
	res := pdCheck(t, in, out)
	assert.Equal(t, gjson.False, res.Get("stream").Type, "stream added as false")
	assert.Equal(t, "1", res.Get("max_tokens").Raw, "max_tokens added")
	assert.False(t, res.Get("max_completion_tokens").Exists(), "max_completion_tokens only if present")
	assert.False(t, res.Get("stream_options").Exists())
	assert.False(t, res.Get("min_tokens").Exists())
	assert.True(t, res.Get("kv_transfer_params.do_remote_decode").Bool())
	assert.Len(t, pdDecode(t, out), 5)
}

func TestVLLMPrefillBodyCompletions(t *testing.T) {
	in := []byte(pdCompletionBody)
	out, err := VLLMPrefillBody(in)
	require.NoError(t, err)
	res := pdCheck(t, in, out)
	assert.Equal(t, `["a b c"]`, res.Get("prompt").Raw)
	assert.Equal(t, "1", res.Get("max_tokens").Raw)
	assert.Equal(t, gjson.False, res.Get("stream").Type)
	assert.Equal(t, "7", res.Get("seed").Raw)
	assert.False(t, res.Get("max_completion_tokens").Exists())
	// The kept members are copied with their original spacing.
	assert.Contains(t, string(out), `"model" : "llama"`)
	assert.Contains(t, string(out), `"prompt" : ["a b c"]`)

	in = []byte(pdTokenIDsBody)
	out, err = VLLMPrefillBody(in)
	require.NoError(t, err)
	res = pdCheck(t, in, out)
	assert.Equal(t, "[1,2,3,4]", res.Get("prompt").Raw)
	assert.False(t, res.Get("min_tokens").Exists())
	assert.False(t, res.Get("min_completion_tokens").Exists(), "vLLM's proxy drops it too")
}

func TestVLLMPrefillBodyNullMaxCompletionTokensIsPresent(t *testing.T) {
	out, err := VLLMPrefillBody([]byte(`{"prompt":"x","max_completion_tokens":null}`))
	require.NoError(t, err)
	assert.Equal(t, "1", gjson.GetBytes(out, "max_completion_tokens").Raw)
}

func TestVLLMPrefillBodyDuplicateAndEscapedKeys(t *testing.T) {
	// Python keeps the last duplicate and unescapes keys: every variant must go.
	in := []byte(`{"stream":true,"prompt":"p","str\u0065am":true,"stream_options":{},"stream_options":{"include_usage":true},"max_tokens":9,"max_tokens":10}`)
	out, err := VLLMPrefillBody(in)
	require.NoError(t, err)
	m := pdDecode(t, out)
	assert.Equal(t, false, m["stream"])
	assert.Equal(t, float64(1), m["max_tokens"])
	_, has := m["stream_options"]
	assert.False(t, has)
	assert.Equal(t, 1, strings.Count(string(out), `"stream"`))
	assert.NotContains(t, string(out), `\u0065`)
}

func TestVLLMPrefillBodyReplacesClientKVParams(t *testing.T) {
	in := []byte(`{"prompt":"p","kv_transfer_params":{"do_remote_prefill":true,"remote_host":"evil"}}`)
	out, err := VLLMPrefillBody(in)
	require.NoError(t, err)
	res := gjson.ParseBytes(out)
	assert.True(t, res.Get("kv_transfer_params.do_remote_decode").Bool())
	assert.Equal(t, gjson.Null, res.Get("kv_transfer_params.remote_host").Type)
	assert.Equal(t, 1, strings.Count(string(out), "kv_transfer_params"))
}

func TestVLLMPrefillBodyEmptyObject(t *testing.T) {
	out, err := VLLMPrefillBody([]byte(" \n{ }\t"))
	require.NoError(t, err)
	m := pdDecode(t, out)
	assert.Len(t, m, 3) // kv_transfer_params, stream, max_tokens
}

const pdPrefillResponse = `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":"length"}],` +
	`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2,3],"remote_engine_id":"e-1","remote_request_id":"r-1","remote_host":"10.0.0.5","remote_port":5600,"tp_size":1}}`

func TestVLLMDecodeBody(t *testing.T) {
	for _, body := range []string{pdChatBody, pdChatBodyPlain, pdCompletionBody, pdTokenIDsBody} {
		in, resp := []byte(body), []byte(pdPrefillResponse)
		keepIn, keepResp := pdClone(in), pdClone(resp)
		out, err := VLLMDecodeBody(in, resp)
		require.NoError(t, err)
		assert.Equal(t, keepIn, in)
		assert.Equal(t, keepResp, resp)
		res := pdCheck(t, in, out)
		assert.Equal(t, gjson.Get(pdPrefillResponse, "kv_transfer_params").Raw, res.Get("kv_transfer_params").Raw, "raw copy")

		// Everything else is the original body, unchanged (stream, max_tokens, min_tokens, ...).
		orig := pdDecode(t, in)
		got := pdDecode(t, out)
		delete(got, "kv_transfer_params")
		assert.Equal(t, orig, got)
	}
}

func TestVLLMDecodeBodyReplacesPrefillParams(t *testing.T) {
	prefill, err := VLLMPrefillBody([]byte(pdChatBody))
	require.NoError(t, err)
	// Decode is built from the original body, but also works on any body carrying params.
	out, err := VLLMDecodeBody(prefill, []byte(pdPrefillResponse))
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(out), "kv_transfer_params"))
	assert.True(t, gjson.GetBytes(out, "kv_transfer_params.do_remote_prefill").Bool())
}

func TestVLLMDecodeBodyLastDuplicateWins(t *testing.T) {
	resp := `{"kv_transfer_params":{"remote_host":"first"},"kv_transfer_params":{"remote_host":"second"}}`
	out, err := VLLMDecodeBody([]byte(pdChatBodyPlain), []byte(resp))
	require.NoError(t, err)
	assert.Equal(t, "second", gjson.GetBytes(out, "kv_transfer_params.remote_host").Str)
}

func TestVLLMDecodeBodyErrors(t *testing.T) {
	cases := map[string][2]string{
		"body not JSON":          {`{"model":`, pdPrefillResponse},
		"body array":             {`[1]`, pdPrefillResponse},
		"response not JSON":      {pdChatBodyPlain, `<html>502</html>`},
		"response empty":         {pdChatBodyPlain, ``},
		"response array":         {pdChatBodyPlain, `[{"kv_transfer_params":{}}]`},
		"no params":              {pdChatBodyPlain, `{"choices":[]}`},
		"null params":            {pdChatBodyPlain, `{"kv_transfer_params":null}`},
		"empty params":           {pdChatBodyPlain, `{"kv_transfer_params":{}}`},
		"string params":          {pdChatBodyPlain, `{"kv_transfer_params":"x"}`},
		"nested params only":     {pdChatBodyPlain, `{"x":{"kv_transfer_params":{"a":1}}}`},
		"last duplicate is null": {pdChatBodyPlain, `{"kv_transfer_params":{"a":1},"kv_transfer_params":null}`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			out, err := VLLMDecodeBody([]byte(c[0]), []byte(c[1]))
			assert.Nil(t, out)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrPDBody), "%v", err)
		})
	}
}

func TestTRTLLMContextBody(t *testing.T) {
	for _, body := range []string{pdChatBody, pdChatBodyPlain, pdCompletionBody, pdTokenIDsBody} {
		in := []byte(body)
		keep := pdClone(in)
		out, err := TRTLLMContextBody(in)
		require.NoError(t, err)
		assert.Equal(t, keep, in)
		res := pdCheck(t, in, out)
		assert.Equal(t, `{"request_type":"context_only"}`, res.Get("disaggregated_params").Raw)
		assert.Equal(t, gjson.False, res.Get("stream").Type)
		assert.False(t, res.Get("stream_options").Exists())

		// Everything else is untouched: max_tokens, min_tokens, sampling.
		orig, got := pdDecode(t, in), pdDecode(t, out)
		for _, k := range []string{"disaggregated_params", "stream", "stream_options"} {
			delete(orig, k)
			delete(got, k)
		}
		assert.Equal(t, orig, got)
	}
}

func TestTRTLLMContextBodyReplacesClientParams(t *testing.T) {
	out, err := TRTLLMContextBody([]byte(`{"prompt":"p","disaggregated_params":{"request_type":"generation_only","ctx_request_id":9}}`))
	require.NoError(t, err)
	assert.Equal(t, `{"request_type":"context_only"}`, gjson.GetBytes(out, "disaggregated_params").Raw)
	assert.Equal(t, 1, strings.Count(string(out), "disaggregated_params"))
}

func pdContextResponse(finish string) string {
	return `{"id":"chatcmpl-9","object":"chat.completion","model":"llama","prompt_token_ids":[1,2,3],"choices":[{"index":0,"message":{"role":"assistant","content":"A"},` +
		`"finish_reason":` + finish + `,"disaggregated_params":{"request_type":"context_only","first_gen_tokens":[42],"ctx_request_id":123,` +
		`"encoded_opaque_state":"b3BhcXVl","draft_tokens":null,"disagg_request_id":77}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`
}

func TestTRTLLMGenerationBody(t *testing.T) {
	for _, finish := range []string{`"length"`, `"not_finished"`} {
		for _, body := range []string{pdChatBody, pdChatBodyPlain, pdCompletionBody, pdTokenIDsBody} {
			in, resp := []byte(body), []byte(pdContextResponse(finish))
			keepIn, keepResp := pdClone(in), pdClone(resp)
			out, pass, err := TRTLLMGenerationBody(in, resp)
			require.NoError(t, err)
			require.False(t, pass, finish)
			assert.Equal(t, keepIn, in)
			assert.Equal(t, keepResp, resp)
			res := pdCheck(t, in, out)

			dp := res.Get("disaggregated_params")
			require.True(t, dp.IsObject())
			assert.Equal(t, "generation_only", dp.Get("request_type").Str)
			assert.Equal(t, "[42]", dp.Get("first_gen_tokens").Raw)
			assert.Equal(t, "123", dp.Get("ctx_request_id").Raw)
			assert.Equal(t, "b3BhcXVl", dp.Get("encoded_opaque_state").Str)
			assert.Equal(t, "77", dp.Get("disagg_request_id").Raw)
			assert.True(t, dp.Get("draft_tokens").Exists())
			assert.Equal(t, 1, strings.Count(dp.Raw, "request_type"))

			// The rest is the original body: stream as the client asked.
			orig, got := pdDecode(t, in), pdDecode(t, out)
			delete(got, "disaggregated_params")
			assert.Equal(t, orig, got)
		}
	}
}

func TestTRTLLMGenerationBodyPassthrough(t *testing.T) {
	for _, finish := range []string{`"stop"`, `"content_filter"`, `"tool_calls"`, `null`, `""`, `"LENGTH"`, `5`} {
		out, pass, err := TRTLLMGenerationBody([]byte(pdChatBody), []byte(pdContextResponse(finish)))
		require.NoError(t, err, finish)
		assert.True(t, pass, finish)
		assert.Nil(t, out, finish)
	}
	// No finish_reason at all: TensorRT-LLM's `finish_reason not in ["length", "not_finished"]`.
	out, pass, err := TRTLLMGenerationBody([]byte(pdChatBody), []byte(`{"choices":[{"index":0,"text":"x"}]}`))
	require.NoError(t, err)
	assert.True(t, pass)
	assert.Nil(t, out)
	// A finished answer needs no disaggregated_params.
	_, pass, err = TRTLLMGenerationBody([]byte(pdChatBody), []byte(`{"choices":[{"finish_reason":"stop"}]}`))
	require.NoError(t, err)
	assert.True(t, pass)
}

func TestTRTLLMGenerationBodyErrors(t *testing.T) {
	cases := map[string][2]string{
		"body not JSON":         {`nope`, pdContextResponse(`"length"`)},
		"body string":           {`"x"`, pdContextResponse(`"length"`)},
		"response not JSON":     {pdChatBody, `{"choices":[`},
		"response null":         {pdChatBody, `null`},
		"no choices":            {pdChatBody, `{"id":"x"}`},
		"empty choices":         {pdChatBody, `{"choices":[]}`},
		"choices object":        {pdChatBody, `{"choices":{"finish_reason":"length"}}`},
		"choice not object":     {pdChatBody, `{"choices":["length"]}`},
		"no params":             {pdChatBody, `{"choices":[{"finish_reason":"length"}]}`},
		"null params":           {pdChatBody, `{"choices":[{"finish_reason":"not_finished","disaggregated_params":null}]}`},
		"array params":          {pdChatBody, `{"choices":[{"finish_reason":"length","disaggregated_params":[]}]}`},
		"params on 2nd choice":  {pdChatBody, `{"choices":[{"finish_reason":"length"},{"disaggregated_params":{}}]}`},
		"params at top level":   {pdChatBody, `{"disaggregated_params":{},"choices":[{"finish_reason":"length"}]}`},
		"body array, stop resp": {`[]`, pdContextResponse(`"stop"`)},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			out, pass, err := TRTLLMGenerationBody([]byte(c[0]), []byte(c[1]))
			assert.Nil(t, out)
			assert.False(t, pass)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrPDBody), "%v", err)
		})
	}
}

func TestTRTLLMGenerationBodyEmptyParams(t *testing.T) {
	out, pass, err := TRTLLMGenerationBody([]byte(pdChatBodyPlain), []byte(`{"choices":[{"finish_reason":"length","disaggregated_params":{}}]}`))
	require.NoError(t, err)
	assert.False(t, pass)
	assert.Equal(t, `{"request_type":"generation_only"}`, gjson.GetBytes(out, "disaggregated_params").Raw)
}

func TestSGLangBootstrapBody(t *testing.T) {
	for _, body := range []string{pdChatBody, pdChatBodyPlain, pdCompletionBody, pdTokenIDsBody} {
		in := []byte(body)
		keep := pdClone(in)
		room := uint64(1<<63 - 1)
		out, err := SGLangBootstrapBody(in, "10.0.0.7", 8998, room)
		require.NoError(t, err)
		assert.Equal(t, keep, in)
		res := pdCheck(t, in, out)
		assert.Equal(t, `"10.0.0.7"`, res.Get("bootstrap_host").Raw)
		assert.Equal(t, "8998", res.Get("bootstrap_port").Raw)
		assert.Equal(t, "9223372036854775807", res.Get("bootstrap_room").Raw, "a JSON integer, not a float")
		assert.Equal(t, room, res.Get("bootstrap_room").Uint())

		// Everything else, stream included, is the original: both legs get this body.
		orig, got := pdDecode(t, in), pdDecode(t, out)
		for _, k := range []string{"bootstrap_host", "bootstrap_port", "bootstrap_room"} {
			delete(got, k)
		}
		assert.Equal(t, orig, got)
	}
}

func TestSGLangBootstrapBodyHosts(t *testing.T) {
	cases := map[string]string{
		"10.0.0.1":         `"10.0.0.1"`,
		"prefill-0.svc":    `"prefill-0.svc"`,
		"::1":              `"[::1]"`,
		"fd00::5":          `"[fd00::5]"`,
		"[fd00::5]":        `"[fd00::5]"`,
		"we\"ird\\h\x01st": `"we\"ird\\h\u0001st"`,
		"bad\xffutf8":      `"bad` + "\ufffd" + `utf8"`,
	}
	for host, want := range cases {
		out, err := SGLangBootstrapBody([]byte(pdChatBodyPlain), host, 30001, 5)
		require.NoError(t, err, host)
		require.True(t, json.Valid(out), "%q: %s", host, out)
		assert.Equal(t, want, gjson.GetBytes(out, "bootstrap_host").Raw, host)
	}
}

func TestSGLangBootstrapBodyRoomAndReplace(t *testing.T) {
	in := []byte(`{"prompt":"p","bootstrap_room":1,"bootstrap_host":"client","bootstrap_room":2}`)
	out, err := SGLangBootstrapBody(in, "h", 1, ^uint64(0))
	require.NoError(t, err)
	assert.Equal(t, "9223372036854775807", gjson.GetBytes(out, "bootstrap_room").Raw, "masked to 63 bits")
	assert.Equal(t, 1, strings.Count(string(out), "bootstrap_room"))
	assert.Equal(t, 1, strings.Count(string(out), "bootstrap_host"))
	assert.Equal(t, "1", gjson.GetBytes(out, "bootstrap_port").Raw)

	out, err = SGLangBootstrapBody([]byte(`{}`), "h", 65535, 0)
	require.NoError(t, err)
	assert.JSONEq(t, `{"bootstrap_host":"h","bootstrap_port":65535,"bootstrap_room":0}`, string(out))
}

func TestSGLangBootstrapBodyErrors(t *testing.T) {
	type c struct {
		body string
		host string
		port int
	}
	for name, tc := range map[string]c{
		"body not JSON": {`{"a":1,}`, "h", 8998},
		"body number":   {`42`, "h", 8998},
		"body empty":    {``, "h", 8998},
		"empty host":    {`{}`, "", 8998},
		"port 0":        {`{}`, "h", 0},
		"port negative": {`{}`, "h", -1},
		"port too big":  {`{}`, "h", 65536},
	} {
		out, err := SGLangBootstrapBody([]byte(tc.body), tc.host, tc.port, 1)
		assert.Nil(t, out, name)
		require.Error(t, err, name)
		assert.True(t, errors.Is(err, ErrPDBody), "%s: %v", name, err)
	}
}

func TestBootstrapRoom(t *testing.T) {
	seen := make(map[uint64]bool)
	for i := uint64(0); i < 10000; i++ {
		r := BootstrapRoom(i)
		assert.NotZero(t, r)
		assert.Less(t, r, uint64(1)<<63)
		assert.Equal(t, r, BootstrapRoom(i), "deterministic")
		seen[r] = true
	}
	assert.Len(t, seen, 10000, "distinct identities give distinct rooms")
	for _, id := range []uint64{^uint64(0), 1 << 63, 0x9e3779b97f4a7c15, -0x9e3779b97f4a7c15 & (1<<64 - 1)} {
		r := BootstrapRoom(id)
		assert.NotZero(t, r)
		assert.Less(t, r, uint64(1)<<63)
	}
	// The one identity whose mix is 0 still gets a non-zero room.
	assert.Equal(t, uint64(defaultBootstrapRoom), BootstrapRoom(-0x9e3779b97f4a7c15&(1<<64-1)))
}

func TestHostOfAddress(t *testing.T) {
	cases := map[string]string{
		"10.0.0.1:8000":       "10.0.0.1",
		"[::1]:8000":          "::1",
		"[fd00::1:2]:30000":   "fd00::1:2",
		"svc.ns.cluster:80":   "svc.ns.cluster",
		"localhost":           "localhost",
		"::1":                 "::1",
		"fd00::1":             "fd00::1",
		"[::1]":               "::1",
		"[::1":                "[::1",
		"":                    "",
		":8000":               "",
		"host:":               "host",
		"10.0.0.1:8000:extra": "10.0.0.1:8000:extra",
		"[fe80::1%eth0]:9000": "fe80::1%eth0",
		"prefill-0.default:0": "prefill-0.default",
	}
	for in, want := range cases {
		assert.Equal(t, want, HostOfAddress(in), in)
	}
}

func TestRewriteObjectKeepsMembersVerbatim(t *testing.T) {
	obj := "{\n  \"a\" :\t[1, 2 ,3],\n  \"b\": {\"x\" : \"y\"} , \"c\":\"\\u00e9\"\n}"
	out := rewriteObject(obj, []objectEdit{{key: "b", mode: editDrop}, {key: "d", raw: "true", mode: editSet}})
	assert.Equal(t, "{\"a\" :\t[1, 2 ,3],\"c\":\"\\u00e9\",\"d\":true}", string(out))
	assert.True(t, json.Valid(out))
	assert.True(t, bytes.HasPrefix(out, []byte("{")))
}

func TestStripPDFields(t *testing.T) {
	body := []byte(`{"model":"m","kv_transfer_params":{"do_remote_prefill":true,"remote_host":"evil"},"messages":[{"role":"user","content":"kv_transfer_params"}],"bootstrap_host":"evil","bootstrap_room":1,"disaggregated_params":{"request_type":"generation_only"}}`)
	out, changed := StripPDFields(body)
	require.True(t, changed)
	for _, k := range pdControlFields {
		assert.False(t, gjson.GetBytes(out, k).Exists(), k)
	}
	assert.Equal(t, gjson.GetBytes(body, "messages").Raw, gjson.GetBytes(out, "messages").Raw)
	assert.Equal(t, "m", gjson.GetBytes(out, "model").String())
	plain := []byte(`{"model":"m","messages":[]}`)
	same, changed := StripPDFields(plain)
	assert.False(t, changed)
	assert.Equal(t, plain, same)
	notJSON := []byte(`kv_transfer_params {`)
	same, changed = StripPDFields(notJSON)
	assert.False(t, changed)
	assert.Equal(t, notJSON, same)
}
