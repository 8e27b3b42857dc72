package main

import (
	"encoding/binary"
	"runtime"
	"sync"

	"github.com/kvroute/kvroute/routing/hashx"
)

// Request is one replayed inference request, as every policy and the fleet model
// see it.
type Request struct {
	Index     int     // position in the trace
	ArrivalMS float64 // arrival time in ms, after -speed compression

	Path    string      // the OpenAI endpoint, e.g. /v1/completions
	Model   string      // the model name, for the prefix hashes that include it
	Headers [][2]string // extra request headers (e.g. a conversation id header)
	// Conversation is the explicit conversation id the client sent, "" if none. The
	// baselines that honour one read it here; kvroute reads it from Headers or the body.
	Conversation string

	InputTokens  int
	OutputTokens int

	// Blocks are the request's KV-cache blocks for hit accounting, in prompt order:
	// equal keys mean equal prefixes (a key covers every block before it), as Mooncake's
	// hash_ids do. Each block holds BlockTokens tokens (the last may hold fewer).
	Blocks      []uint64
	BlockTokens int

	// text returns the canonical prompt text (what the routers hash); body returns
	// the HTTP request body. Both are regenerated on demand so a large trace never
	// holds every prompt in memory at once.
	text func() []byte
	body func() []byte

	// Filled by prepare from the text.
	TextLen  int      // bytes of canonical prompt text
	Chain64  []uint64 // chain hashes of the 64-byte chunks of the text, a trailing partial chunk included
	Partial  bool     // the text length is not a multiple of 64: Chain64's last hash is of a partial chunk
	Chain128 []uint64 // TensorRT-LLM's 128-code-point blocks over text[:len-1], the last one partial
	FirstKey uint64   // hash of the first 512-token block of text (consistent hashing's key)
}

// Full64 returns the chain hashes of the full 64-byte chunks only.
func (r *Request) Full64() []uint64 {
	if r.Partial {
		return r.Chain64[:len(r.Chain64)-1]
	}
	return r.Chain64
}

// Text returns the canonical prompt text.
func (r *Request) Text() []byte { return r.text() }

// Body returns the HTTP body sent to kvroute.
func (r *Request) Body() []byte { return r.body() }

// keepBodies makes each request keep its body once built, for runs that send every
// body many times (draws, speeds): memory for time.
func keepBodies(reqs []*Request) {
	for _, r := range reqs {
		build := r.body
		var once sync.Once
		var b []byte
		r.body = func() []byte {
			once.Do(func() { b = build() })
			return b
		}
	}
}

// prepare computes the derived hashes of every request, in parallel.
func prepare(reqs []*Request, firstBlockBytes int) {
	var wg sync.WaitGroup
	work := make(chan *Request, 64)
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range work {
				r.prepareOne(firstBlockBytes)
			}
		}()
	}
	for _, r := range reqs {
		work <- r
	}
	close(work)
	wg.Wait()
}

func (r *Request) prepareOne(firstBlockBytes int) {
	t := r.text()
	r.TextLen = len(t)
	r.Chain64 = chainHashes(t, 64, true, r.Model)
	r.Partial = len(t)%64 != 0
	if len(t) > 1 {
		// TensorRT-LLM leaves the last token out of the block keys (router.py,
		// _compute_block_hashes: "the last token is not included in the block key").
		r.Chain128 = chainHashes(t[:len(t)-1], 128, true, "")
	}
	r.FirstKey = hashBytes(0x6b76726f757465, t[:min(len(t), firstBlockBytes)])
}

// chainHashes hashes text in chunks of size bytes as one chain: each chunk's hash
// covers every chunk before it and the seed string. With partial, a trailing partial
// chunk gets a hash too.
func chainHashes(text []byte, size int, partial bool, seed string) []uint64 {
	n := len(text) / size
	if partial && len(text)%size != 0 {
		n++
	}
	out := make([]uint64, 0, n)
	prev := hashBytes(0x9e3779b97f4a7c15, []byte(seed))
	for i := 0; i < n; i++ {
		end := min((i+1)*size, len(text))
		prev = hashBytes(prev, text[i*size:end])
		out = append(out, prev)
	}
	return out
}

// hashBytes is a fast deterministic 64-bit hash of b, seeded: 8 bytes at a time
// through the splitmix64 finaliser. Runs and tests give the same values everywhere.
func hashBytes(seed uint64, b []byte) uint64 {
	h := seed ^ uint64(len(b))*0xff51afd7ed558ccd
	for len(b) >= 8 {
		h = hashx.Mix64(h ^ binary.LittleEndian.Uint64(b))
		b = b[8:]
	}
	if len(b) > 0 {
		var tail [8]byte
		copy(tail[:], b)
		h = hashx.Mix64(h ^ binary.LittleEndian.Uint64(tail[:]) ^ uint64(len(b))<<59)
	}
	return hashx.Mix64(h)
}

func hashString(seed uint64, s string) uint64 { return hashBytes(seed, []byte(s)) }

// vocabulary for synthetic prompt text: plain lower-case words, so the text needs no
// JSON escaping and splits into tokens at about chars_per_token = 4.
var vocabulary = []string{
	"the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with",
	"be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which",
	"but", "have", "an", "had", "they", "you", "were", "their", "one", "all", "we",
	"can", "her", "has", "there", "been", "if", "more", "when", "will", "would", "who",
	"so", "no", "model", "cache", "token", "prefix", "request", "router", "server",
	"block", "memory", "latency", "batch", "queue", "kernel", "tensor", "layer",
	"attention", "decode", "prefill", "context", "window", "answer", "question",
	"system", "user", "assistant", "document", "section", "chapter", "table", "value",
	"number", "result", "report", "summary", "example", "function", "variable",
	"return", "string", "error", "input", "output", "format", "record", "field",
}

// fillWords writes deterministic pseudo-random words seeded by seed into dst,
// filling it completely (the last word is cut).
func fillWords(dst []byte, seed uint64) {
	state := hashx.Mix64(seed + 0x9e3779b97f4a7c15)
	i := 0
	for i < len(dst) {
		state += 0x9e3779b97f4a7c15
		r := hashx.Mix64(state)
		for k := 0; k < 4 && i < len(dst); k++ {
			w := vocabulary[int(r&0xffff)%len(vocabulary)]
			r >>= 16
			i += copy(dst[i:], w)
			if i < len(dst) {
				dst[i] = ' '
				i++
			}
		}
	}
}
