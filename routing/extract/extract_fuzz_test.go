package extract

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/routing/hashx"
	"github.com/kvroute/kvroute/routing/jsonscan"
	"github.com/tidwall/gjson"
)

// extractSeeds are bodies of every shape Extract knows, and some it does not.
var extractSeeds = []string{
	`{"model":"m","stream":true,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi \"there\"\n\u00e9\ud83d\ude00"}]}`,
	`{"messages":[{"content":"content first","role":"user"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"ok"}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"What"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"input_audio","input_audio":{"data":"UklG","format":"wav"}},{"text":5},"x"]}]}`,
	`{"prompt":"Say this is a test","prompt_cache_key":"k1"}`,
	`{"prompt":["abc","d\\ef",""]}`,
	`{"prompt":[1,2,3,4294967295]}`,
	`{"prompt":[[1,2],[3],[]]}`,
	`{"prompt":[]}`,
	`{"prompt":[-1]}`,
	`{"prompt":[1.5, 1e3]}`,
	`{"instructions":"Sys","input":"Hello","conversation":"conv_1"}`,
	`{"input":[{"role":"user","content":"hi"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"42"},{"content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"u"}],"role":"user"}],"instructions":"late"}`,
	`{"input":{"role":"user"}}`,
	`{"conversation_params":{"conversation_id":12},"conversation":{"id":"x"},"messages":[]}`,
	`{"conversation":{},"conversation":{"id":"0"},"messages":[]}`,
	`{"m\u0065ssages":[{"r\u006fle":"user","content":"escaped keys"}],"model":"a\"b"}`,
	`{"messages":[{"role":"user","content":"a","content":"b","role":"x"}],"messages":"dup"}`,
	`[]`, `"str"`, `null`, `{}`, `{"messages":{}}`, `not json`, `{"messages":[`, ``,
}

func FuzzExtract(f *testing.F) {
	for _, s := range extractSeeds {
		f.Add([]byte(s))
	}
	opts := []ExtractOptions{
		defaultExtractOptions(),
		{CharsPerToken: 3, BlockTokens: 1, BodyFields: []string{"conversation.id", "user", "metadata.session", `a\.b`}},
		{CharsPerToken: 4, BlockTokens: 16, BodyFields: []string{"user.0", `a\.b`}}, // no path on the fast path
		{},
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		orig := bytes.Clone(body)
		for api := APIUnknown; api <= APIResponses+1; api++ {
			for _, opt := range opts {
				var req Request
				err := Extract(api, body, opt, &req)
				if !bytes.Equal(body, orig) {
					t.Fatal("Extract changed the body")
				}
				// Prepared options (the filter's) read exactly the same.
				var prep Request
				errPrep := Extract(api, body, opt.Prepared(), &prep)
				if (err == nil) != (errPrep == nil) || !reflect.DeepEqual(req, prep) {
					t.Fatalf("api %d: prepared options read %+v (%v), plain %+v (%v)", api, prep, errPrep, req, err)
				}
				if req.Tokens < 0 || req.BlockBytes < 0 {
					t.Fatalf("api %d: tokens %d, block bytes %d", api, req.Tokens, req.BlockBytes)
				}
				if err != nil {
					if !errors.Is(err, ErrUnparsable) {
						t.Fatalf("api %d: error %v is not ErrUnparsable", api, err)
					}
					if len(req.Prompt) != 0 || req.Tokens != 0 || req.BlockBytes != 0 || req.HasConversation || req.Model != "" {
						t.Fatalf("api %d: error %v left %+v", api, err, req)
					}
				} else if req.BlockBytes < 1 {
					t.Fatalf("api %d: block bytes %d", api, req.BlockBytes)
				}

				// The same result from the straightforward gjson reading, for bodies
				// that are valid JSON (Extract checks only the shape of the rest:
				// jsonscan.ShapeOK) and not nested deeper than it accepts.
				if gjson.ValidBytes(body) && bytes.Count(body, []byte("["))+bytes.Count(body, []byte("{")) <= jsonscan.MaxDepth {
					var ref Request
					refErr := refExtract(api, body, opt, &ref)
					if (err == nil) != (refErr == nil) {
						t.Fatalf("api %d: error %v, reference error %v on %q", api, err, refErr, body)
					}
					if err == nil && (!bytes.Equal(req.Prompt, ref.Prompt) || req.Tokens != ref.Tokens ||
						req.BlockBytes != ref.BlockBytes || req.Model != ref.Model || req.Stream != ref.Stream ||
						req.HasConversation != ref.HasConversation || req.Conversation != ref.Conversation) {
						t.Fatalf("api %d: got %+v\nwant %+v", api, req, ref)
					}
				}

				// Reusing the Request gives the same result.
				again := Request{Prompt: append(req.Prompt[:0:0], "stale"...)}
				if err2 := Extract(api, body, opt, &again); (err2 == nil) != (err == nil) ||
					!bytes.Equal(again.Prompt, req.Prompt) || again.Tokens != req.Tokens {
					t.Fatalf("api %d: second run differs", api)
				}

				// Nothing in req aliases the body.
				if err == nil && req.Model != "" {
					model := strings.Clone(req.Model)
					scratch := bytes.Clone(body)
					_ = Extract(api, scratch, opt, &req)
					for i := range scratch {
						scratch[i] = 0
					}
					if req.Model != model {
						t.Fatalf("api %d: Model aliases the body", api)
					}
				}
			}
		}

		// The walk never indexes out of range, even on text that is not JSON
		// (jsonscan's own fuzz target covers the scanner under it).
		s := string(body)
		var w promptWriter
		for i := 0; i < len(s) && i < 64; i++ {
			w.buf, w.lines = w.buf[:0], i%2
			if s[i] == '{' {
				if i%2 == 0 {
					_ = w.inputItem(s, i)
				} else {
					_, _ = w.chatMessage(s, i)
				}
				_, _ = w.textPart(s, i)
			}
			if s[i] == '[' {
				_, _ = w.chat(s, i)
				_ = w.content(s, i)
			}
			_, _ = w.completion(s, i)
		}
		_ = (&promptWriter{}).responses(s, s)
	})
}

