package main

// nameTable finds which of a fixed few names (route paths, header names) a string is.
// A request asks it of its path and each of its headers; in wasm a Go map lookup of a
// string hashes it, == compares a byte at a time and every call is costly. The table
// goes by length first (most strings asked of it have a length no name has), then
// compares keys of three 8-byte windows, inline.
type nameTable struct {
	byLen [64][]nameEntry // by length
	long  []nameEntry     // names of 64 bytes or more
}

// nameEntry is one name of a nameTable.
type nameEntry struct {
	name string  // the name
	key  nameKey // keyOf(name)
	id   int     // what find returns for it
}

// nameKey is three windows of a string: its first, middle and last 8 bytes
// (overlapping under 24 bytes), or its first and last 4 under 8 bytes, or its first,
// middle and last byte under 4. Two strings of one length up to 24 bytes have one key
// exactly when they are equal.
type nameKey struct{ first, middle, last uint64 } // a struct, not an array: Go keeps it in locals

// nameKeyExact is the longest length whose key tells equality.
const nameKeyExact = 24

// keyOf is s's nameKey (find computes it inline).
func keyOf(s string) nameKey {
	n := len(s)
	switch {
	case n >= 8:
		return nameKey{word64(s, 0), word64(s, n/2-4), word64(s, n-8)}
	case n >= 4:
		return nameKey{first: uint64(word32(s, 0)), last: uint64(word32(s, n-4))}
	case n > 0:
		return nameKey{first: uint64(s[0]) | uint64(s[n/2])<<8 | uint64(s[n-1])<<16}
	}
	return nameKey{}
}

// add makes find return id for name; a name added twice keeps its first id.
func (t *nameTable) add(name string, id int) {
	if t.find(name) >= 0 {
		return
	}
	list := &t.long
	if len(name) < len(t.byLen) {
		list = &t.byLen[len(name)]
	}
	*list = append(*list, nameEntry{name: name, key: keyOf(name), id: id})
}

// find returns the id of name, or -1.
func (t *nameTable) find(name string) int {
	n := len(name)
	list := t.long
	if n < len(t.byLen) {
		list = t.byLen[n]
	}
	if len(list) == 0 {
		return -1
	}
	// keyOf, written out: a call costs more than the key.
	var k nameKey
	switch {
	case n >= 8:
		k = nameKey{word64(name, 0), word64(name, n/2-4), word64(name, n-8)}
	case n >= 4:
		k = nameKey{first: uint64(word32(name, 0)), last: uint64(word32(name, n-4))}
	case n > 0:
		k = nameKey{first: uint64(name[0]) | uint64(name[n/2])<<8 | uint64(name[n-1])<<16}
	}
	for i := range list {
		if list[i].key == k && (n <= nameKeyExact || sameName(list[i].name, name)) {
			return list[i].id
		}
	}
	return -1
}

// sameName is a == b, 8 bytes at a time (the last 8 overlapping those before), or 4
// for strings of 4 to 7 bytes.
func sameName(a, b string) bool {
	n := len(a)
	switch {
	case n != len(b):
		return false
	case n < 4:
		return a == b
	case n < 8:
		return word32(a, 0) == word32(b, 0) && word32(a, n-4) == word32(b, n-4)
	}
	for i := 0; i < n-8; i += 8 {
		if word64(a, i) != word64(b, i) {
			return false
		}
	}
	return word64(a, n-8) == word64(b, n-8)
}

// word64 and word32 read 8 and 4 bytes of s from i (one load each, once compiled).
func word64(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

func word32(s string, i int) uint32 {
	s = s[i : i+4]
	return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24
}
