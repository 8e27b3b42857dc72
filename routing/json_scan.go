package routing

import "math/bits"

// quoteOrEscape returns the index of the first '"' or '\\' in s at or after i, or
// len(s). It looks at eight bytes a step (SWAR): in wasm, where strings.IndexByte is a
// byte loop, the string bytes of a prompt are most of the work of reading a body.
func quoteOrEscape(s string, i int) int {
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
	swarOnes = 0x0101010101010101
	swarHigh = 0x8080808080808080
)

// quoteOrEscapeMask has the high bit set in the byte lanes of w that hold '"' or '\\'
// — exactly at the lowest such lane; lanes above it may be set spuriously, which
// callers never look at.
func quoteOrEscapeMask(w uint64) uint64 {
	q := w ^ (swarOnes * '"')
	b := w ^ (swarOnes * '\\')
	return ((q-swarOnes)&^q | (b-swarOnes)&^b) & swarHigh
}

// load64 reads s[i:i+8] little-endian; the compiler makes it one 64-bit load.
func load64(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}
