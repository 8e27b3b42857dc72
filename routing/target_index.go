package routing

import "math/bits"

// targetIndex maps target ids to their position in a pool. It is open addressing
// over a power-of-two table at most half full: a decision asks it dozens of times,
// and a Go map lookup costs several times as much in wasm.
type targetIndex struct {
	keys  []uint64
	pos   []int32 // -1: empty
	shift uint
}

func newTargetIndex(n int) targetIndex {
	size := 1 << bits.Len(uint(2*n+1)) // > 2n: at most half full
	x := targetIndex{keys: make([]uint64, size), pos: make([]int32, size), shift: uint(64 - bits.Len(uint(size-1)))}
	for i := range x.pos {
		x.pos[i] = -1
	}
	return x
}

func (x *targetIndex) slot(key uint64) int {
	return int((key * 0x9e3779b97f4a7c15) >> x.shift)
}

// put maps key to i; a key already present keeps its first position.
func (x *targetIndex) put(key uint64, i int) {
	mask := len(x.keys) - 1
	for s := x.slot(key); ; s = (s + 1) & mask {
		if x.pos[s] < 0 {
			x.keys[s], x.pos[s] = key, int32(i)
			return
		}
		if x.keys[s] == key {
			return
		}
	}
}

// get returns key's position, or -1.
func (x *targetIndex) get(key uint64) int {
	mask := len(x.keys) - 1
	for s := x.slot(key); ; s = (s + 1) & mask {
		switch {
		case x.pos[s] < 0:
			return -1
		case x.keys[s] == key:
			return int(x.pos[s])
		}
	}
}
