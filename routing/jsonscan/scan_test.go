package jsonscan

import (
	"strings"
	"testing"
)

// quoteOrEscape reads short strings a word at a time and long ones 64 bytes a step:
// a quote or a backslash is found at every position of every step, from any start.
// The filler holds bytes one bit from a quote or a backslash, and non-ASCII bytes
// ('"' and '\\' with the high bit set among them).
func TestQuoteOrEscapeFindsEveryPosition(t *testing.T) {
	for _, c := range []byte{'"', '\\'} {
		for n := 0; n <= 200; n += 7 {
			for p := 0; p < n; p++ {
				b := []byte(strings.Repeat("a#!\x00[]\xa2\xdc\xff\x80\x7f2^", n))[:n]
				b[p] = c
				s := string(b)
				for _, start := range []int{0, 1, 5, 8, 17, p} {
					want := p
					if start > p {
						want = n
					}
					if got := quoteOrEscape(s, start); got != want {
						t.Fatalf("n=%d, %q at %d, from %d: got %d, want %d", n, c, p, start, got, want)
					}
				}
			}
		}
	}
}

// A key with an escape is decoded; one without is a view of the body.
func TestMemberAtDecodesEscapedKeys(t *testing.T) {
	for body, want := range map[string]string{
		`{"plain":1}`:         "plain",
		`{"a\"b":1}`:          `a"b`,
		`{"\u0072ole":1}`:     "role",
		`{"back\\\\slash":1}`: `back\\slash`,
	} {
		odd := false
		if key, v, _ := MemberAt(body, 1, &odd); key != want || v < 0 || odd {
			t.Errorf("MemberAt(%s) = %q, %d, odd %v; want %q", body, key, v, odd, want)
		}
	}
}
