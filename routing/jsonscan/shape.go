package jsonscan

import "math/bits"

// MaxDepth bounds the nesting a body may have: ShapeOK refuses deeper ones.
const MaxDepth = 256

// ShapeOK checks, in one fast pass, that body is a JSON object with balanced
// brackets and closed strings, no deeper than MaxDepth, and nothing after it.
// It is not a full grammar check (a missing comma or colon passes): the fields the
// router reads are checked as they are read, and a body the worker would reject for
// such a slip is still routed sensibly. It is cheaper than a full validation
// because most of a prompt is string bytes, which it skips a word at a time.
func ShapeOK(body string) bool {
	i := SkipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return false
	}
	e, ok := shapedEnd(body, i, MaxDepth)
	return ok && SkipSpace(body, e) == len(body)
}

// shapedEnd returns where the array or object at s[i] ends, and whether it is shaped
// as ShapeOK requires of a body: its brackets match, its strings are closed, it
// nests at most maxDepth levels, and it holds no control character outside its
// strings but JSON's white space.
func shapedEnd(s string, i, maxDepth int) (end int, ok bool) {
	var isObject [(MaxDepth + 63) / 64]uint64 // a bit a level: whether that level is an object
	depth := 0
	for ; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			e := -1
			// Most strings left to check are keys and short values: looking at their
			// first word here costs less than the call, when they end in it.
			// (stringEnd opens with the same test; as a function of its own it is
			// past the inliner's budget, and the call costs more than the word.)
			if j := i + 1; j+8 <= len(s) {
				if m := quoteOrEscapeMask(load64(s, j)); m != 0 {
					if q := j + bits.TrailingZeros64(m)>>3; s[q] == '"' {
						e = q + 1
					}
				}
			}
			if e < 0 {
				e, _ = stringEnd(s, i)
			}
			i = e - 1 // an unclosed string runs to the end: nothing closes after it
		case '{', '[':
			if depth >= maxDepth {
				return i, false
			}
			bit := uint64(1) << (depth & 63)
			if c == '{' {
				isObject[depth>>6] |= bit
			} else {
				isObject[depth>>6] &^= bit
			}
			depth++
		case '}', ']':
			if depth == 0 {
				return i, false
			}
			depth--
			if (isObject[depth>>6]>>(depth&63)&1 != 0) != (c == '}') {
				return i, false
			}
			if depth == 0 {
				return i + 1, true
			}
		default:
			if c < ' ' && jsonSpace>>c&1 == 0 {
				return i, false
			}
		}
	}
	return len(s), false
}

// jsonSpace has bit c set for each byte c that is JSON white space.
const jsonSpace uint64 = 1<<' ' | 1<<'\t' | 1<<'\n' | 1<<'\r'
