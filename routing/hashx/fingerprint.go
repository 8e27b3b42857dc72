// Package hashx holds the stable hashes that kvroute's state is keyed and ranked by. Every
// VM and every gateway replica must compute them alike, without sharing state, for their
// views of the fleet to agree; keeping them in one small package makes that contract one
// place to read and leaves the hash choice out of the router's logic.
package hashx

import "github.com/cespare/xxhash/v2"

// Fingerprint is the stable 64-bit hash kvroute keeps in place of a client-chosen
// value (conversation ids, request ids). It is the same on every VM and every
// gateway replica, so replicas agree without sharing state.
func Fingerprint(b []byte) uint64 { return xxhash.Sum64(b) }

// FingerprintString is Fingerprint for a string, without copying it.
func FingerprintString(s string) uint64 { return xxhash.Sum64String(s) }
