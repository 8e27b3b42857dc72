package main

import (
	"container/list"
	"strconv"
)

// trtllmConversation is TensorRT-LLM's ConversationRouter (github.com/NVIDIA/
// TensorRT-LLM, tensorrt_llm/serve/router.py, class ConversationRouter with its
// defaults match_threshold 0.75, tokens_per_block 128, use_token_ids False,
// hash_skip_count 0, max_sessions 100000). Its routing priority:
//
//  1. An explicit conversation_id already in the session table: sticky to the
//     server recorded for it (no overload gate), and the session's block hashes
//     become this request's.
//  2. No explicit id: implicit block-hash prefix matching. The text (chat: role:content
//     lines) is turned into code points, the last one left out, and hashed as a
//     chain in blocks of tokens_per_block; a trie maps hash paths to sessions. The
//     deepest node with a live session gives the match; if depth / blocks ≥
//     match_threshold the request is a continuation of that session: same server,
//     and the session now holds this request's hashes.
//  3. Otherwise the least-loaded server, load being the content weight in flight
//     (blocks × tokens_per_block per request, released when it finishes), a
//     round-robin counter breaking ties; a new session (the explicit id, or an
//     implicit one) records the server and hashes, LRU-bounded by max_sessions.
//
// Modelling choice: where several live sessions sit on the deepest node the most
// recently updated one is taken (Python's set order is arbitrary).
type trtllmConversation struct {
	matchThreshold float64
	tokensPerBlock int
	maxSessions    int

	sessions map[string]*trtSession
	order    *list.List // session ids, least recent first
	trie     map[uint64]map[string]struct{}
	load     []int       // content load per server
	weights  map[int]int // request index → weight in flight
	rr       int
	implicit int
	clock    uint64
}

type trtSession struct {
	server int
	hashes []uint64
	elem   *list.Element
	stamp  uint64
}

func newTRTLLMConversation(n int) *trtllmConversation {
	return &trtllmConversation{
		matchThreshold: 0.75, tokensPerBlock: 128, maxSessions: 100000,
		sessions: map[string]*trtSession{}, order: list.New(), trie: map[uint64]map[string]struct{}{},
		load: make([]int, n), weights: map[int]int{},
	}
}

func (p *trtllmConversation) Name() string { return "trtllm-conversation" }

func (p *trtllmConversation) Choose(r *Request, f *Fleet) int {
	hashes := r.Chain128
	weight := len(hashes) * p.tokensPerBlock
	if weight == 0 {
		weight = max(r.TextLen/5, 1) // CHAR_PER_TOKEN = 5 when there is nothing to hash
	}
	server := -1
	conv := r.Conversation
	if conv != "" {
		if s, ok := p.sessions[conv]; ok {
			server = s.server // 1. sticky
		}
	} else if id := p.findMatchingSession(hashes); id != "" {
		conv, server = id, p.sessions[id].server // 2. implicit continuation
	}
	if server >= f.N() {
		server = -1 // its server left the fleet: placed afresh
	}
	if server < 0 { // 3. least loaded, new session
		server = p.leastLoaded(f.N())
		if conv == "" {
			p.implicit++
			conv = "conv_id:0_" + strconv.Itoa(p.implicit)
		}
	}
	p.updateSession(conv, server, hashes)
	p.load[server] += weight
	p.weights[r.Index] = weight
	return server
}

func (p *trtllmConversation) Done(r *Request, server int) {
	if w, ok := p.weights[r.Index]; ok {
		p.load[server] = max(p.load[server]-w, 0)
		delete(p.weights, r.Index)
	}
}

// findMatchingSession walks the trie along hashes and returns the session of the
// deepest match if it covers at least matchThreshold of the blocks.
func (p *trtllmConversation) findMatchingSession(hashes []uint64) string {
	if len(hashes) == 0 {
		return ""
	}
	best, depth := "", 0
	for d, h := range hashes {
		node, ok := p.trie[h]
		if !ok {
			break
		}
		var stamp uint64
		found := ""
		for id := range node {
			if s := p.sessions[id]; s != nil && (found == "" || s.stamp > stamp) {
				found, stamp = id, s.stamp
			}
		}
		if found != "" {
			best, depth = found, d+1
		}
	}
	if best == "" || float64(depth)/float64(len(hashes)) < p.matchThreshold {
		return ""
	}
	return best
}

func (p *trtllmConversation) leastLoaded(n int) int {
	var tied []int
	low := -1
	for s, l := range p.load[:n] {
		switch {
		case low < 0 || l < low:
			low, tied = l, append(tied[:0], s)
		case l == low:
			tied = append(tied, s)
		}
	}
	s := tied[p.rr%len(tied)]
	p.rr++
	return s
}

func (p *trtllmConversation) updateSession(id string, server int, hashes []uint64) {
	p.clock++
	if old, ok := p.sessions[id]; ok {
		p.trieRemove(id, old.hashes)
		old.server, old.hashes, old.stamp = server, hashes, p.clock
		p.order.MoveToBack(old.elem)
	} else {
		p.sessions[id] = &trtSession{server: server, hashes: hashes, elem: p.order.PushBack(id), stamp: p.clock}
	}
	for _, h := range hashes {
		node, ok := p.trie[h]
		if !ok {
			node = map[string]struct{}{}
			p.trie[h] = node
		}
		node[id] = struct{}{}
	}
	for len(p.sessions) > p.maxSessions {
		oldest := p.order.Front()
		oid := oldest.Value.(string)
		p.trieRemove(oid, p.sessions[oid].hashes)
		delete(p.sessions, oid)
		p.order.Remove(oldest)
	}
}

func (p *trtllmConversation) trieRemove(id string, hashes []uint64) {
	for _, h := range hashes {
		if node, ok := p.trie[h]; ok {
			delete(node, id)
			if len(node) == 0 {
				delete(p.trie, h)
			}
		}
	}
}
