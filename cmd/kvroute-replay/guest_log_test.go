package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestAModulesWritesAreJoinedIntoLines(t *testing.T) {
	// println("DBG now", 5) in the module writes "DBG now", " ", "5" and a newline,
	// each apart; the host hands the newline over as an empty write.
	var b strings.Builder
	log := guestLines(&b)
	for _, w := range []string{"DBG now", " ", "5", "", "next", ""} {
		log(4, w)
	}
	assert.Equal(t, "DBG now 5\nnext\n", b.String())
	log(4, "unfinished")
	assert.Equal(t, "DBG now 5\nnext\n", b.String(), "a line is written once it ends")
}
