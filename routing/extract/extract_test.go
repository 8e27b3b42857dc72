package extract

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unsafe"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/hashx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// defaultExtractOptions are the options the default config gives.
func defaultExtractOptions() ExtractOptions {
	cfg := config.DefaultConfig()
	return ExtractOptions{
		CharsPerToken: cfg.CharsPerToken,
		BlockTokens:   cfg.Prefix.BlockTokens,
		BodyFields:    cfg.Conversation.BodyFields,
	}
}

func mustExtract(t *testing.T, api API, body string, opt ExtractOptions) Request {
	t.Helper()
	var req Request
	require.NoError(t, Extract(api, []byte(body), opt, &req))
	return req
}

// tokenIDs is the canonical prompt of a token-id prompt.
func tokenIDs(ids ...uint32) string {
	b := make([]byte, 0, 4*len(ids))
	for _, id := range ids {
		b = append(b, byte(id), byte(id>>8), byte(id>>16), byte(id>>24))
	}
	return string(b)
}

func TestExtractShapes(t *testing.T) {
	const image = `{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}`
	const toolCalls = `[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]`
	const fnCall = `{"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{}"}`
	const fnOutput = `{"type":"function_call_output","call_id":"call_1","output":"sunny"}`
	const inputImage = `{"type":"input_image","image_url":"https://example.com/cat.png"}`
	tests := []struct {
		name       string
		api        API
		body       string
		prompt     string
		tokens     int
		blockBytes int
	}{{
		name: "chat string content",
		api:  APIChatCompletions,
		body: `{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Hi"}]}`,
		// 31 bytes of text
		prompt: "system:You are helpful.\nuser:Hi", tokens: 7, blockBytes: 64,
	}, {
		name:   "chat text parts",
		api:    APIChatCompletions,
		body:   `{"messages":[{"role":"user","content":[{"type":"text","text":"Hel"},{"type":"input_text","text":"lo"}]}]}`,
		prompt: "user:Hello", tokens: 2, blockBytes: 64,
	}, {
		name:   "chat image part is hashed but not counted",
		api:    APIChatCompletions,
		body:   `{"messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},` + image + `]}]}`,
		prompt: "user:What is this?" + image, tokens: 18 / 4, blockBytes: 64,
	}, {
		name:   "chat audio part is hashed but not counted",
		api:    APIChatCompletions,
		body:   `{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}},{"type":"text","text":"Transcribe"}]}]}`,
		prompt: `user:{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}}Transcribe`,
		tokens: 15 / 4, blockBytes: 64,
	}, {
		name:   "chat tool calls are hashed but not counted",
		api:    APIChatCompletions,
		body:   `{"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":null,"tool_calls":` + toolCalls + `},{"role":"tool","tool_call_id":"call_1","content":"sunny"}]}`,
		prompt: "user:Weather?\nassistant:" + toolCalls + "\ntool:sunny",
		// "user:Weather?" 13 + "\nassistant:" 11 + "\ntool:sunny" 11
		tokens: 35 / 4, blockBytes: 64,
	}, {
		name:   "chat escapes are decoded and CJK counts its bytes",
		api:    APIChatCompletions,
		body:   `{"messages":[{"role":"user","content":"a\n\"b\"\u00e9 你好"}]}`,
		prompt: "user:a\n\"b\"é 你好", tokens: (5 + 5 + 2 + 1 + 6) / 4, blockBytes: 64,
	}, {
		name:   "chat roles: escaped, quoted, longer than a word",
		api:    APIChatCompletions,
		body:   `{"messages":[{"role":"us\u0065r","content":"x"},{"role":"a\"b","content":"y"},{"role":"a-role-longer-than-16","content":"z"}]}`,
		prompt: "user:x\na\"b:y\na-role-longer-than-16:z", tokens: 36 / 4, blockBytes: 64,
	}, {
		name:   "chat missing role and content",
		api:    APIChatCompletions,
		body:   `{"messages":[{"content":"x"},{"role":"user"}]}`,
		prompt: ":x\nuser:", tokens: 8 / 4, blockBytes: 64,
	}, {
		name:   "chat empty messages",
		api:    APIChatCompletions,
		body:   `{"messages":[]}`,
		prompt: "", tokens: 0, blockBytes: 64,
	}, {
		name:   "completions string",
		api:    APICompletions,
		body:   `{"model":"m","prompt":"Say this is a test","max_tokens":7}`,
		prompt: "Say this is a test", tokens: 18 / 4, blockBytes: 64,
	}, {
		name:   "completions batch estimates all and hashes the first",
		api:    APICompletions,
		body:   `{"prompt":["abcd","efghijkl","mn"]}`,
		prompt: "abcd", tokens: 14 / 4, blockBytes: 64,
	}, {
		name:   "completions token ids",
		api:    APICompletions,
		body:   `{"prompt":[1, 256, 65536, 4294967295, 0]}`,
		prompt: tokenIDs(1, 256, 65536, 4294967295, 0), tokens: 5, blockBytes: 16 * 4,
	}, {
		name:   "completions arrays of token ids",
		api:    APICompletions,
		body:   `{"prompt":[[1,2],[3,4,5],[]]}`,
		prompt: tokenIDs(1, 2), tokens: 5, blockBytes: 16 * 4,
	}, {
		name:   "completions empty array",
		api:    APICompletions,
		body:   `{"prompt":[]}`,
		prompt: "", tokens: 0, blockBytes: 64,
	}, {
		name:   "responses instructions and string input",
		api:    APIResponses,
		body:   `{"model":"m","instructions":"Be brief.","input":"Hello"}`,
		prompt: "system:Be brief.\nuser:Hello", tokens: 27 / 4, blockBytes: 64,
	}, {
		name:   "responses string input",
		api:    APIResponses,
		body:   `{"input":"Hello","instructions":null}`,
		prompt: "user:Hello", tokens: 10 / 4, blockBytes: 64,
	}, {
		name: "responses items",
		api:  APIResponses,
		body: `{"instructions":"Sys","input":[` +
			`{"role":"user","content":"Weather?"},` + fnCall + `,` + fnOutput + `,` +
			`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Sunny."}]},` +
			`{"role":"user","content":[{"type":"input_text","text":"And "},` + inputImage + `,{"type":"input_text","text":"this?"}]}]}`,
		prompt: "system:Sys\nuser:Weather?\n" + fnCall + "\n" + fnOutput + "\nassistant:Sunny.\nuser:And " + inputImage + "this?",
		// "system:Sys" 10, "\nuser:Weather?" 14, "\n" 1, "\n" 1, "\nassistant:Sunny." 17, "\nuser:And this?" 15
		tokens: 58 / 4, blockBytes: 64,
	}, {
		name:   "responses empty input",
		api:    APIResponses,
		body:   `{"input":[]}`,
		prompt: "", tokens: 0, blockBytes: 64,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := mustExtract(t, tc.api, tc.body, defaultExtractOptions())
			assert.Equal(t, tc.prompt, string(req.Prompt))
			assert.Equal(t, tc.tokens, req.Tokens)
			assert.Equal(t, tc.blockBytes, req.BlockBytes)
			assert.False(t, req.HasConversation)
		})
	}
}

