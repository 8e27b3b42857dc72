// Package extract reads what the decision needs from an inference request body: the
// canonical prompt, its token estimate, the model, and a conversation id.
package extract

import (
	"errors"
	"strings"
	"unsafe"

	"github.com/kvroute/kvroute/routing/hashx"
	"github.com/kvroute/kvroute/routing/jsonscan"
	"github.com/tidwall/gjson"
)

// ExtractOptions carries what extraction needs from the config.
type ExtractOptions struct {
	CharsPerToken int      // chars_per_token, >= 1 (smaller values are treated as 1)
	BlockTokens   int      // prefix.block_tokens, >= 1 (smaller values are treated as 1)
	BodyFields    []string // conversation.body_fields (gjson paths); nil when conversation affinity is disabled

	heads    []string // bodyFields.head of the fast paths, once Prepared
	headLens uint64   // bodyFields.lens of heads, once Prepared
	headGets bool     // bodyFields.gets of heads, once Prepared
	prepared bool     // Prepared filled the three above
}

// Prepared returns the options with the body-field paths worked out once, for a
// caller that extracts every request with the same options.
func (opt ExtractOptions) Prepared() ExtractOptions {
	var f bodyFields
	f.prepare(opt)
	opt.heads = append([]string(nil), f.head[:f.n]...)
	opt.headLens, opt.headGets, opt.prepared = f.lens, f.gets, true
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
// The body is read in one forward walk: the members Extract needs are decoded straight
// into req.Prompt as they are met, and everything else is only skipped over. The walk
// checks the body's shape as it goes (as jsonscan.ShapeOK does: an object, balanced,
// strings closed, nesting bounded) rather than fully validating it. It allocates only
// for a copy of req.Model and to grow req.Prompt: the canonical prompt is appended to
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
	clearExtracted(req)
	if api != APIChatCompletions && api != APICompletions && api != APIResponses {
		return errUnknownAPI
	}
	// A view of the body as a string, not a copy. Nothing taken from it outlives this
	// call except through a copy (Model is cloned; text is appended to Prompt).
	json := unsafe.String(unsafe.SliceData(body), len(body))
	root := jsonscan.SkipSpace(json, 0)
	if root >= len(json) || json[root] != '{' {
		return errNotJSON
	}
	var fields *bodyFields
	var fieldsBuf bodyFields
	if !req.HasConversation && len(opt.BodyFields) > 0 {
		fields = &fieldsBuf
		fields.prepare(opt)
	}
	w := promptWriter{buf: req.Prompt}
	var top topLevel
	err := readPrompt(api, json, root, &w, fields, &top)
	req.Prompt = w.buf
	if err != nil {
		return fail(req, err)
	}
	req.BlockBytes, req.Tokens = w.estimate(max(opt.CharsPerToken, 1), max(opt.BlockTokens, 1))
	req.Model = modelName(top.model)
	req.Stream = top.stream == "true"
	if fields != nil && (fields.kept > 0 || fields.gets) { // else no path can hold an id
		if id, ok := fields.conversationID(json, opt.BodyFields); ok {
			req.Conversation = hashx.FingerprintString(id)
			req.HasConversation = true
		}
	}
	return nil
}

// readPrompt walks the body's top-level object at json[root] (readTopLevel), checks its
// shape, and completes the prompt for api.
func readPrompt(api API, json string, root int, w *promptWriter, fields *bodyFields, top *topLevel) error {
	err := readTopLevel(api, json, root, w, fields, top)
	// The walk checks the shape of what it reads; a body it cannot vouch for (one it
	// stopped reading early, or found odd) gets the whole-body check.
	if !top.shaped && !jsonscan.ShapeOK(json) {
		return errNotJSON
	}
	if err != nil {
		return err
	}
	return w.finish(api, top)
}

// finish completes the prompt for api after the walk over the top-level object.
func (w *promptWriter) finish(api API, top *topLevel) error {
	switch api {
	case APIChatCompletions:
		if !top.promptSeen {
			return errMessages
		}
	case APICompletions:
		if !top.promptSeen {
			return errPrompt
		}
	case APIResponses:
		return w.responses(top.instructions, top.input)
	}
	return nil
}

// topLevel is what the walk over the body's top-level object found besides the prompt.
type topLevel struct {
	model, stream, instructions, input string // raw JSON of the first such member; "" when absent
	promptSeen                         bool   // the chat "messages" or completions "prompt" was appended
	shaped                             bool   // the walk vouches for the body's shape (jsonscan.ShapeOK)
}

