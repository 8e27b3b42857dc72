package main

// headerRole is what a request header's name means to the filter.
type headerRole struct {
	name          string
	method, path  bool
	requestID     bool
	contentLength bool
	owned         []int // indices into pluginContext.owned: stripped from every request
	conversation  int   // index into conversation.headers, or -1
}

// headerRoles finds a header name's role: a request looks up each header it carries,
// and most have no role.
type headerRoles struct {
	names nameTable    // name → index into roles
	roles []headerRole // by index
}

func newHeaderRoles(owned []string, conversation []string, conversationOn bool) *headerRoles {
	h := &headerRoles{}
	role := func(name string) *headerRole {
		if i := h.names.find(name); i >= 0 {
			return &h.roles[i]
		}
		h.names.add(name, len(h.roles))
		h.roles = append(h.roles, headerRole{name: name, conversation: -1})
		return &h.roles[len(h.roles)-1]
	}
	role(":method").method = true
	role(":path").path = true
	role("x-request-id").requestID = true
	role("content-length").contentLength = true
	for i, name := range owned {
		r := role(name)
		r.owned = append(r.owned, i)
	}
	if conversationOn {
		for i, name := range conversation {
			if r := role(name); r.conversation < 0 {
				r.conversation = i // a name listed twice keeps its first rank
			}
		}
	}
	return h
}

// of returns the role of a header name, or nil.
func (h *headerRoles) of(name string) *headerRole {
	if i := h.names.find(name); i >= 0 {
		return &h.roles[i]
	}
	return nil
}