// TestExtractMemberOrder checks that the canonical prompt does not depend on how a
// client orders or formats members, and how odd but valid bodies read.
func TestExtractMemberOrder(t *testing.T) {
	tests := []struct {
		name   string
		api    API
		body   string
		prompt string
		tokens int
	}{{
		name:   "content before role",
		api:    APIChatCompletions,
		body:   `{"messages":[{"content":"Hi","role":"user"},{"content":[{"text":"Yo","type":"text"}],"role":"assistant"}]}`,
		prompt: "user:Hi\nassistant:Yo", tokens: 20 / 4,
	}, {
		name:   "messages before model, pretty-printed",
		api:    APIChatCompletions,
		body:   "{\n  \"messages\" : [\n    { \"role\" : \"user\" ,\n      \"content\" : \"Hi\" }\n  ] ,\n  \"model\" : \"m\"\n}\n",
		prompt: "user:Hi", tokens: 7 / 4,
	}, {
		name:   "tool_calls before content",
		api:    APIChatCompletions,
		body:   `{"messages":[{"tool_calls":[{"id":"c"}],"role":"assistant","content":"Calling."}]}`,
		prompt: `assistant:Calling.[{"id":"c"}]`, tokens: 18 / 4,
	}, {
		name:   "a part whose text is not a string is not text",
		api:    APIChatCompletions,
		body:   `{"messages":[{"role":"user","content":[{"type":"text","text":null},"bare",{"type":"text","text":"ok"}]}]}`,
		prompt: `user:{"type":"text","text":null}"bare"ok`, tokens: 7 / 4,
	}, {
		name:   "escaped keys",
		api:    APIChatCompletions,
		body:   `{"m\u0065ssages":[{"r\u006fle":"user","\u0063ontent":"hi"}]}`,
		prompt: "user:hi", tokens: 7 / 4,
	}, {
		name:   "duplicate members: the first counts",
		api:    APIChatCompletions,
		body:   `{"messages":[{"role":"user","content":"a","role":"x","content":"b"}],"messages":[]}`,
		prompt: "user:a", tokens: 6 / 4,
	}, {
		name:   "a non-string role is empty",
		api:    APIChatCompletions,
		body:   `{"messages":[{"role":1,"content":"a"}]}`,
		prompt: ":a", tokens: 0,
	}, {
		name:   "responses item content before role, instructions last",
		api:    APIResponses,
		body:   `{"input":[{"content":"hi","role":"user"}],"instructions":"Sys"}`,
		prompt: "system:Sys\nuser:hi", tokens: 18 / 4,
	}, {
		name:   "responses item with null content is raw",
		api:    APIResponses,
		body:   `{"input":[{"type":"reasoning","content":null},{"role":"user","content":"q"}]}`,
		prompt: `{"type":"reasoning","content":null}` + "\nuser:q", tokens: 7 / 4,
	}, {
		name:   "completions batch with escapes counts decoded bytes",
		api:    APICompletions,
		body:   `{"prompt":["a\\b","\u00e9\n"]}`,
		prompt: `a\b`, tokens: (3 + 3) / 4,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := mustExtract(t, tc.api, tc.body, defaultExtractOptions())
			assert.Equal(t, tc.prompt, string(req.Prompt))
			assert.Equal(t, tc.tokens, req.Tokens)
		})
	}
}

