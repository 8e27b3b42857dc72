package main

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
)

// parseInt is strconv.ParseInt(s, 10, 64) without its error.
func TestParseIntIsStrconvs(t *testing.T) {
	for _, s := range []string{"", "0", "7", "200", "4096", "007", "123456789012345678", "999999999999999999",
		"1234567890123456789", "9223372036854775807", "9223372036854775808", "99999999999999999999",
		"+5", "-5", " 5", "5 ", "5a", "0x10", "1_000", "-9223372036854775808", "١٢"} {
		want, err := strconv.ParseInt(s, 10, 64)
		n, ok := parseInt(s)
		assert.Equal(t, err == nil, ok, s)
		assert.Equal(t, want, n, s)
	}
}
