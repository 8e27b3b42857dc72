package routing

// maxJSONDepth bounds the nesting a body may have: deeper bodies fail open.
const maxJSONDepth = 256

// jsonShapeOK checks, in one fast pass, that body is a JSON object with balanced
// brackets and closed strings, no deeper than maxJSONDepth, and nothing after it.
// It is not a full grammar check (a missing comma or colon passes): the fields the
// router reads are checked as they are read, and a body the worker would reject for
// such a slip is still routed sensibly. It is several times faster than a full
// validation, most of a prompt being string bytes that IndexByte skips.
func jsonShapeOK(body string) bool {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return false
	}
	var stack [maxJSONDepth]byte
	depth := 0
	for ; i < len(body); i++ {
		switch c := body[i]; c {
		case '"':
			e := stringEnd(body, i)
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