func TestExtractCharsPerToken(t *testing.T) {
	opt := ExtractOptions{CharsPerToken: 3, BlockTokens: 8}
	req := mustExtract(t, APICompletions, `{"prompt":"abcdefghij"}`, opt)
	assert.Equal(t, 3, req.Tokens)
	assert.Equal(t, 24, req.BlockBytes)

	req = mustExtract(t, APICompletions, `{"prompt":[7,8]}`, opt)
	assert.Equal(t, 2, req.Tokens)
	assert.Equal(t, 32, req.BlockBytes)

	// Out-of-range options are treated as 1 rather than dividing by zero.
	req = mustExtract(t, APICompletions, `{"prompt":"abcdefghij"}`, ExtractOptions{})
	assert.Equal(t, 10, req.Tokens)
	assert.Equal(t, 1, req.BlockBytes)
}

func TestExtractModelAndStream(t *testing.T) {
	opt := defaultExtractOptions()
	req := mustExtract(t, APIChatCompletions, `{"model":"llama-3","stream":true,"messages":[]}`, opt)
	assert.Equal(t, "llama-3", req.Model)
	assert.True(t, req.Stream)

	req = mustExtract(t, APIChatCompletions, `{"model":7,"stream":"true","messages":[]}`, opt)
	assert.Equal(t, "", req.Model)
	assert.False(t, req.Stream)

	req = mustExtract(t, APIChatCompletions, `{"model":"a","model":"b","stream":false,"messages":[]}`, opt)
	assert.Equal(t, "a", req.Model, "the first of duplicate members wins, as with gjson.Get")
	assert.False(t, req.Stream)

	// Model is a copy: it does not alias the body.
	body := []byte(`{"model":"qwen","messages":[]}`)
	require.NoError(t, Extract(APIChatCompletions, body, opt, &req))
	for i := range body {
		body[i] = 'x'
	}
	assert.Equal(t, "qwen", req.Model)
}

