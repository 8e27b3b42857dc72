package routing

import (
	"errors"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

	"github.com/tidwall/gjson"
)

// ExtractOptions carries what extraction needs from the config.
type ExtractOptions struct {
	CharsPerToken int      // chars_per_token, >= 1 (smaller values are treated as 1)
	BlockTokens   int      // prefix.block_tokens, >= 1 (smaller values are treated as 1)
	BodyFields    []string // conversation.body_fields (gjson paths); nil when conversation affinity is disabled

	heads []string // the first step of each body field's path, once Prepared
}

// Prepared returns the options with the body-field paths worked out once, for a
// caller that extracts every request with the same options.
func (opt ExtractOptions) Prepared() ExtractOptions {
	opt.heads = make([]string, len(opt.BodyFields))
	for i, f := range opt.BodyFields {
		opt.heads[i] = simpleHead(f)
	}
	return opt
}

// ErrUnparsable is returned for a body that is not JSON or not of a known shape
// (docs/behaviour.md, Reading the request). Every error Extract returns satisfies
// errors.Is(err, ErrUnparsable).
var ErrUnparsable = errors.New("kvroute: unparsable request body")

// unparsable is an error naming what was wrong with a body; it unwraps to
// ErrUnparsable. The errors are constants, so failing allocates nothing.
type unparsable string

func (e unparsable) Error() string { return ErrUnparsable.Error() + ": " + string(e) }
func (e unparsable) Unwrap() error { return ErrUnparsable }

const (
	errUnknownAPI   = unparsable("unknown API")
	errNotJSON      = unparsable("not JSON")
	errNotObject    = unparsable("top level is not an object")
	errMessages     = unparsable("messages is not an array of objects")
	errContent      = unparsable("message content is neither a string, an array nor null")
	errPrompt       = unparsable("prompt is not a string, an array of strings, an array of token ids or an array of such arrays")
	errTokenID      = unparsable("token id is not an integer in [0, 2^32)")
	errInstructions = unparsable("instructions is not a string")
	errInput        = unparsable("input is not a string or an array of objects")
)

const (
	// The first fastBodyFields body fields are found during the one pass over the
	// top-level object; any later ones are looked up with gjson.Get.
	fastBodyFields     = 8
	bodyFieldPathChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-."

	tokenIDBytes = 4 // a token id in Prompt: uint32, little-endian
	maxTokenID   = 1<<32 - 1

	instructionsRole = "system" // role of the responses "instructions" line
	stringInputRole  = "user"   // role of a responses string "input"
)

