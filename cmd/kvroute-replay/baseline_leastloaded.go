package main

// leastLoaded sends each request to the target with the fewest outstanding
// requests (join-the-shortest-queue; Envoy LEAST_REQUEST with full scan, SGLang
// router's "shortest queue" fallback), round-robin among ties so an idle fleet is
// filled evenly. Blind to the cache.
type leastLoaded struct{ rr int }

func newLeastLoaded() *leastLoaded { return &leastLoaded{} }

func (p *leastLoaded) Name() string { return "least-loaded" }

func (p *leastLoaded) Choose(_ *Request, f *Fleet) int {
	var ties []int
	low := -1
	for i := 0; i < f.N(); i++ {
		switch l := f.InFlight(i); {
		case low < 0 || l < low:
			low, ties = l, append(ties[:0], i)
		case l == low:
			ties = append(ties, i)
		}
	}
	t := ties[p.rr%len(ties)]
	p.rr++
	return t
}

func (p *leastLoaded) Done(*Request, int) {}