func TestExtractStringAndPartsAgree(t *testing.T) {
	opt := defaultExtractOptions()
	a := mustExtract(t, APIChatCompletions, `{"messages":[{"role":"system","content":"Be nice."},{"role":"user","content":"Hello, world"}]}`, opt)
	b := mustExtract(t, APIChatCompletions, `{"messages":[{"role":"system","content":[{"type":"text","text":"Be nice."}]},{"role":"user","content":[{"type":"text","text":"Hello, "},{"type":"input_text","text":"world"}]}]}`, opt)
	assert.Equal(t, string(a.Prompt), string(b.Prompt))
	assert.Equal(t, a.Tokens, b.Tokens)

	// A responses string input reads as a one-message user conversation.
	c := mustExtract(t, APIResponses, `{"input":"Hello, world"}`, opt)
	d := mustExtract(t, APIResponses, `{"input":[{"role":"user","content":"Hello, world"}]}`, opt)
	e := mustExtract(t, APIChatCompletions, `{"messages":[{"role":"user","content":"Hello, world"}]}`, opt)
	assert.Equal(t, string(c.Prompt), string(d.Prompt))
	assert.Equal(t, string(c.Prompt), string(e.Prompt))
	assert.Equal(t, c.Tokens, e.Tokens)
}

func TestExtractChatTurnsExtendThePrefix(t *testing.T) {
	opt := defaultExtractOptions()
	turn1 := mustExtract(t, APIChatCompletions, `{"messages":[{"role":"system","content":"S"},{"role":"user","content":"Q1"}]}`, opt)
	turn2 := mustExtract(t, APIChatCompletions, `{"messages":[{"role":"system","content":"S"},{"role":"user","content":"Q1"},{"role":"assistant","content":"A1"},{"role":"user","content":"Q2"}]}`, opt)
	assert.True(t, strings.HasPrefix(string(turn2.Prompt), string(turn1.Prompt)))
}

func TestExtractMultimodalImagesDiffer(t *testing.T) {
	opt := defaultExtractOptions()
	a := mustExtract(t, APIChatCompletions, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"text","text":"Describe"}]}]}`, opt)
	b := mustExtract(t, APIChatCompletions, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,BBBB"}},{"type":"text","text":"Describe"}]}]}`, opt)
	assert.NotEqual(t, string(a.Prompt), string(b.Prompt))
	assert.Equal(t, a.Tokens, b.Tokens)
	assert.Equal(t, len("user:Describe")/4, a.Tokens)
}

