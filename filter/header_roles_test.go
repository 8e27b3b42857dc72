package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHeaderRolesFindEveryNameAndNoOther(t *testing.T) {
	long := "x-" + strings.Repeat("a", 80)
	h := newHeaderRoles([]string{"x-gateway-destination-endpoint", long, "x-kvroute-decision"},
		[]string{"x-session-id", "x-request-id", long, "x-session-id"}, true)

	for name, want := range map[string]func(r *headerRole) bool{
		":method":        func(r *headerRole) bool { return r.method },
		":path":          func(r *headerRole) bool { return r.path },
		"content-length": func(r *headerRole) bool { return r.contentLength },
		"x-request-id":   func(r *headerRole) bool { return r.requestID && r.conversation == 1 },
		"x-session-id":   func(r *headerRole) bool { return r.conversation == 0 }, // listed twice: first rank
		"x-gateway-destination-endpoint": func(r *headerRole) bool {
			return len(r.owned) == 1 && r.owned[0] == 0 && r.conversation < 0
		},
		long: func(r *headerRole) bool { return len(r.owned) == 1 && r.owned[0] == 1 && r.conversation == 2 },
	} {
		r := h.of(name)
		require.NotNil(t, r, name)
		assert.True(t, want(r), "%s: %+v", name, *r)
	}
	for _, name := range []string{"", ":authority", "x-request-ie", "content-type", long + "b", "X-Session-Id"} {
		assert.Nil(t, h.of(name), name)
	}
}

func TestHeaderRolesWithoutConversations(t *testing.T) {
	h := newHeaderRoles(nil, []string{"x-session-id"}, false)
	assert.Nil(t, h.of("x-session-id"), "conversation affinity off: the header means nothing")
	assert.NotNil(t, h.of(":path"))
}
