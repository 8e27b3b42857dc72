package extract

import "github.com/kvroute/kvroute/routing/jsonscan"

// promptWriter appends the canonical prompt of a request (docs/behaviour.md, Reading
// the request) and measures it for the token estimate. Its methods read JSON text s
// from the value that starts at s[v] and return where that value ends. They read with
// jsonscan's readers, which check the shape as they go; the walk nests at most five
// levels (the body, its messages or input, an item, its content, a part), within
// jsonscan.WalkDepth.
type promptWriter struct {
	buf   []byte
	lines int  // lines begun; every line but the first starts with "\n"
	odd   bool // the walk met text it cannot vouch is shaped (jsonscan's readers)

	raw    int  // bytes appended that are not text: raw JSON parts, items and tool calls
	unkept int  // text bytes counted but not appended: a batch's strings after the first
	ids    int  // token ids read, when isIDs
	isIDs  bool // the prompt is token ids, 4 bytes each in buf
}

// estimate returns the size of one prefix block in the prompt and the prompt's token
// estimate: a token an id for token ids, else text bytes / charsPerToken.
func (w *promptWriter) estimate(charsPerToken, blockTokens int) (blockBytes, tokens int) {
	if w.isIDs {
		return blockTokens * tokenIDBytes, w.ids
	}
	return blockTokens * charsPerToken, (len(w.buf) - w.raw + w.unkept) / charsPerToken
}

// newLine begins a line: "\n" unless it is the first.
func (w *promptWriter) newLine() {
	if w.lines > 0 {
		w.buf = append(w.buf, '\n')
	}
	w.lines++
}

// roleLine begins the line role + ":" (role is raw JSON; not a string: empty). plain
// says role is a string whose text is its bytes (jsonscan.StringEnd).
func (w *promptWriter) roleLine(role string, plain bool) {
	buf := w.buf // appended to locally: w.buf is stored once
	if w.lines > 0 {
		buf = append(buf, '\n')
	}
	w.lines++
	switch {
	case plain:
		buf = append(buf, role[1:len(role)-1]...) // the usual role: no call to decode it
	case jsonscan.IsString(role):
		buf, _ = jsonscan.AppendString(buf, role, 0)
	}
	w.buf = append(buf, ':')
}

// appendRaw appends raw JSON, which is hashed but is not text.
func (w *promptWriter) appendRaw(raw string) {
	w.buf = append(w.buf, raw...)
	w.raw += len(raw)
}

// chat appends the lines of the chat completions "messages" array at s[v].
func (w *promptWriter) chat(s string, v int) (end int, err error) {
	if s[v] != '[' {
		return 0, errMessages
	}
	for i := v + 1; ; {
		m, end := jsonscan.ElementAt(s, i, &w.odd)
		if m < 0 {
			return end, nil
		}
		if s[m] != '{' {
			return 0, errMessages
		}
		if i, err = w.chatMessage(s, m); err != nil {
			return 0, err
		}
	}
}

// message is what reading a message object (or a responses input item) found.
type message struct {
	role, content, toolCalls string // raw JSON; "" means absent
	plainRole                bool   // role is a string whose text is its bytes
	inPlace                  bool   // the line was appended as the content was met
	end                      int    // just past the object
}

// readMessage reads the message object at s[m]. In the usual order, role then a
// string or array content, it appends the line where it meets the content, so a long
// prompt is decoded in the same pass; otherwise the caller builds the line from the
// raw members.
func (w *promptWriter) readMessage(s string, m int) message {
	var msg message
	contentSeen := false
	for i := m + 1; ; {
		k, v, close := jsonscan.MemberAt(s, i, &w.odd)
		if v < 0 {
			msg.end = close
			return msg
		}
		switch {
		case k == "role" && msg.role == "" && s[v] == '"':
			i, msg.plainRole = jsonscan.StringEnd(s, v)
			msg.role = s[v:i]
		case k == "role" && msg.role == "":
			i = jsonscan.ValueEnd(s, v, &w.odd)
			msg.role = s[v:i]
		case k == "content" && !contentSeen && msg.role != "" && (s[v] == '"' || s[v] == '['):
			contentSeen, msg.inPlace = true, true
			w.roleLine(msg.role, msg.plainRole)
			if s[v] == '"' { // as content reads it, one call the fewer for the usual message
				w.buf, i = jsonscan.AppendString(w.buf, s, v)
			} else {
				i = w.content(s, v)
			}
		case k == "content" && !contentSeen:
			contentSeen = true
			i = jsonscan.ValueEnd(s, v, &w.odd)
			msg.content = s[v:i]
		case k == "tool_calls" && msg.toolCalls == "":
			i = jsonscan.ValueEnd(s, v, &w.odd)
			msg.toolCalls = s[v:i]
		default:
			i = jsonscan.ValueEnd(s, v, &w.odd)
		}
	}
}

// chatMessage appends the line of the chat message at s[m], then its tool calls.
func (w *promptWriter) chatMessage(s string, m int) (end int, err error) {
	msg := w.readMessage(s, m)
	switch {
	case msg.inPlace:
	case jsonscan.IsString(msg.content) || jsonscan.IsArray(msg.content):
		w.roleLine(msg.role, msg.plainRole)
		w.content(msg.content, 0)
	case msg.content == "" || msg.content == "null":
		w.roleLine(msg.role, msg.plainRole)
	default:
		return 0, errContent
	}
	if jsonscan.IsArray(msg.toolCalls) || jsonscan.IsObject(msg.toolCalls) {
		w.appendRaw(msg.toolCalls)
	}
	return msg.end, nil
}