func TestExtractConversation(t *testing.T) {
	opt := defaultExtractOptions()
	fp := hashx.FingerprintString
	tests := []struct {
		name   string
		body   string
		want   uint64
		wantOK bool
	}{
		{"conversation_params.conversation_id", `{"conversation_params":{"conversation_id":"c-1"},"messages":[]}`, fp("c-1"), true},
		{"prompt_cache_key", `{"messages":[],"prompt_cache_key":"pck"}`, fp("pck"), true},
		{"conversation string", `{"conversation":"conv_123","messages":[]}`, fp("conv_123"), true},
		{"conversation object", `{"conversation":{"id":"conv_456","other":1},"messages":[]}`, fp("conv_456"), true},
		{"conversation object number id", `{"conversation":{"id":99},"messages":[]}`, fp("99"), true},
		{"number by raw text", `{"conversation_params":{"conversation_id":12345},"messages":[]}`, fp("12345"), true},
		{"float number by raw text", `{"prompt_cache_key":1.5e3,"messages":[]}`, fp("1.5e3"), true},
		{"escaped string is unescaped", `{"prompt_cache_key":"a\u0062c","messages":[]}`, fp("abc"), true},
		{"first field wins", `{"conversation":"third","prompt_cache_key":"second","conversation_params":{"conversation_id":"first"},"messages":[]}`, fp("first"), true},
		{"empty string skipped", `{"conversation_params":{"conversation_id":""},"prompt_cache_key":"second","messages":[]}`, fp("second"), true},
		{"null skipped", `{"conversation_params":{"conversation_id":null},"conversation":"third","messages":[]}`, fp("third"), true},
		{"bool and array skipped", `{"prompt_cache_key":true,"conversation_params":{"conversation_id":["x"]},"conversation":"third","messages":[]}`, fp("third"), true},
		{"object without id skipped", `{"conversation":{"name":"x"},"messages":[]}`, 0, false},
		{"object with empty id skipped", `{"conversation":{"id":""},"messages":[]}`, 0, false},
		{"parent not an object", `{"conversation_params":"c-1","messages":[]}`, 0, false},
		{"none", `{"messages":[]}`, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := mustExtract(t, APIChatCompletions, tc.body, opt)
			assert.Equal(t, tc.wantOK, req.HasConversation)
			assert.Equal(t, tc.want, req.Conversation)
		})
	}

	t.Run("header id is not overridden", func(t *testing.T) {
		req := Request{Conversation: 42, HasConversation: true}
		require.NoError(t, Extract(APIChatCompletions, []byte(`{"prompt_cache_key":"pck","messages":[]}`), opt, &req))
		assert.True(t, req.HasConversation)
		assert.Equal(t, uint64(42), req.Conversation)
	})
	t.Run("disabled", func(t *testing.T) {
		opt := opt
		opt.BodyFields = nil
		req := mustExtract(t, APIChatCompletions, `{"prompt_cache_key":"pck","messages":[]}`, opt)
		assert.False(t, req.HasConversation)
	})
	t.Run("every API", func(t *testing.T) {
		req := mustExtract(t, APICompletions, `{"prompt":"x","prompt_cache_key":"k"}`, opt)
		assert.Equal(t, fp("k"), req.Conversation)
		req = mustExtract(t, APIResponses, `{"input":"x","conversation":{"id":"conv_1"}}`, opt)
		assert.Equal(t, fp("conv_1"), req.Conversation)
	})
	t.Run("gjson paths beyond plain names, prepared or not", func(t *testing.T) {
		opt := opt
		opt.BodyFields = []string{`metadata.tags.#(k=="session").v`, `meta\.id`, "user.0"}
		for _, o := range []ExtractOptions{opt, opt.Prepared()} {
			req := mustExtract(t, APIChatCompletions, `{"metadata":{"tags":[{"k":"a","v":"1"},{"k":"session","v":"s-9"}]},"messages":[]}`, o)
			assert.Equal(t, fp("s-9"), req.Conversation)
			req = mustExtract(t, APIChatCompletions, `{"meta.id":"dotted","messages":[]}`, o)
			assert.Equal(t, fp("dotted"), req.Conversation)
			req = mustExtract(t, APIChatCompletions, `{"user":["u-1"],"messages":[]}`, o)
			assert.Equal(t, fp("u-1"), req.Conversation)
		}
	})
	t.Run("names of any length, prepared or not", func(t *testing.T) {
		long := strings.Repeat("n", 70)
		opt := opt
		opt.BodyFields = []string{strings.Repeat("a", 63) + ".id", strings.Repeat("b", 64), long, "u"}
		for _, o := range []ExtractOptions{opt, opt.Prepared()} {
			req := mustExtract(t, APIChatCompletions, `{"`+long[:65]+`":"x","`+long+`":"seventy","messages":[]}`, o)
			assert.Equal(t, fp("seventy"), req.Conversation)
			req = mustExtract(t, APIChatCompletions, `{"`+strings.Repeat("a", 63)+`":{"id":"a63"},"u":"u","messages":[]}`, o)
			assert.Equal(t, fp("a63"), req.Conversation)
			req = mustExtract(t, APIChatCompletions, `{"v":"v","u":"u","messages":[]}`, o)
			assert.Equal(t, fp("u"), req.Conversation)
		}
	})
	t.Run("more fields than the fast path holds", func(t *testing.T) {
		opt := opt
		opt.BodyFields = []string{"f0", "f1", "f2", "f3", "f4", "f5", "f6", "f7", "f8.id", "f9"}
		req := mustExtract(t, APIChatCompletions, `{"f9":"nine","f8":{"id":"eight"},"messages":[]}`, opt)
		assert.Equal(t, fp("eight"), req.Conversation)
		req = mustExtract(t, APIChatCompletions, `{"f9":"nine","f7":"seven","messages":[]}`, opt)
		assert.Equal(t, fp("seven"), req.Conversation)
	})
}

