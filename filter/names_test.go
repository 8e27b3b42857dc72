package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// sameName is ==: at every length, for strings that differ in any one byte or in
// their length.
func TestSameNameIsEquality(t *testing.T) {
	for n := 0; n <= 40; n++ {
		a := strings.Repeat("x", n)
		require.True(t, sameName(a, strings.Clone(a)), n)
		require.False(t, sameName(a, a+"x"), n)
		require.False(t, sameName(a+"x", a), n)
		for i := 0; i < n; i++ {
			b := []byte(a)
			b[i] = 'y'
			require.False(t, sameName(a, string(b)), "%d bytes, byte %d", n, i)
			require.False(t, sameName(string(b), a), "%d bytes, byte %d", n, i)
		}
	}
}

// Strings of one length up to nameKeyExact have one key exactly when they are equal.
func TestNameKeyTellsEqualityUpToItsLength(t *testing.T) {
	for n := 0; n <= nameKeyExact; n++ {
		a := strings.Repeat("x", n)
		require.Equal(t, keyOf(a), keyOf(strings.Clone(a)), n)
		for i := 0; i < n; i++ {
			b := []byte(a)
			b[i] = 'y'
			require.NotEqual(t, keyOf(a), keyOf(string(b)), "%d bytes, byte %d", n, i)
		}
	}
}

// A nameTable finds each name it was given, at its first id, and nothing else, as a
// Go map of the names would.
func TestNameTableFindsWhatAMapDoes(t *testing.T) {
	names := []string{"", "/", "/v1/chat/completions", "/v1/completions", "/v1/responses", ":path",
		":method", "x-request-id", "content-length", "x-gateway-destination-endpoint", "x-multi-turn-session-id",
		"ab", "a", strings.Repeat("r", 64), strings.Repeat("r", 100),
		"/v1/chat/completions"}
	var tab nameTable
	want := map[string]int{}
	for i, name := range names {
		tab.add(name, i)
		if _, ok := want[name]; !ok {
			want[name] = i
		}
	}
	for _, name := range append(names, "/v1/chat/completionz", "/v2/chat/completions", ":paths", ":pat",
		"x-request-ie", "x-gateway-destination-endpoinT", "x-gateway-destinatioN-endpoint", "x-multi-turn-sessioN-id",
		"b", "ba", "aa", strings.Repeat("r", 63), strings.Repeat("r", 101), "X-Request-Id") {
		id, ok := want[name]
		if !ok {
			id = -1
		}
		require.Equal(t, id, tab.find(name), name)
	}
}
