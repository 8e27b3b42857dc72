package main

// headerRole is what a request header's name means to the filter.
type headerRole struct {
	name         string
	field        headField // the requestHead value the header gives (headOther: none)
	owned        []int     // indices into pluginContext.owned: stripped from every request
	conversation int       // index into conversation.headers, or -1
	special      bool      // owned or a conversation header: looked at out of line
}

// headField is which value of a requestHead a header gives.
type headField uint8

const (
	headOther headField = iota // none: the value is kept nowhere that is read
	headMethod
	headPath
	headRequestID
	headContentLength
	headFields
)

// headerRoles finds a header name's role: a request looks up each header it carries,
// and most have no role.
type headerRoles struct {
	names nameTable    // name → index into roles (from 1)
	roles []headerRole // by index; [0] is the role of every other name (none)
}

func newHeaderRoles(owned []string, conversation []string, conversationOn bool) *headerRoles {
	h := &headerRoles{roles: []headerRole{{conversation: -1}}}
	role := func(name string) *headerRole {
		if i := h.names.find(name); i >= 0 {
			return &h.roles[i]
		}
		h.names.add(name, len(h.roles))
		h.roles = append(h.roles, headerRole{name: name, conversation: -1})
		return &h.roles[len(h.roles)-1]
	}
	role(":method").field = headMethod
	role(":path").field = headPath
	role("x-request-id").field = headRequestID
	role("content-length").field = headContentLength
	for i, name := range owned {
		r := role(name)
		r.owned = append(r.owned, i)
		r.special = true
	}
	if conversationOn {
		for i, name := range conversation {
			if r := role(name); r.conversation < 0 {
				r.conversation = i // a name listed twice keeps its first rank
				r.special = true
			}
		}
	}
	return h
}

// of returns the role of a header name: roles[0], none, for a name without one.
func (h *headerRoles) of(name string) *headerRole {
	return &h.roles[max(h.names.find(name), 0)]
}