// Extract parses body and fills req for the given API. It never panics.
//
// The body's shape is checked once (jsonShapeOK: an object, balanced, strings
// closed, nesting bounded — several times faster than a full validation) and then
// read in one forward walk: the members Extract needs are decoded straight into req.Prompt as they are
// met, and everything else is only skipped over. It allocates only for a copy of
// req.Model and to grow req.Prompt: the canonical prompt is appended to
// req.Prompt[:0], so a caller that reuses one Request reuses one backing array.
// Nothing in req refers to body afterwards.
//
// It sets Model (a JSON string, else empty), Stream (JSON true only), Prompt,
// BlockBytes and Tokens. Conversation and HasConversation are set from
// opt.BodyFields only when req.HasConversation is false on entry (the headers phase
// may have set them): the first path whose value is a non-empty string or a number
// wins (a number by its raw JSON text), and an object yields its "id" member the same
// way. Only the fingerprint of the id is kept. Identity is not touched. Of duplicate
// members the first counts, as with gjson.Get.
//
// Text is measured in bytes of UTF-8: the token estimate is bytes / CharsPerToken
// (integer division). With the default of 4 this approximates tokens for English
// (about 4 characters a token) and for CJK (3 bytes a character, about 1.3 characters
// a token) alike. For text prompts BlockBytes is BlockTokens*CharsPerToken.
//
// Chat completions: each message is the line role + ":" + text, lines joined by
// "\n". Text is the string content, or the concatenation of the "text" of the parts
// whose first "text" member is a string ("text", "input_text", ...); a null or
// missing content is empty text. Every other part (image_url, input_audio, file,
// ...) is appended in place as its raw JSON: hashed, so different images make
// different prompts, but not counted toward the estimate. A message's "tool_calls"
// is appended after its text as raw JSON, likewise hashed and not counted. Roles,
// ":" and "\n" are text and count.
//
// Completions: a string prompt is the text. A batch (array of strings) is estimated
// over all its strings and hashed over the first. An array of token ids counts one
// token an id and is hashed over the ids, each written as 4 little-endian bytes, with
// BlockBytes = BlockTokens*4; an array of such arrays is estimated over all of them
// and hashed over the first. An empty array is an empty prompt of no tokens. Token ids
// must be written as integers in [0, 2^32).
//
// Responses: "instructions" (optional) is the line "system:" + text; then "input": a
// string is the line "user:" + text (so it reads as a one-message chat), and an array
// holds items. An item with a string or array "content" is the line role + ":" + text
// as for chat; any other item (function_call, function_call_output, reasoning, ...)
// is its raw JSON as a line of its own, hashed and not counted. Lines are joined by
// "\n", which counts.
//
// On error (always one that errors.Is ErrUnparsable) Model, Stream, Prompt, Tokens
// and BlockBytes are zero and no conversation is taken from the body: the caller
// fails open.
func Extract(api API, body []byte, opt ExtractOptions, req *Request) error {
	req.Model = ""
	req.Stream = false
	req.Prompt = req.Prompt[:0]
	req.BlockBytes = 0
	req.Tokens = 0

	var mainKey string // the member that holds the prompt
	switch api {
	case APIChatCompletions:
		mainKey = "messages"
	case APICompletions:
		mainKey = "prompt"
	case APIResponses:
		mainKey = "input"
	default:
		return errUnknownAPI
	}
	// A view of the body as a string, not a copy. Nothing taken from it outlives this
	// call except through a copy (Model is cloned; text is appended to Prompt).
	json := unsafe.String(unsafe.SliceData(body), len(body))
	root := skipSpace(json, 0)
	if root >= len(json) || json[root] != '{' {
		return errNotJSON
	}
	// The walk comes first and remembers the long strings it decoded, so the shape
	// check after it jumps over them instead of scanning the prompt a second time.
	var spans stringSpans

	// One walk over the top-level members. Chat messages and completion prompts are
	// decoded into Prompt where they are met; other members are kept as raw JSON
	// ("" means absent), including the first step of simple body-field paths, so
	// that looking for a conversation id never rescans the body. Responses input is
	// decoded after the walk, as "instructions" may follow it.
	wantConversation := !req.HasConversation && len(opt.BodyFields) > 0
	var fieldHead, fieldVal [fastBodyFields]string
	if wantConversation {
		for f := 0; f < len(opt.BodyFields) && f < fastBodyFields; f++ {
			if len(opt.heads) == len(opt.BodyFields) {
				fieldHead[f] = opt.heads[f]
			} else {
				fieldHead[f] = simpleHead(opt.BodyFields[f])
			}
		}
	}
	cpt := max(opt.CharsPerToken, 1)
	blockTokens := max(opt.BlockTokens, 1)
	var model, stream, instructions, input string
	var textBytes int
	mainSeen, isIDs := false, false
	for i := root + 1; ; {
		k, v, _ := memberAt(json, i)
		if v < 0 {
			break
		}
		var e int
		var err error
		switch {
		case k == mainKey && !mainSeen && api == APIChatCompletions:
			req.Prompt, textBytes, e, err = appendChat(req.Prompt, json, v, &spans)
			mainSeen = true
		case k == mainKey && !mainSeen && api == APICompletions:
			req.Prompt, textBytes, isIDs, e, err = appendCompletion(req.Prompt, json, v, &spans)
			mainSeen = true
		default:
			e = valueEnd(json, v)
		}
		if err != nil {
			if !shapeOK(json, &spans) {
				err = errNotJSON
			}
			return fail(req, err)
		}
		val := json[v:e]
		switch k {
		case "model":
			setFirst(&model, val)
		case "stream":
			setFirst(&stream, val)
		case "instructions":
			setFirst(&instructions, val)
		case "input":
			setFirst(&input, val)
		}
		if wantConversation {
			for f := range fieldHead {
				if fieldHead[f] != k || k == "" {
					continue
				}
				if fieldVal[f] != "" {
					// A duplicate member: gjson.Get looks into each in turn.
					fieldHead[f] = ""
					continue
				}
				fieldVal[f] = val
			}
		}
		i = e
	}
	if !shapeOK(json, &spans) {
		return fail(req, errNotJSON)
	}
	switch api {
	case APIChatCompletions:
		if !mainSeen {
			return fail(req, errMessages)
		}
		req.BlockBytes = blockTokens * cpt
		req.Tokens = textBytes / cpt
	case APICompletions:
		if !mainSeen {
			return fail(req, errPrompt)
		}
		if isIDs { // textBytes counts token ids
			req.BlockBytes = blockTokens * tokenIDBytes
			req.Tokens = textBytes
		} else {
			req.BlockBytes = blockTokens * cpt
			req.Tokens = textBytes / cpt
		}
	case APIResponses:
		var err error
		if req.Prompt, textBytes, err = appendResponses(req.Prompt, instructions, input); err != nil {
			return fail(req, err)
		}
		req.BlockBytes = blockTokens * cpt
		req.Tokens = textBytes / cpt
	}

	if isString(model) {
		if m := model[1 : len(model)-1]; strings.IndexByte(m, '\\') < 0 {
			req.Model = strings.Clone(m)
		} else {
			req.Model = gjson.Parse(model).Str // a fresh, unescaped string
		}
	}
	req.Stream = stream == "true"

	if wantConversation {
		for f, path := range opt.BodyFields {
			var v gjson.Result
			switch {
			case f >= fastBodyFields || fieldHead[f] == "":
				v = gjson.Get(json, path)
			case fieldVal[f] == "":
				continue
			case len(path) == len(fieldHead[f]):
				v = gjson.Parse(fieldVal[f])
			default:
				v = gjson.Get(fieldVal[f], path[len(fieldHead[f])+1:])
			}
			if id, ok := conversationID(v); ok {
				req.Conversation = FingerprintString(id)
				req.HasConversation = true
				break
			}
		}
	}
	return nil
}

