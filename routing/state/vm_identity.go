package state

import (
	"github.com/kvroute/kvroute/routing/hashx"
	"sync/atomic"
)

// nextVMIdentity is where every identity a VM shows in shared state comes from: its
// prefix journals' slots and its scrape and discovery leases. The filter seeds it
// from a random source at VM start; tests and tools may leave it, and a counter then
// tells their Routers apart.
var nextVMIdentity atomic.Uint64

// SetVMIdentitySeed seeds the identities made after it.
func SetVMIdentitySeed(seed uint64) {
	if seed != 0 {
		nextVMIdentity.Store(seed)
	}
}

// NewVMIdentity returns a fresh identity, never 0 (0 marks a free journal slot).
func NewVMIdentity() uint64 {
	return hashx.Mix64(nextVMIdentity.Add(0x9e3779b97f4a7c15)) | 1
}