// inputItem appends the line of the responses input item at s[p]: as a chat message
// when it has a string or array content, else its raw JSON.
func (w *promptWriter) inputItem(s string, p int) (end int) {
	msg := w.readMessage(s, p)
	switch {
	case msg.inPlace:
	case jsonscan.IsString(msg.content) || jsonscan.IsArray(msg.content):
		w.roleLine(msg.role, msg.plainRole)
		w.content(msg.content, 0)
	default:
		w.newLine()
		w.appendRaw(s[p:msg.end])
	}
	return msg.end
}

// content appends the message content at s[v], a string or an array of parts: a part
// whose first "text" member is a string is text, any other part is appended as its
// raw JSON.
func (w *promptWriter) content(s string, v int) (end int) {
	if s[v] == '"' {
		w.buf, end = jsonscan.AppendString(w.buf, s, v)
		return end
	}
	for i := v + 1; ; {
		p, end := jsonscan.ElementAt(s, i, &w.odd)
		if p < 0 {
			return end
		}
		isText := false
		if s[p] == '{' {
			isText, i = w.textPart(s, p)
		} else {
			i = jsonscan.ValueEnd(s, p, &w.odd)
		}
		if !isText {
			w.appendRaw(s[p:i])
		}
	}
}

// textPart appends the text of the content part whose object starts at s[p] if its
// first "text" member is a string, and says whether it did.
func (w *promptWriter) textPart(s string, p int) (isText bool, end int) {
	textSeen := false
	for i := p + 1; ; {
		k, v, close := jsonscan.MemberAt(s, i, &w.odd)
		if v < 0 {
			return isText, close
		}
		if k == "text" && !textSeen {
			textSeen = true
			if s[v] == '"' {
				w.buf, i = jsonscan.AppendString(w.buf, s, v)
				isText = true
				continue
			}
		}
		i = jsonscan.ValueEnd(s, v, &w.odd)
	}
}

// completion appends the completions "prompt" at s[v]: a string, or an array of
// strings, of token ids or of arrays of token ids.
func (w *promptWriter) completion(s string, v int) (end int, err error) {
	switch s[v] {
	case '"':
		w.buf, end = jsonscan.AppendString(w.buf, s, v)
		return end, nil
	case '[':
		return w.completionArray(s, v)
	}
	return 0, errPrompt
}

// completionArray appends the completions "prompt" array at s[v]. Its elements must be
// all strings (a batch), all token ids, or all arrays of token ids (a batch); a batch
// is counted over all its prompts and hashed over the first.
func (w *promptWriter) completionArray(s string, v int) (end int, err error) {
	var kind byte // of the elements: '"' strings, '0' token ids, '[' arrays of token ids
	for i := v + 1; ; {
		p, end := jsonscan.ElementAt(s, i, &w.odd)
		if p < 0 {
			w.isIDs = kind == '0' || kind == '['
			return end, nil
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
			return 0, errPrompt
		case k == '"':
			mark := len(w.buf)
			w.buf, i = jsonscan.AppendString(w.buf, s, p)
			if !first { // only the first string is hashed
				w.unkept += len(w.buf) - mark
				w.buf = w.buf[:mark]
			}
		case k == '0':
			i, err = w.tokenID(s, p)
		case k == '[' && first:
			i, err = w.tokenIDs(s, p)
		case k == '[':
			i, err = w.countTokenIDs(s, p)
		default:
			return 0, errPrompt
		}
		if err != nil {
			return 0, err
		}
	}
}

// tokenID appends the token id at s[p].
func (w *promptWriter) tokenID(s string, p int) (end int, err error) {
	end = jsonscan.ValueEnd(s, p, &w.odd)
	id, ok := parseTokenID(s[p:end])
	if !ok {
		return 0, errTokenID
	}
	w.buf = appendTokenID(w.buf, id)
	w.ids++
	return end, nil
}

// tokenIDs appends the array of token ids at s[p].
func (w *promptWriter) tokenIDs(s string, p int) (end int, err error) {
	for j := p + 1; ; {
		q, qend := jsonscan.ElementAt(s, j, &w.odd)
		if q < 0 {
			return qend, nil
		}
		if j, err = w.tokenID(s, q); err != nil {
			return 0, err
		}
	}
}

// countTokenIDs counts the token ids in the array at s[p], checking each.
func (w *promptWriter) countTokenIDs(s string, p int) (end int, err error) {
	for j := p + 1; ; {
		q, qend := jsonscan.ElementAt(s, j, &w.odd)
		if q < 0 {
			return qend, nil
		}
		j = jsonscan.ValueEnd(s, q, &w.odd)
		if _, ok := parseTokenID(s[q:j]); !ok {
			return 0, errTokenID
		}
		w.ids++
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

// responses appends the prompt of a responses request from its raw "instructions"
// and "input" members.
func (w *promptWriter) responses(instructions, input string) error {
	switch {
	case instructions == "" || instructions == "null":
	case jsonscan.IsString(instructions):
		w.roleLine(`"`+instructionsRole+`"`, true)
		w.buf, _ = jsonscan.AppendString(w.buf, instructions, 0)
	default:
		return errInstructions
	}
	if jsonscan.IsString(input) {
		w.roleLine(`"`+stringInputRole+`"`, true)
		w.buf, _ = jsonscan.AppendString(w.buf, input, 0)
		return nil
	}
	if !jsonscan.IsArray(input) {
		return errInput
	}
	for i := 1; ; {
		p, _ := jsonscan.ElementAt(input, i, &w.odd)
		if p < 0 {
			return nil
		}
		if input[p] != '{' {
			return errInput
		}
		i = w.inputItem(input, p)
	}
}