// fail clears what Extract had filled and returns err.
func fail(req *Request, err error) error {
	req.Model = ""
	req.Stream = false
	req.Prompt = req.Prompt[:0]
	req.BlockBytes = 0
	req.Tokens = 0
	return err
}

// isBodyFieldPathChar is bodyFieldPathChars as a table: simpleHead runs for every
// body field of every request, and a call a character was a fifth of Extract in wasm.
var isBodyFieldPathChar = func() (t [256]bool) {
	for i := 0; i < len(bodyFieldPathChars); i++ {
		t[bodyFieldPathChars[i]] = true
	}
	return t
}()

// simpleHead returns the first step of a gjson path made only of names joined by
// single dots ("conversation_params.conversation_id" gives "conversation_params"),
// or "" when the path uses any other gjson syntax and needs gjson.Get.
func simpleHead(path string) string {
	if path == "" || path[0] == '.' || path[len(path)-1] == '.' {
		return ""
	}
	for i := 0; i < len(path); i++ {
		if !isBodyFieldPathChar[path[i]] || (path[i] == '.' && path[i-1] == '.') {
			return ""
		}
	}
	if i := strings.IndexByte(path, '.'); i >= 0 {
		return path[:i]
	}
	return path
}

// conversationID returns the id a body field holds: a non-empty string, a number (by
// its raw JSON text), or either of those as the "id" member of an object.
func conversationID(v gjson.Result) (string, bool) {
	if v.IsObject() {
		v = v.Get("id")
	}
	switch v.Type {
	case gjson.String:
		return v.Str, v.Str != ""
	case gjson.Number:
		return v.Raw, true
	}
	return "", false
}

// The functions below read the JSON text s from the value that starts at s[v] and
// return where it ends. They check no more syntax than they need (jsonShapeOK has
// check the shape after them), but they never index out of range nor loop on any input: a value that is not closed
// ends at len(s). They return the number of text bytes they appended (or of token
// ids), for the estimate.