func TestExtractUnparsable(t *testing.T) {
	opt := defaultExtractOptions()
	tests := []struct {
		name string
		api  API
		body string
	}{
		{"empty body", APIChatCompletions, ``},
		{"not JSON", APIChatCompletions, `hello`},
		{"truncated", APIChatCompletions, `{"messages":[{"role":"user","content":"hi"}`},
		{"trailing garbage", APIChatCompletions, `{"messages":[]} x`},
		{"top-level array", APIChatCompletions, `[{"messages":[]}]`},
		{"top-level string", APICompletions, `"prompt"`},
		{"unknown API", APIUnknown, `{"messages":[]}`},
		{"API out of range", API(42), `{"messages":[]}`},
		{"messages missing", APIChatCompletions, `{"prompt":"x"}`},
		{"messages not an array", APIChatCompletions, `{"messages":{"role":"user","content":"hi"}}`},
		{"message not an object", APIChatCompletions, `{"messages":["hi"]}`},
		{"content a number", APIChatCompletions, `{"messages":[{"role":"user","content":1}]}`},
		{"content an object", APIChatCompletions, `{"messages":[{"role":"user","content":{"text":"hi"}}]}`},
		{"prompt missing", APICompletions, `{"messages":[]}`},
		{"prompt null", APICompletions, `{"prompt":null}`},
		{"prompt an object", APICompletions, `{"prompt":{"text":"x"}}`},
		{"prompt array of objects", APICompletions, `{"prompt":[{"text":"x"}]}`},
		{"prompt mixed", APICompletions, `{"prompt":["a",1]}`},
		{"prompt mixed ids", APICompletions, `{"prompt":[1,"a"]}`},
		{"prompt bools", APICompletions, `{"prompt":[true]}`},
		{"negative token id", APICompletions, `{"prompt":[1,-1]}`},
		{"fractional token id", APICompletions, `{"prompt":[1.5]}`},
		{"exponent token id", APICompletions, `{"prompt":[1e3]}`},
		{"token id 2^32", APICompletions, `{"prompt":[4294967296]}`},
		{"token id huge", APICompletions, `{"prompt":[123456789012345678901234567890]}`},
		{"negative nested token id", APICompletions, `{"prompt":[[1,2],[3,-4]]}`},
		{"string in nested ids", APICompletions, `{"prompt":[[1,"2"]]}`},
		{"input missing", APIResponses, `{"instructions":"x"}`},
		{"input an object", APIResponses, `{"input":{"role":"user","content":"hi"}}`},
		{"input item a string", APIResponses, `{"input":["hi"]}`},
		{"instructions a number", APIResponses, `{"instructions":1,"input":"hi"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := Request{Prompt: []byte("stale"), Tokens: 9, BlockBytes: 9}
			err := Extract(tc.api, []byte(tc.body+``), opt, &req)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrUnparsable)
			assert.Contains(t, err.Error(), ErrUnparsable.Error())
			assert.Empty(t, req.Prompt)
			assert.Zero(t, req.Tokens)
			assert.Zero(t, req.BlockBytes)
			assert.False(t, req.HasConversation)
		})
	}
	t.Run("no conversation from an unparsable body", func(t *testing.T) {
		var req Request
		err := Extract(APIChatCompletions, []byte(`{"prompt_cache_key":"k","messages":"x"}`), opt, &req)
		require.ErrorIs(t, err, ErrUnparsable)
		assert.False(t, req.HasConversation)
	})
	t.Run("errors compare by errors.Is only", func(t *testing.T) {
		var req Request
		err := Extract(APIChatCompletions, []byte(`nope`), opt, &req)
		assert.True(t, errors.Is(err, ErrUnparsable))
	})
}

func TestExtractLargePrompt(t *testing.T) {
	opt := defaultExtractOptions()
	text := strings.Repeat("a", 300_000)

	req := mustExtract(t, APICompletions, `{"prompt":"`+text+`"}`, opt)
	assert.Equal(t, 75_000, req.Tokens)
	assert.Equal(t, text, string(req.Prompt))

	body := chatBody(300_000)
	req = mustExtract(t, APIChatCompletions, string(body), opt)
	assert.Greater(t, len(req.Prompt), 250_000)
	assert.Equal(t, len(req.Prompt)/4, req.Tokens, "all text: every prompt byte counts")
}

func TestExtractReusesPrompt(t *testing.T) {
	opt := defaultExtractOptions()
	req := Request{Prompt: make([]byte, 0, 1024)}
	base := unsafe.SliceData(req.Prompt)
	require.NoError(t, Extract(APIChatCompletions, []byte(`{"messages":[{"role":"user","content":"first request"}]}`), opt, &req))
	assert.Equal(t, "user:first request", string(req.Prompt))
	assert.Same(t, base, unsafe.SliceData(req.Prompt))
	require.NoError(t, Extract(APICompletions, []byte(`{"prompt":"second"}`), opt, &req))
	assert.Equal(t, "second", string(req.Prompt))
	assert.Same(t, base, unsafe.SliceData(req.Prompt))
}

func TestExtractAllocations(t *testing.T) {
	opt := defaultExtractOptions()
	// No escapes in the strings: only the model copy allocates.
	body := []byte(`{"model":"m","messages":[{"role":"system","content":"You are helpful."},` +
		`{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"data:,x"}}]}],` +
		`"prompt_cache_key":"k"}`)
	req := Request{Prompt: make([]byte, 0, 1024)}
	allocs := testing.AllocsPerRun(100, func() {
		req.HasConversation = false
		if err := Extract(APIChatCompletions, body, opt, &req); err != nil {
			t.Fatal(err)
		}
	})
	assert.LessOrEqual(t, allocs, 1.0)
	bad := []byte(`{"messages":{}}`)
	allocs = testing.AllocsPerRun(100, func() {
		if Extract(APIChatCompletions, bad, opt, &req) == nil {
			t.Fatal("want an error")
		}
	})
	assert.Zero(t, allocs, "failing allocates nothing")
}

// chatBody returns a chat completions body of about size bytes: a system prompt and
// alternating user and assistant turns of English and CJK text with escapes.
func chatBody(size int) []byte {
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	const para = "The quick brown fox jumps over the lazy dog. \"Quoted\" text,\ttabs and\nnew lines; 快速的棕色狐狸跳过了懒狗。\n"
	msgs := []message{{Role: "system", Content: strings.Repeat(para, 8)}}
	n := len(para) * 8
	for i := 0; n < size; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		text := strings.Repeat(para, 1+i%12)
		msgs = append(msgs, message{Role: role, Content: text})
		n += len(text) + 32
	}
	body, err := json.Marshal(struct {
		Model          string    `json:"model"`
		Stream         bool      `json:"stream"`
		Messages       []message `json:"messages"`
		MaxTokens      int       `json:"max_tokens"`
		PromptCacheKey string    `json:"prompt_cache_key"`
	}{"meta-llama/Llama-3.1-8B-Instruct", true, msgs, 256, "session-1234"})
	if err != nil {
		panic(err)
	}
	return body
}

func benchmarkExtractChat(b *testing.B, size int) {
	body := chatBody(size)
	opt := defaultExtractOptions()
	var req Request
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req.HasConversation = false
		if err := Extract(APIChatCompletions, body, opt, &req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkExtractChat4KiB(b *testing.B)   { benchmarkExtractChat(b, 4<<10) }
func BenchmarkExtractChat256KiB(b *testing.B) { benchmarkExtractChat(b, 256<<10) }

func TestHugeNestingCostsBoundedWork(t *testing.T) {
	// 1 MiB of '[': refused at depth jsonscan.MaxDepth, without walking the rest.
	body := `{"messages":` + strings.Repeat("[", 1<<20) + `}`
	var req Request
	err := Extract(APIChatCompletions, []byte(body), ExtractOptions{CharsPerToken: 4, BlockTokens: 16}, &req)
	assert.ErrorIs(t, err, ErrUnparsable)
}
