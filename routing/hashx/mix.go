package hashx

// Mix64 is the splitmix64 finaliser: a fast, well-spread bijection of 64-bit values.
// kvroute uses it wherever two fingerprints are combined into a pseudo-random rank
// (rendezvous hashing, the seeded tie-break), so every replica computes the same one.
func Mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// RendezvousScore is the highest-random-weight score of target for key.
func RendezvousScore(key, target uint64) uint64 { return Mix64(key ^ Mix64(target)) }
