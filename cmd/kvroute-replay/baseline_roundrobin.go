package main

// roundRobin sends request k to target k mod n, blind to load and cache: the
// default of most HTTP load balancers (Envoy ROUND_ROBIN, SGLang's and vLLM's
// router --policy round_robin).
type roundRobin struct{ next int }

func newRoundRobin() *roundRobin { return &roundRobin{} }

func (p *roundRobin) Name() string { return "round-robin" }

func (p *roundRobin) Choose(_ *Request, f *Fleet) int {
	t := p.next % f.N()
	p.next++
	return t
}

func (p *roundRobin) Done(*Request, int) {}
