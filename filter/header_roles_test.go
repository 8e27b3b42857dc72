package main

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHeaderRolesFindEveryNameAndNoOther(t *testing.T) {
	long := "x-" + strings.Repeat("a", 80)
	h := newHeaderRoles([]string{"x-gateway-destination-endpoint", long, "x-kvroute-decision"},
		[]string{"x-session-id", "x-request-id", long, "x-session-id"}, true)

	for name, want := range map[string]func(r *headerRole) bool{
		":method":        func(r *headerRole) bool { return r.field == headMethod && !r.special },
		":path":          func(r *headerRole) bool { return r.field == headPath && !r.special },
		"content-length": func(r *headerRole) bool { return r.field == headContentLength && !r.special },
		"x-request-id": func(r *headerRole) bool {
			return r.field == headRequestID && r.conversation == 1 && r.special
		},
		"x-session-id": func(r *headerRole) bool { return r.conversation == 0 && r.special }, // listed twice: first rank
		"x-gateway-destination-endpoint": func(r *headerRole) bool {
			return len(r.owned) == 1 && r.owned[0] == 0 && r.conversation < 0 && r.special
		},
		long: func(r *headerRole) bool {
			return len(r.owned) == 1 && r.owned[0] == 1 && r.conversation == 2 && r.special
		},
	} {
		r := h.of(name)
		assert.Equal(t, name, r.name)
		assert.True(t, want(r), "%s: %+v", name, *r)
	}
	for _, name := range []string{"", ":authority", "x-request-ie", "content-type", long + "b", "X-Session-Id"} {
		assert.Equal(t, &h.roles[0], h.of(name), name)
	}
	assert.Equal(t, headerRole{conversation: -1}, h.roles[0], "no role: no field, nothing special")
}

func TestHeaderRolesWithoutConversations(t *testing.T) {
	h := newHeaderRoles(nil, []string{"x-session-id"}, false)
	assert.Equal(t, &h.roles[0], h.of("x-session-id"), "conversation affinity off: the header means nothing")
	assert.Equal(t, headPath, h.of(":path").field)
}

// readRequestHeaders walks the serialized map as the SDK's pairs read: each pair that
// fits, in order (the last value of a name wins; the query leaves the path), up to the
// first that does not; the final NUL may be missing.
func TestReadRequestHeadersWalksTheSerializedMap(t *testing.T) {
	cfg, err := config.ParseConfig([]byte(`{"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000"}]}},` +
		`"conversation":{"enabled":true,"headers":["x-session-id","x-chat-id"]}}`))
	require.NoError(t, err)
	p := &pluginContext{cfg: cfg, roles: newHeaderRoles(nil, cfg.Conversation.Headers, true)}
	read := func(m []byte) (requestHead, string) {
		c := &httpContext{plugin: p}
		h := c.readRequestHeaders(m)
		return *h, c.requestID
	}
	hs := [][2]string{{":method", "POST"}, {":path", "/v1/chat/completions?x=1"}, {":authority", ""},
		{"x-chat-id", "b"}, {"content-length", "4096"}, {"x-request-id", "r1"}, {"", ""},
		{"x-session-id", "a"}, {"x-request-id", "r2"}, {"x-chat-id", "c"}}
	m := serializeHeaderMap(hs)
	h, id := read(m)
	want := [headFields]string{headMethod: "POST", headPath: "/v1/chat/completions", headRequestID: "r2",
		headContentLength: "4096"}
	assert.Equal(t, want[headOther+1:], h.values[headOther+1:], "headOther is kept nowhere that is read")
	assert.Equal(t, "r2", id)
	assert.Equal(t, "a", h.conversation, "the first configured conversation header wins")

	// The pairs' bytes are at the map's end, each name and value NUL-terminated: the
	// last is x-chat-id: c, the one before it x-request-id: r2.
	last := len("x-chat-id") + 1 + len("c") + 1
	h, _ = read(m[:len(m)-1])
	assert.Equal(t, "a", h.conversation, "the last NUL missing: every pair still fits")
	h, id = read(m[:len(m)-last/2])
	assert.Equal(t, "r2", id, "the last pair cut: the pairs before it are read")
	assert.Equal(t, "a", h.conversation)
	h, id = read(m[:len(m)-last-len("2\x00")])
	assert.Equal(t, "r1", id, "the second x-request-id's value cut")
	assert.Equal(t, "a", h.conversation)
	for _, bad := range [][]byte{nil, m[:3], m[:4+8*len(hs)-1], {0xff, 0xff, 0xff, 0xff}} {
		h, id := read(bad)
		assert.Equal(t, requestHead{convRank: 2}, h)
		assert.Empty(t, id)
	}
	huge := append(serializeHeaderMap([][2]string{{":method", "GET"}}), 0)
	huge[4] = 0xff // a name length beyond the map
	h, _ = read(huge)
	assert.Empty(t, h.values[headMethod])
}
