// Package jsonscan reads JSON text in place, from an index into it, without building a
// tree or copying what it does not return: the router reads a few members of request
// bodies that are mostly one long prompt, and a full decoder would spend most of its time
// and memory on that prompt. It checks no more syntax than its caller needs, but never
// indexes out of range nor loops on any input: a value that is not closed ends at the
// end of the text.
//
// The readers that pass over structure (MemberAt, ElementAt, ValueEnd) also check, as
// they go, what ShapeOK checks of a body, and set *odd when what they passed over is
// not shaped as ShapeOK requires, or may not be. A walk that reads an object with them
// from its "{" to the "}" MemberAt ends it at, nesting at most WalkDepth levels of its
// own, and never sets odd, has read an object ShapeOK passes; after any other walk the
// caller must ask ShapeOK. Setting odd never changes what the readers return.
package jsonscan

import (
	"math/bits"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// WalkDepth is the nesting a walk may have above the values ValueEnd passes over,
// which it checks to nest at most MaxDepth-WalkDepth levels.
const WalkDepth = 8

// IsString reports whether the raw JSON value raw is a string.
func IsString(raw string) bool { return raw != "" && raw[0] == '"' }

// IsArray reports whether the raw JSON value raw is an array.
func IsArray(raw string) bool { return raw != "" && raw[0] == '[' }

// IsObject reports whether the raw JSON value raw is an object.
func IsObject(raw string) bool { return raw != "" && raw[0] == '{' }

// SkipSpace returns the index of the first byte at or after s[i] that is not white space.
func SkipSpace(s string, i int) int {
	for i < len(s) && s[i] <= ' ' {
		i++
	}
	return i
}

// skipSpace is SkipSpace for the readers of a walk: it sets *odd when it passes over
// a control character that is not JSON white space, which ShapeOK refuses in a body.
func skipSpace(s string, i int, odd *bool) int {
	for i < len(s) && s[i] <= ' ' {
		if jsonSpace>>s[i]&1 == 0 {
			*odd = true
		}
		i++
	}
	return i
}

// MemberAt reads the next member of an object, at or after s[i] (just past "{" or
// past the previous member's value). It returns the unescaped key and where the
// value starts; after the last member v is -1 and end is just past "}". It sets *odd
// when the object ends other than at "}".
func MemberAt(s string, i int, odd *bool) (key string, v, end int) {
	// Compact JSON, as clients send it, is read here without a call: the "}" that
	// ends the object, or an optional comma, a key that ends within two words, a
	// colon, and the value. Anything else memberAt reads.
	if i+20 <= len(s) {
		j := i
		if s[j] == ',' {
			j++
		}
		if s[j] == '"' {
			k := j + 1
			m := quoteOrEscapeMask(load64(s, k))
			if m == 0 {
				k += 8
				m = quoteOrEscapeMask(load64(s, k))
			}
			if q := k + bits.TrailingZeros64(m)>>3; m != 0 && s[q] == '"' && s[q+1] == ':' && s[q+2] > ' ' {
				return s[j+1 : q], q + 2, 0
			}
		} else if s[i] == '}' {
			return "", -1, i + 1
		}
	}
	return memberAt(s, i, odd)
}

// memberAt is MemberAt the general way, for any text.
func memberAt(s string, i int, odd *bool) (key string, v, end int) {
	i = skipSpace(s, i, odd)
	if i < len(s) && s[i] == ',' {
		i = skipSpace(s, i+1, odd)
	}
	if i >= len(s) || s[i] != '"' {
		if i >= len(s) || s[i] != '}' {
			*odd = true
		}
		return "", -1, min(i+1, len(s))
	}
	e, escaped := stringEnd(s, i)
	key = s[i+1 : max(e-1, i+1)]
	if escaped {
		key = gjson.Parse(s[i:e]).Str // rare: an escaped key
	}
	i = skipSpace(s, e, odd)
	if i < len(s) && s[i] == ':' {
		i = skipSpace(s, i+1, odd)
	}
	if i >= len(s) {
		*odd = true
		return "", -1, len(s)
	}
	return key, i, 0
}

// ElementAt reads the next element of an array, at or after s[i] (just past "[" or
// past the previous element). It returns where the element starts; after the last
// element v is -1 and end is just past "]". It sets *odd when the array ends other
// than at "]".
func ElementAt(s string, i int, odd *bool) (v, end int) {
	i = skipSpace(s, i, odd)
	if i < len(s) && s[i] == ',' {
		i = skipSpace(s, i+1, odd)
	}
	if i >= len(s) || s[i] == ']' {
		if i >= len(s) {
			*odd = true
		}
		return -1, min(i+1, len(s))
	}
	return i, 0
}

// ValueEnd returns where the value that starts at s[i] ends: always past i (when
// i < len(s)) and at most len(s). It sets *odd when the value is an array or object
// not shaped as ShapeOK requires (or nested more than MaxDepth-WalkDepth levels), or
// a literal that holds a quote or a bracket. (A string that is not closed runs to the
// end of s, where the walk's next reader sets odd.)
func ValueEnd(s string, i int, odd *bool) int {
	if i >= len(s) {
		*odd = true
		return len(s)
	}
	switch s[i] {
	case '"':
		e, _ := stringEnd(s, i)
		return e
	case '{', '[':
		e, ok := shapedEnd(s, i, MaxDepth-WalkDepth)
		if !ok {
			*odd = true
			e = bracketEnd(s, i)
		}
		return e
	}
	e := i + 1
	for e < len(s) && literalByte[s[e]] == inLiteral {
		e++
	}
	if literalByte[s[i]] != inLiteral || e < len(s) && literalByte[s[e]] == oddInLiteral {
		*odd = true
		for e < len(s) && s[e] > ' ' && s[e] != ',' && s[e] != '}' && s[e] != ']' {
			e++
		}
	}
	return e
}

// The kinds of byte in a literal (a number, true, false or null; or a bare word).
const (
	inLiteral    = iota
	endsLiteral  // white space, ",", "}" or "]"
	oddInLiteral // a quote or an opening bracket: part of the literal all the same
)

// literalByte is the kind of each byte in a literal.
var literalByte = func() (t [256]uint8) {
	for c := 0; c <= ' '; c++ {
		t[c] = endsLiteral
	}
	t[','], t['}'], t[']'] = endsLiteral, endsLiteral, endsLiteral
	t['"'], t['{'], t['['] = oddInLiteral, oddInLiteral, oddInLiteral
	return t
}()

// bracketEnd is where the array or object at s[i] ends when it is not shaped: past
// the bracket that brings the count of open brackets, of either kind, back to zero.
func bracketEnd(s string, i int) int {
	depth := 0
	for ; i < len(s); i++ {
		switch s[i] {
		case '"':
			e, _ := stringEnd(s, i)
			i = e - 1
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

// StringEnd returns where the string that starts at s[i] == '"' ends, as ValueEnd
// does, and whether it is plain: closed and without escapes, so that its text is
// s[i+1:end-1].
func StringEnd(s string, i int) (end int, plain bool) {
	if j := i + 1; j+8 <= len(s) { // as stringEnd opens, for want of inlining it
		if m := quoteOrEscapeMask(load64(s, j)); m != 0 {
			if q := j + bits.TrailingZeros64(m)>>3; s[q] == '"' {
				return q + 1, true
			}
		}
	}
	end, escaped := stringEnd(s, i)
	return end, !escaped && end-1 > i && s[end-1] == '"'
}

// stringEnd returns the index just past the closing quote of the string that starts
// at s[i] == '"', or len(s) if it is not closed, and whether the string holds an
// escape. A backslash escapes the byte after it, so a quote closes the string exactly
// when an even number of backslashes precede it.
func stringEnd(s string, i int) (end int, escaped bool) {
	// Keys and short values end in their first word: found here, without a call.
	if j := i + 1; j+8 <= len(s) {
		if m := quoteOrEscapeMask(load64(s, j)); m != 0 {
			if q := j + bits.TrailingZeros64(m)>>3; s[q] == '"' {
				return q + 1, false
			}
		}
	}
	for j := i + 1; j < len(s); j += 2 { // past the backslash and the byte it escapes
		j = quoteOrEscape(s, j)
		if j >= len(s) {
			break
		}
		if s[j] == '"' {
			return j + 1, escaped
		}
		escaped = true
	}
	return len(s), escaped
}

// AppendString appends the unescaped text of the JSON string that starts at
// s[i] == '"', decoding escapes as gjson does, and returns the index just past it.
// It finds the end and decodes in one pass.
func AppendString(dst []byte, s string, i int) (_ []byte, end int) {
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

// quoteOrEscape returns the index of the first '"' or '\\' in s at or after i, or
// len(s). It looks at eight bytes a step (SWAR): in wasm, where strings.IndexByte is a
// byte loop behind a call, the string bytes of a prompt are most of the work of reading
// a body.
func quoteOrEscape(s string, i int) int {
	// The first two words alone: most strings of a body besides the prompt are keys
	// and short values, which end within them.
	for n := 0; n < 2 && i+8 <= len(s); n++ {
		if m := quoteOrEscapeMask(load64(s, i)); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
		i += 8
	}
	// Then eight words a step: in Go's wasm every loop iteration goes back through the
	// function's block dispatcher, which costs more than testing a word. Slicing the
	// step's 64 bytes once leaves the loads without bounds checks. Each word has a line
	// of its own: the compiler orders a block's operations by source line, and with
	// one line (or one inlined helper) for all eight it loads and masks every word
	// before combining any, and spills.
	for ; i+64 <= len(s); i += 64 {
		w := s[i : i+64]
		x := load64(w, 0)
		m := ((x ^ swarQuotes - swarOnes) | (x ^ swarEscapes - swarOnes)) &^ x
		x = load64(w, 8)
		m |= ((x ^ swarQuotes - swarOnes) | (x ^ swarEscapes - swarOnes)) &^ x
		x = load64(w, 16)
		m |= ((x ^ swarQuotes - swarOnes) | (x ^ swarEscapes - swarOnes)) &^ x
		x = load64(w, 24)
		m |= ((x ^ swarQuotes - swarOnes) | (x ^ swarEscapes - swarOnes)) &^ x
		x = load64(w, 32)
		m |= ((x ^ swarQuotes - swarOnes) | (x ^ swarEscapes - swarOnes)) &^ x
		x = load64(w, 40)
		m |= ((x ^ swarQuotes - swarOnes) | (x ^ swarEscapes - swarOnes)) &^ x
		x = load64(w, 48)
		m |= ((x ^ swarQuotes - swarOnes) | (x ^ swarEscapes - swarOnes)) &^ x
		x = load64(w, 56)
		m |= ((x ^ swarQuotes - swarOnes) | (x ^ swarEscapes - swarOnes)) &^ x
		if m&swarHigh != 0 { // as quoteOrEscapeMask of any of the words
			break // the word loop below finds which byte
		}
	}
	for ; i+8 <= len(s); i += 8 {
		if m := quoteOrEscapeMask(load64(s, i)); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	for ; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			return i
		}
	}
	return len(s)
}

const (
	swarOnes    = 0x0101010101010101
	swarHigh    = 0x8080808080808080
	swarQuotes  = swarOnes * '"'
	swarEscapes = swarOnes * '\\'
)

// quoteOrEscapeMask has the high bit set in the byte lanes of w that hold '"' or '\\'
// — exactly at the lowest such lane; lanes above it may be set spuriously, which
// callers never look at. A lane of w^swarQuotes (or w^swarEscapes) less one has its
// high bit set when the lane was zero, or when w's lane has its high bit set: both
// constants are ASCII. So the lanes w holds ASCII in, &^w, are exact, up to the
// lowest zero lane, where the first borrow is.
func quoteOrEscapeMask(w uint64) uint64 {
	return ((w ^ swarQuotes - swarOnes) | (w ^ swarEscapes - swarOnes)) &^ w & swarHigh
}

// load64 reads s[i:i+8] little-endian; the compiler makes it one 64-bit load.
func load64(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}