// appendChat appends the lines of the chat completions "messages" array at s[v].
func appendChat(dst []byte, s string, v int, spans *stringSpans) (_ []byte, textBytes, end int, _ error) {
	if s[v] != '[' {
		return dst, 0, 0, errMessages
	}
	first := true
	for i := v + 1; ; {
		m, end := elementAt(s, i)
		if m < 0 {
			return dst, textBytes, end, nil
		}
		if s[m] != '{' {
			return dst, 0, 0, errMessages
		}
		var n int
		var err error
		if dst, n, i, err = appendMessage(dst, first, s, m, false, spans); err != nil {
			return dst, 0, 0, err
		}
		textBytes += n
		first = false
	}
}

// appendMessage appends the line of the chat message, or of the responses input
// item when item is true, whose object starts at s[m].
func appendMessage(dst []byte, first bool, s string, m int, item bool, spans *stringSpans) (_ []byte, textBytes, end int, _ error) {
	start := len(dst)
	rawBytes := 0                         // appended bytes that are not text
	var role, content, toolCalls string   // raw JSON; "" means absent
	contentSeen, lineDone := false, false // lineDone: content decoded where met
	for i := m + 1; ; {
		k, v, close := memberAt(s, i)
		if v < 0 {
			end = close
			break
		}
		switch {
		case k == "role" && role == "":
			i = valueEnd(s, v)
			role = s[v:i]
		case k == "content" && !contentSeen && role != "" && (s[v] == '"' || s[v] == '['):
			// The usual order, role then content: decode the content in place.
			contentSeen, lineDone = true, true
			dst = appendRole(dst, first, role)
			var n int
			dst, n, i = appendContent(dst, s, v, spans)
			rawBytes += n
		case k == "content" && !contentSeen:
			contentSeen = true
			i = valueEnd(s, v)
			content = s[v:i]
		case k == "tool_calls" && !item && toolCalls == "":
			i = valueEnd(s, v)
			toolCalls = s[v:i]
		default:
			i = valueEnd(s, v)
		}
	}
	switch {
	case lineDone:
	case isString(content) || isArray(content):
		dst = appendRole(dst, first, role)
		var n int
		dst, n, _ = appendContent(dst, content, 0, nil) // content is a copy
		rawBytes += n
	case item: // no text content: the item is its raw JSON
		if !first {
			dst = append(dst, '\n')
		}
		dst = append(dst, s[m:end]...)
		rawBytes += end - m
	case content == "" || content == "null":
		dst = appendRole(dst, first, role)
	default:
		return dst, 0, 0, errContent
	}
	if isArray(toolCalls) || isObject(toolCalls) {
		dst = append(dst, toolCalls...)
		rawBytes += len(toolCalls)
	}
	return dst, len(dst) - start - rawBytes, end, nil
}

// appendRole appends "\n" (unless first), the role (raw JSON; not a string: empty)
// and ":".
func appendRole(dst []byte, first bool, role string) []byte {
	if !first {
		dst = append(dst, '\n')
	}
	if isString(role) {
		dst, _ = appendString(dst, role, 0)
	}
	return append(dst, ':')
}

// appendContent appends the message content at s[v], a string or an array of parts,
// and returns the number of bytes appended that are not text: a part whose first
// "text" member is a string is text, any other part is appended as its raw JSON.
func appendContent(dst []byte, s string, v int, spans *stringSpans) (_ []byte, rawBytes, end int) {
	if s[v] == '"' {
		dst, end = appendString(dst, s, v)
		spans.add(v, end)
		return dst, 0, end
	}
	for i := v + 1; ; {
		p, end := elementAt(s, i)
		if p < 0 {
			return dst, rawBytes, end
		}
		isText := false
		if s[p] == '{' {
			dst, isText, i = appendTextPart(dst, s, p)
		} else {
			i = valueEnd(s, p)
		}
		if !isText {
			dst = append(dst, s[p:i]...)
			rawBytes += i - p
		}
	}
}

