package main

// LRU is a least-recently-used set of 64-bit keys (KV-cache block keys, prefix
// hashes). Capacity <= 0 means unbounded.
type LRU struct {
	capacity int
	index    map[uint64]int32
	nodes    []lruNode
	free     []int32
	head     int32 // most recent, -1 when empty
	tail     int32 // least recent
	clock    uint64
}

type lruNode struct {
	key        uint64
	stamp      uint64 // clock at the last touch
	prev, next int32
}

// NewLRU returns an empty LRU holding at most capacity keys (<= 0: unbounded).
func NewLRU(capacity int) *LRU {
	return &LRU{capacity: capacity, index: map[uint64]int32{}, head: -1, tail: -1}
}

// Len is the number of keys held.
func (c *LRU) Len() int { return len(c.index) }

// Capacity is the most keys held (<= 0: unbounded).
func (c *LRU) Capacity() int { return c.capacity }

// Contains reports whether key is held, without touching it.
func (c *LRU) Contains(key uint64) bool {
	_, ok := c.index[key]
	return ok
}

// Stamp returns when key was last touched (a counter that grows with every touch).
func (c *LRU) Stamp(key uint64) (uint64, bool) {
	i, ok := c.index[key]
	if !ok {
		return 0, false
	}
	return c.nodes[i].stamp, true
}

// Touch makes key the most recent, inserting it (and evicting the least recent key
// beyond capacity) if absent. It returns the evicted key, if any.
func (c *LRU) Touch(key uint64) (evicted uint64, didEvict bool) {
	c.clock++
	if i, ok := c.index[key]; ok {
		c.nodes[i].stamp = c.clock
		c.moveToFront(i)
		return 0, false
	}
	if c.capacity > 0 && len(c.index) >= c.capacity {
		evicted, didEvict = c.nodes[c.tail].key, true
		c.Remove(evicted)
	}
	var i int32
	if n := len(c.free); n > 0 {
		i, c.free = c.free[n-1], c.free[:n-1]
	} else {
		c.nodes = append(c.nodes, lruNode{})
		i = int32(len(c.nodes) - 1)
	}
	c.nodes[i] = lruNode{key: key, stamp: c.clock, prev: -1, next: c.head}
	if c.head >= 0 {
		c.nodes[c.head].prev = i
	}
	c.head = i
	if c.tail < 0 {
		c.tail = i
	}
	c.index[key] = i
	return evicted, didEvict
}

// Remove drops key if held.
func (c *LRU) Remove(key uint64) {
	i, ok := c.index[key]
	if !ok {
		return
	}
	c.unlink(i)
	delete(c.index, key)
	c.free = append(c.free, i)
}

func (c *LRU) unlink(i int32) {
	n := &c.nodes[i]
	if n.prev >= 0 {
		c.nodes[n.prev].next = n.next
	} else {
		c.head = n.next
	}
	if n.next >= 0 {
		c.nodes[n.next].prev = n.prev
	} else {
		c.tail = n.prev
	}
	n.prev, n.next = -1, -1
}

func (c *LRU) moveToFront(i int32) {
	if c.head == i {
		return
	}
	c.unlink(i)
	c.nodes[i].next = c.head
	if c.head >= 0 {
		c.nodes[c.head].prev = i
	}
	c.head = i
	if c.tail < 0 {
		c.tail = i
	}
}

// PrefixHits counts the keys held from the start of keys up to the first one that
// is not: a KV cache reuses a prefix only.
func (c *LRU) PrefixHits(keys []uint64) int {
	for i, k := range keys {
		if !c.Contains(k) {
			return i
		}
	}
	return len(keys)
}

// Serve is a request passing through a KV cache: it counts the prefix hits, then
// holds every block of the request. Blocks are touched from the last to the first,
// so under pressure a prompt's tail blocks go before its head (vLLM frees a finished
// request's blocks tail first for the same reason).
func (c *LRU) Serve(keys []uint64) (hits int) {
	hits = c.PrefixHits(keys)
	for i := len(keys) - 1; i >= 0; i-- {
		c.Touch(keys[i])
	}
	return hits
}