func TestExtractMatchesReference(t *testing.T) {
	bodies := append([]string{string(chatBody(20_000))}, extractSeeds...)
	for _, body := range bodies {
		for api := APIUnknown; api <= APIResponses; api++ {
			var got, want Request
			err := Extract(api, []byte(body), defaultExtractOptions(), &got)
			refErr := refExtract(api, []byte(body), defaultExtractOptions(), &want)
			if (err == nil) != (refErr == nil) {
				t.Fatalf("api %d, %s: error %v, reference error %v", api, body, err, refErr)
			}
			if err == nil && (string(got.Prompt) != string(want.Prompt) || got.Tokens != want.Tokens ||
				got.BlockBytes != want.BlockBytes || got.Model != want.Model || got.Stream != want.Stream ||
				got.Conversation != want.Conversation || got.HasConversation != want.HasConversation) {
				t.Fatalf("api %d, %s:\ngot  %+v\nwant %+v", api, body, got, want)
			}
		}
	}
}

// refExtract is Extract written the plain way, with gjson's ForEach and Get only
// (slow: it allocates for every escaped string and rescans for every body field).
// Extract must agree with it on every valid body.
func refExtract(api API, body []byte, opt ExtractOptions, req *Request) error {
	*req = Request{HasConversation: req.HasConversation, Conversation: req.Conversation}
	if api < APIChatCompletions || api > APIResponses || !gjson.ValidBytes(body) {
		return ErrUnparsable
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return ErrUnparsable
	}
	var model, stream, instructions, main gjson.Result
	mainKey := map[API]string{APIChatCompletions: "messages", APICompletions: "prompt", APIResponses: "input"}[api]
	root.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "model":
			refSetFirst(&model, v)
		case "stream":
			refSetFirst(&stream, v)
		case "instructions":
			refSetFirst(&instructions, v)
		case mainKey:
			refSetFirst(&main, v)
		}
		return true
	})
	cpt, bt := max(opt.CharsPerToken, 1), max(opt.BlockTokens, 1)
	text, ids := 0, -1 // ids >= 0: a token-id prompt of that many ids
	var ok bool
	switch api {
	case APIChatCompletions:
		req.Prompt, text, ok = refChat(main)
	case APICompletions:
		req.Prompt, text, ids, ok = refCompletion(main)
	case APIResponses:
		req.Prompt, text, ok = refResponses(instructions, main)
	}
	if !ok {
		*req = Request{HasConversation: req.HasConversation, Conversation: req.Conversation}
		return ErrUnparsable
	}
	req.BlockBytes = bt * cpt
	if ids >= 0 {
		req.BlockBytes = bt * tokenIDBytes
	}
	req.Tokens = text/cpt + max(ids, 0)
	if model.Type == gjson.String {
		req.Model = model.Str
	}
	req.Stream = stream.Type == gjson.True
	if !req.HasConversation {
		for _, path := range opt.BodyFields {
			v := gjson.GetBytes(body, path)
			if v.IsObject() {
				v = v.Get("id")
			}
			if (v.Type == gjson.String && v.Str != "") || v.Type == gjson.Number {
				id := v.Str
				if v.Type == gjson.Number {
					id = v.Raw
				}
				req.Conversation, req.HasConversation = hashx.FingerprintString(id), true
				break
			}
		}
	}
	return nil
}