// appendTextPart appends the text of the content part whose object starts at s[p]
// if its first "text" member is a string, and says whether it did.
func appendTextPart(dst []byte, s string, p int) (_ []byte, isText bool, end int) {
	textSeen := false
	for i := p + 1; ; {
		k, v, close := memberAt(s, i)
		if v < 0 {
			return dst, isText, close
		}
		if k == "text" && !textSeen {
			textSeen = true
			if s[v] == '"' {
				dst, i = appendString(dst, s, v)
				isText = true
				continue
			}
		}
		i = valueEnd(s, v)
	}
}

// appendCompletion appends the canonical prompt of the completions "prompt" at s[v].
// When isIDs it is made of token ids and n counts them; else n counts text bytes.
func appendCompletion(dst []byte, s string, v int, spans *stringSpans) (_ []byte, n int, isIDs bool, end int, _ error) {
	switch s[v] {
	case '"':
		mark := len(dst)
		dst, end = appendString(dst, s, v)
		spans.add(v, end)
		return dst, len(dst) - mark, false, end, nil
	case '[':
	default:
		return dst, 0, false, 0, errPrompt
	}
	var kind byte // of the elements: '"' strings, '0' token ids, '[' arrays of token ids
	for i := v + 1; ; {
		p, end := elementAt(s, i)
		if p < 0 {
			return dst, n, kind == '0' || kind == '[', end, nil
		}
		k := s[p]
		if k == '-' || k >= '0' && k <= '9' {
			k = '0'
		}
		first := kind == 0
		if first {
			kind = k
		}
		switch {
		case k != kind:
			return dst, 0, false, 0, errPrompt
		case k == '"':
			mark := len(dst)
			dst, i = appendString(dst, s, p)
			n += len(dst) - mark
			if !first {
				dst = dst[:mark] // only the first string is hashed
			}
		case k == '0':
			i = valueEnd(s, p)
			id, ok := parseTokenID(s[p:i])
			if !ok {
				return dst, 0, false, 0, errTokenID
			}
			dst = appendTokenID(dst, id)
			n++
		case k == '[':
			for j := p + 1; ; {
				q, qend := elementAt(s, j)
				if q < 0 {
					i = qend
					break
				}
				j = valueEnd(s, q)
				id, ok := parseTokenID(s[q:j])
				if !ok {
					return dst, 0, false, 0, errTokenID
				}
				if first {
					dst = appendTokenID(dst, id)
				}
				n++
			}
		default:
			return dst, 0, false, 0, errPrompt
		}
	}
}

// parseTokenID parses the raw JSON of a token id: an integer in [0, 2^32).
func parseTokenID(raw string) (uint32, bool) {
	if raw == "" || len(raw) > len("4294967295") {
		return 0, false
	}
	var v uint64
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	return uint32(v), v <= maxTokenID
}

// appendTokenID appends a token id as 4 little-endian bytes.
func appendTokenID(dst []byte, id uint32) []byte {
	return append(dst, byte(id), byte(id>>8), byte(id>>16), byte(id>>24))
}

// appendResponses appends the canonical prompt of a responses request from its raw
// "instructions" and "input" members.
func appendResponses(dst []byte, instructions, input string) (_ []byte, textBytes int, _ error) {
	start := len(dst)
	first := true
	switch {
	case instructions == "" || instructions == "null":
	case isString(instructions):
		dst = appendRole(dst, first, `"`+instructionsRole+`"`)
		dst, _ = appendString(dst, instructions, 0)
		first = false
	default:
		return dst, 0, errInstructions
	}
	if isString(input) {
		dst = appendRole(dst, first, `"`+stringInputRole+`"`)
		dst, _ = appendString(dst, input, 0)
		return dst, len(dst) - start, nil
	}
	if !isArray(input) {
		return dst, 0, errInput
	}
	textBytes = len(dst) - start
	for i := 1; ; {
		p, _ := elementAt(input, i)
		if p < 0 {
			return dst, textBytes, nil
		}
		if input[p] != '{' {
			return dst, 0, errInput
		}
		var n int
		dst, n, i, _ = appendMessage(dst, first, input, p, true, nil) // input is a copy
		textBytes += n
		first = false
	}
}

func setFirst(dst *string, v string) {
	if *dst == "" {
		*dst = v
	}
}

