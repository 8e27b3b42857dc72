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

// headerRoles finds a header name's role by its length first: most headers a request
// carries have no role, and most have a length no role has, so a header costs one
// table read and at most a comparison or two — not one against every name the
// filter knows (a dozen string comparisons a header were a sizeable part of reading
// the headers in wasm).
type headerRoles struct {
	byLen [64][]headerRole
	long  []headerRole // names of 64 bytes or more
}

func newHeaderRoles(owned []string, conversation []string, conversationOn bool) *headerRoles {
	h := &headerRoles{}
	role := func(name string) *headerRole {
		list := &h.long
		if len(name) < len(h.byLen) {
			list = &h.byLen[len(name)]
		}
		for i := range *list {
			if (*list)[i].name == name {
				return &(*list)[i]
			}
		}
		*list = append(*list, headerRole{name: name, conversation: -1})
		return &(*list)[len(*list)-1]
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
	list := h.long
	if len(name) < len(h.byLen) {
		list = h.byLen[len(name)]
	}
	for i := range list {
		if list[i].name == name {
			return &list[i]
		}
	}
	return nil
}