func refSetFirst(dst *gjson.Result, v gjson.Result) {
	if !dst.Exists() {
		*dst = v
	}
}

// refLine appends one line: "\n" unless first, role, ":", content text; it returns
// the text bytes appended.
func refLine(dst []byte, first bool, role string, content gjson.Result) ([]byte, int) {
	start, raw := len(dst), 0
	if !first {
		dst = append(dst, '\n')
	}
	dst = append(dst, role+":"...)
	if content.Type == gjson.String {
		return append(dst, content.Str...), len(dst) - start + len(content.Str)
	}
	for _, part := range content.Array() {
		if text := part.Get("text"); part.IsObject() && text.Type == gjson.String {
			dst = append(dst, text.Str...)
		} else {
			dst = append(dst, part.Raw...)
			raw += len(part.Raw)
		}
	}
	return dst, len(dst) - start - raw
}

func refChat(messages gjson.Result) (dst []byte, text int, ok bool) {
	if !messages.IsArray() {
		return nil, 0, false
	}
	for i, m := range messages.Array() {
		if !m.IsObject() {
			return nil, 0, false
		}
		var role, content, toolCalls gjson.Result
		m.ForEach(func(k, v gjson.Result) bool {
			switch k.Str {
			case "role":
				refSetFirst(&role, v)
			case "content":
				refSetFirst(&content, v)
			case "tool_calls":
				refSetFirst(&toolCalls, v)
			}
			return true
		})
		if content.Type != gjson.Null && content.Type != gjson.String && !content.IsArray() {
			return nil, 0, false
		}
		var n int
		dst, n = refLine(dst, i == 0, role.Str, content)
		text += n
		if toolCalls.Type == gjson.JSON {
			dst = append(dst, toolCalls.Raw...)
		}
	}
	return dst, text, true
}

// refCompletion returns ids >= 0 for token-id prompts, -1 for text.
func refCompletion(prompt gjson.Result) (dst []byte, text, ids int, ok bool) {
	parse := func(v gjson.Result) (uint32, bool) {
		if v.Type != gjson.Number || strings.Trim(v.Raw, "0123456789") != "" || v.Raw == "" || v.Uint() > 1<<32-1 || len(v.Raw) > 10 {
			return 0, false
		}
		return uint32(v.Uint()), true
	}
	if prompt.Type == gjson.String {
		return []byte(prompt.Str), len(prompt.Str), -1, true
	}
	if !prompt.IsArray() {
		return nil, 0, 0, false
	}
	elems := prompt.Array()
	if len(elems) == 0 {
		return nil, 0, -1, true
	}
	switch {
	case elems[0].Type == gjson.String:
		for i, e := range elems {
			if e.Type != gjson.String {
				return nil, 0, 0, false
			}
			if i == 0 {
				dst = []byte(e.Str)
			}
			text += len(e.Str)
		}
		return dst, text, -1, true
	case elems[0].Type == gjson.Number:
		for _, e := range elems {
			id, ok := parse(e)
			if !ok {
				return nil, 0, 0, false
			}
			dst = appendTokenID(dst, id)
		}
		return dst, 0, len(elems), true
	case elems[0].IsArray():
		for i, e := range elems {
			if !e.IsArray() {
				return nil, 0, 0, false
			}
			for _, v := range e.Array() {
				id, ok := parse(v)
				if !ok {
					return nil, 0, 0, false
				}
				if i == 0 {
					dst = appendTokenID(dst, id)
				}
				ids++
			}
		}
		return dst, 0, ids, true
	}
	return nil, 0, 0, false
}

func refResponses(instructions, input gjson.Result) (dst []byte, text int, ok bool) {
	first := true
	switch instructions.Type {
	case gjson.Null:
	case gjson.String:
		dst, text = refLine(dst, true, "system", instructions)
		first = false
	default:
		return nil, 0, false
	}
	if input.Type == gjson.String {
		var n int
		dst, n = refLine(dst, first, "user", input)
		return dst, text + n, true
	}
	if !input.IsArray() {
		return nil, 0, false
	}
	for _, item := range input.Array() {
		if !item.IsObject() {
			return nil, 0, false
		}
		var role, content gjson.Result
		item.ForEach(func(k, v gjson.Result) bool {
			switch k.Str {
			case "role":
				refSetFirst(&role, v)
			case "content":
				refSetFirst(&content, v)
			}
			return true
		})
		if content.Type == gjson.String || content.IsArray() {
			var n int
			dst, n = refLine(dst, first, role.Str, content)
			text += n
		} else {
			if !first {
				dst = append(dst, '\n')
				text++
			}
			dst = append(dst, item.Raw...)
		}
		first = false
	}
	return dst, text, true
}