func isString(raw string) bool { return raw != "" && raw[0] == '"' }
func isArray(raw string) bool  { return raw != "" && raw[0] == '[' }
func isObject(raw string) bool { return raw != "" && raw[0] == '{' }

func skipSpace(s string, i int) int {
	for i < len(s) && s[i] <= ' ' {
		i++
	}
	return i
}

// memberAt reads the next member of an object, at or after s[i] (just past "{" or
// past the previous member's value). It returns the unescaped key and where the
// value starts; after the last member v is -1 and end is just past "}".
func memberAt(s string, i int) (key string, v, end int) {
	i = skipSpace(s, i)
	if i < len(s) && s[i] == ',' {
		i = skipSpace(s, i+1)
	}
	if i >= len(s) || s[i] != '"' {
		return "", -1, min(i+1, len(s))
	}
	e := stringEnd(s, i)
	key = s[i+1 : max(e-1, i+1)]
	if strings.IndexByte(key, '\\') >= 0 {
		key = gjson.Parse(s[i:e]).Str // rare: an escaped key
	}
	i = skipSpace(s, e)
	if i < len(s) && s[i] == ':' {
		i = skipSpace(s, i+1)
	}
	if i >= len(s) {
		return "", -1, len(s)
	}
	return key, i, 0
}

// elementAt reads the next element of an array, at or after s[i] (just past "[" or
// past the previous element). It returns where the element starts; after the last
// element v is -1 and end is just past "]".
func elementAt(s string, i int) (v, end int) {
	i = skipSpace(s, i)
	if i < len(s) && s[i] == ',' {
		i = skipSpace(s, i+1)
	}
	if i >= len(s) || s[i] == ']' {
		return -1, min(i+1, len(s))
	}
	return i, 0
}

// valueEnd returns where the value that starts at s[i] ends: always past i (when
// i < len(s)) and at most len(s).
func valueEnd(s string, i int) int {
	if i >= len(s) {
		return len(s)
	}
	switch s[i] {
	case '"':
		return stringEnd(s, i)
	case '{', '[':
		depth := 0
		for ; i < len(s); i++ {
			switch s[i] {
			case '"':
				i = stringEnd(s, i) - 1
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

// stringEnd returns the index just past the closing quote of the string that starts
// at s[i] == '"', or len(s) if it is not closed. It looks for quotes only (one byte
// is the fastest search in wasm) and counts the backslashes before each.
func stringEnd(s string, i int) int {
	for j := i + 1; j < len(s); j++ {
		q := strings.IndexByte(s[j:], '"')
		if q < 0 {
			break
		}
		j += q
		bs := 0 // backslashes just before the quote
		for k := j - 1; k > i && s[k] == '\\'; k-- {
			bs++
		}
		if bs%2 == 0 {
			return j + 1
		}
	}
	return len(s)
}

// appendString appends the unescaped text of the JSON string that starts at
// s[i] == '"', decoding escapes as gjson does, and returns the index just past it.
// It finds the end and decodes in one pass.
func appendString(dst []byte, s string, i int) (_ []byte, end int) {
	i++
	for i < len(s) {
		j := quoteOrEscape(s, i)
		dst = append(dst, s[i:j]...)
		if j >= len(s) {
			break
		}
		if s[j] == '"' {
			return dst, j + 1
		}
		i = j + 2 // past the backslash and the escape letter
		if i > len(s) {
			break
		}
		switch c := s[i-1]; c {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r, ok := hex4(s[i:])
			if !ok {
				break
			}
			i += 4
			if utf16.IsSurrogate(r) && i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
				// Only a well-formed second escape is taken: "\u0" must not swallow
				// a closing quote (the string would end past where it ends).
				if r2, ok := hex4(s[i+2:]); ok {
					r = utf16.DecodeRune(r, r2)
					i += 6
				}
			}
			dst = utf8.AppendRune(dst, r)
		default: // '"', '\\', '/'
			dst = append(dst, c)
		}
	}
	return dst, len(s)
}

// hex4 decodes the 4 hex digits of a \u escape.
func hex4(s string) (rune, bool) {
	if len(s) < 4 {
		return 0, false
	}
	var r rune
	for i := 0; i < 4; i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}