// readTopLevel walks the members of the object at json[root] once, into top. The chat
// messages or completions prompt is appended to w where it is met; the members read
// later are kept as raw JSON, and so are the members body fields start with (fields,
// when not nil), so that looking for a conversation id never rescans the body.
// Responses input is appended after the walk, as "instructions" may follow it. The
// walk is shaped when it reads to the object's end without meeting anything odd, and
// only white space follows the object.
func readTopLevel(api API, json string, root int, w *promptWriter, fields *bodyFields, top *topLevel) error {
	for i := root + 1; ; {
		k, v, end := jsonscan.MemberAt(json, i, &w.odd)
		if v < 0 {
			top.shaped = !w.odd && jsonscan.SkipSpace(json, end) == len(json)
			return nil
		}
		var e int
		var err error
		switch {
		case top.promptSeen:
			e = jsonscan.ValueEnd(json, v, &w.odd)
		case api == APIChatCompletions && k == "messages":
			e, err = w.chat(json, v)
			top.promptSeen = true
		case api == APICompletions && k == "prompt":
			e, err = w.completion(json, v)
			top.promptSeen = true
		default:
			e = jsonscan.ValueEnd(json, v, &w.odd)
		}
		if err != nil {
			return err
		}
		top.keep(k, json[v:e])
		if fields != nil {
			fields.keep(k, json[v:e])
		}
		i = e
	}
}

// keep records raw as the value of member key when Extract reads it after the walk.
// Of duplicate members the first counts.
func (top *topLevel) keep(key, raw string) {
	switch key {
	case "model":
		setFirst(&top.model, raw)
	case "stream":
		setFirst(&top.stream, raw)
	case "instructions":
		setFirst(&top.instructions, raw)
	case "input":
		setFirst(&top.input, raw)
	}
}

func setFirst(dst *string, v string) {
	if *dst == "" {
		*dst = v
	}
}

// modelName is the text of the raw JSON model member: a fresh string, empty unless
// the member is a string.
func modelName(raw string) string {
	if !jsonscan.IsString(raw) {
		return ""
	}
	if m := raw[1 : len(raw)-1]; strings.IndexByte(m, '\\') < 0 {
		return strings.Clone(m)
	}
	return gjson.Parse(raw).Str // a fresh, unescaped string
}

// clearExtracted zeroes what Extract fills, keeping Prompt's backing array.
func clearExtracted(req *Request) {
	req.Model = ""
	req.Stream = false
	req.Prompt = req.Prompt[:0]
	req.BlockBytes = 0
	req.Tokens = 0
}

// fail clears what Extract had filled and returns err.
func fail(req *Request, err error) error {
	clearExtracted(req)
	return err
}

// bodyFields finds the conversation id in conversation.body_fields. The first
// fastBodyFields paths that start with a plain name have that member's raw value kept
// during the walk; any other path is looked up with gjson.Get.
type bodyFields struct {
	head [fastBodyFields]string // the path's first step; "" when the path needs gjson.Get
	val  [fastBodyFields]string // raw JSON of the member named head; "" when absent
	n    int                    // the paths in head
	lens uint64                 // bit min(len(head[i]), 63) set for each non-empty head
	kept int                    // the values in val
	gets bool                   // some path needs gjson.Get over the body
}

// prepare sets the first step of each fast path.
func (f *bodyFields) prepare(opt ExtractOptions) {
	f.n = min(len(opt.BodyFields), fastBodyFields)
	if opt.prepared {
		for i := 0; i < f.n; i++ {
			f.head[i] = opt.heads[i]
		}
		f.lens, f.gets = opt.headLens, opt.headGets
		return
	}
	f.gets = len(opt.BodyFields) > fastBodyFields
	for i := 0; i < f.n; i++ {
		f.head[i] = simpleHead(opt.BodyFields[i])
		if f.head[i] != "" {
			f.lens |= 1 << min(len(f.head[i]), 63)
		}
		f.gets = f.gets || f.head[i] == ""
	}
}

// keep records raw as the value of member key for the paths that start with key.
func (f *bodyFields) keep(key, raw string) {
	if f.lens&(1<<min(len(key), 63)) == 0 {
		return // most members: no head is as long as the key
	}
	for i := 0; i < f.n; i++ {
		if f.head[i] != key || key == "" {
			continue
		}
		if f.val[i] != "" {
			// A duplicate member: gjson.Get looks into each in turn.
			f.head[i] = ""
			continue
		}
		f.val[i] = raw
		f.kept++
	}
}

// conversationID returns the id of the first of paths that holds one
// (idFromBodyField), looking into the members kept during the walk where it can.
func (f *bodyFields) conversationID(json string, paths []string) (string, bool) {
	for i, path := range paths {
		var v gjson.Result
		switch {
		case i >= fastBodyFields || f.head[i] == "":
			v = gjson.Get(json, path)
		case f.val[i] == "":
			continue
		case len(path) == len(f.head[i]):
			v = gjson.Parse(f.val[i])
		default:
			v = gjson.Get(f.val[i], path[len(f.head[i])+1:])
		}
		if id, ok := idFromBodyField(v); ok {
			return id, true
		}
	}
	return "", false
}

// isBodyFieldPathChar is bodyFieldPathChars as a table: simpleHead runs for every
// body field of every request, and a table lookup is cheaper than a call a character.
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

// idFromBodyField returns the id a body field holds: a non-empty string, a number (by
// its raw JSON text), or either of those as the "id" member of an object.
func idFromBodyField(v gjson.Result) (string, bool) {
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
