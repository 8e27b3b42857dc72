package jsonscan

import "math/bits"

// MaxDepth bounds the nesting a body may have: ShapeOK refuses deeper ones.
const MaxDepth = 256

// ShapeOK checks, in one fast pass, that body is a JSON object with balanced
// brackets and closed strings, no deeper than MaxDepth, and nothing after it.
// It is not a full grammar check (a missing comma or colon passes): the fields the
// router reads are checked as they are read, and a body the worker would reject for
// such a slip is still routed sensibly. It is cheaper than a full validation
// because most of a prompt is string bytes, which it skips with IndexByte.
//
// skip, which may be nil, holds strings the caller has already scanned to their end with
// the same rule (a quote after an even number of backslashes closes a string), for the
// check to jump over. A span counts only if the check meets its opening quote outside a
// string, so the result is the same whatever skip holds.
func ShapeOK(body string, skip *Spans) bool {
	k := 0 // the next span that may start at or after i
	i := SkipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return false
	}
	var stack [MaxDepth]byte
	depth := 0
	for ; i < len(body); i++ {
		switch c := body[i]; c {
		case '"':
			e := -1
			if skip != nil {
				for k < skip.n && skip.at[k].start < i {
					k++
				}
				if k < skip.n && skip.at[k].start == i {
					e = skip.at[k].end
					k++
				}
			}
			if e < 0 {
				// Most strings left to check are keys and short values: looking at
				// their first word here costs less than the call, when they end in it.
				// (stringEnd opens with the same test; as a function of its own it is
				// past the inliner's budget, and the call costs more than the word.)
				if j := i + 1; j+8 <= len(body) {
					if m := quoteOrEscapeMask(load64(body, j)); m != 0 {
						if q := j + bits.TrailingZeros64(m)>>3; body[q] == '"' {
							e = q + 1
						}
					}
				}
				if e < 0 {
					e, _ = stringEnd(body, i)
				}
			}
			if e > len(body) || body[e-1] != '"' || e-1 == i {
				return false // not closed
			}
			i = e - 1
		case '{', '[':
			if depth == MaxDepth {
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
				return SkipSpace(body, i+1) == len(body)
			}
		default:
			if c < ' ' && c != '\t' && c != '\n' && c != '\r' {
				return false
			}
		}
	}
	return false
}

// Spans are the long strings of a body that a walk over it has scanned, in order, each
// from its opening quote to just past its end.
type Spans struct {
	n  int
	at [16]struct{ start, end int }
}

// minSpanBytes is the shortest string worth remembering.
const minSpanBytes = 64

// Add remembers the string at [start, end); sp may be nil.
func (sp *Spans) Add(start, end int) {
	if sp == nil || sp.n == len(sp.at) || end-start < minSpanBytes {
		return
	}
	if sp.n > 0 && sp.at[sp.n-1].end > start {
		return // not after the last: keep them in order
	}
	sp.at[sp.n].start, sp.at[sp.n].end = start, end
	sp.n++
}
