package extract

// API is the OpenAI-compatible endpoint a request was sent to.
type API int

const (
	APIUnknown API = iota
	APIChatCompletions
	APICompletions
	APIResponses
)

// APIForPath maps a request path (query string already removed) to its API.
func APIForPath(path string) API {
	switch path {
	case "/v1/chat/completions":
		return APIChatCompletions
	case "/v1/completions":
		return APICompletions
	case "/v1/responses":
		return APIResponses
	}
	return APIUnknown
}

// Request is what the decision needs to know about one inference request. Only
// fingerprints of client-chosen ids are kept, never the ids themselves.
type Request struct {
	Model  string
	Stream bool

	// Conversation is the 64-bit fingerprint of the explicit conversation id;
	// HasConversation says whether there was one.
	Conversation    uint64
	HasConversation bool

	// Prompt is the canonical prompt (docs/behaviour.md, Reading the request) that prefix
	// blocks are hashed over. For text it is the canonical text; for token-id prompts each
	// id is written as 4 little-endian bytes. BlockBytes is the size of one prefix block
	// in Prompt.
	Prompt     []byte
	BlockBytes int

	// Tokens is the token estimate of the whole request.
	Tokens int

	// Identity seeds the tie-break shuffle and derived values: the x-request-id
	// header's fingerprint, else a fingerprint of the body.
	Identity uint64
}
