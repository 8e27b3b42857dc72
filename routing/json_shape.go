package routing

// maxJSONDepth bounds the nesting a body may have: deeper bodies fail open.
const maxJSONDepth = 256

// jsonShapeOK checks, in one fast pass, that body is a JSON object with balanced
// brackets and closed strings, no deeper than maxJSONDepth, and nothing after it.
// It is not a full grammar check (a missing comma or colon passes): the fields the
// router reads are checked as they are read, and a body the worker would reject for
// such a slip is still routed sensibly. It is several times faster than a full
// validation, most of a prompt being string bytes that IndexByte skips.
func jsonShapeOK(body string) bool { return shapeOK(body, nil) }

// shapeOK is jsonShapeOK that jumps over the strings in spans, which the caller
// has already scanned to their end with the same rule (a quote after an even number
// of backslashes closes a string). A span counts only if the check meets its opening
// quote outside a string, so the result is jsonShapeOK's whatever spans holds.
func shapeOK(body string, spans *stringSpans) bool {
	k := 0 // the next span that may start at or after i
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return false
	}
	var stack [maxJSONDepth]byte
	depth := 0
	for ; i < len(body); i++ {
		switch c := body[i]; c {
		case '"':
			e := -1
			if spans != nil {
				for k < spans.n && spans.at[k].start < i {
					k++
				}
				if k < spans.n && spans.at[k].start == i {
					e = spans.at[k].end
					k++
				}
			}
			if e < 0 {
				e = stringEnd(body, i)
			}
			if e > len(body) || body[e-1] != '"' || e-1 == i {
				return false // not closed
			}
			i = e - 1
		case '{', '[':
			if depth == maxJSONDepth {
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
				return skipSpace(body, i+1) == len(body)
			}
		default:
			if c < ' ' && c != '\t' && c != '\n' && c != '\r' {
				return false
			}
		}
	}
	return false
}

// stringSpans are the long strings of a body that a walk over it has scanned, in
// order, each from its opening quote to just past its end.
type stringSpans struct {
	n  int
	at [16]struct{ start, end int }
}

// minSpanBytes is the shortest string worth remembering.
const minSpanBytes = 64

// add remembers the string at [start, end); sp may be nil.
func (sp *stringSpans) add(start, end int) {
	if sp == nil || sp.n == len(sp.at) || end-start < minSpanBytes {
		return
	}
	if sp.n > 0 && sp.at[sp.n-1].end > start {
		return // not after the last: keep them in order
	}
	sp.at[sp.n].start, sp.at[sp.n].end = start, end
	sp.n++
}
