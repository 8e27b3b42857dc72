package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
)

// Mooncake-format workloads of shapes the shipped traces do not have, to test the
// routing mechanisms on: `kvroute-replay -gen-shape <shape> [-o file] [-seed n]`. Each is
// deterministic for its seed; prompts are counted in 512-token blocks, and equal hash
// ids are a shared prefix, as in Mooncake's traces. Outputs are 50–400 tokens.
//
//   - bursts: a background of 5 requests/s (Poisson) with prompts of 500–4000 tokens
//     that share nothing, and every minute from 30 s on a burst of 80 requests within
//     2 s on one new prefix of 8–29 blocks (4096–14848 tokens), each request adding
//     100–600 tokens of its own; 10 minutes. A hot prefix, worth copying to several
//     targets at once.
//   - documents: 3 documents of 196 blocks (100352 tokens), 2500 questions of
//     50–500 tokens about one of them at 6/s (Poisson). A few huge shared prefixes.
//   - library: 6 documents of 150 blocks (76800 tokens), the k-th published at 60·k
//     s; 3000 questions of 50–500 tokens at 7/s (Poisson), each about one of the
//     documents published by then. Huge prefixes that arrive while the fleet is
//     busy, each asked about by many at once from its first question on.
//   - apps: 20 applications, each with a system prompt of 16 blocks (8192 tokens),
//     4000 one-shot questions of 100–1500 tokens at 10/s (Poisson); application k
//     is asked in proportion to 1/(k+1). Long shared prompts of uneven popularity,
//     without conversation ids.
//   - agents: 4 tool prompts of 8–20 blocks; sessions start at 2/s (Poisson) for
//     400 s, each on tool k in proportion to 1/(k+1), with 3–8 turns 2–10 s apart;
//     a turn adds 200–800 tokens, and the next turn's prompt holds this one's and its
//     answer. Agent loops: many conversations on a few shared prompts, without ids.

// shapeGen builds one workload: its random numbers, the next free hash id and the
// requests so far.
type shapeGen struct {
	rng  *chatRand        // every draw, so a seed gives the same bytes
	next uint64           // the next unused hash id
	out  []MooncakeRecord // the requests, in the order made (sorted by arrival at the end)
}

var shapes = map[string]func(g *shapeGen){
	"bursts":    (*shapeGen).bursts,
	"documents": (*shapeGen).documents,
	"library":   (*shapeGen).library,
	"apps":      (*shapeGen).apps,
	"agents":    (*shapeGen).agents,
}

// ids returns n new hash ids.
func (g *shapeGen) ids(n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = g.next
		g.next++
	}
	return out
}

// add appends a request at atS seconds whose prompt is prefix (whole blocks) and own
// tokens of its own.
func (g *shapeGen) add(atS float64, prefix []uint64, own int) {
	tokens := len(prefix)*MooncakeBlockTokens + own
	blocks := (tokens + MooncakeBlockTokens - 1) / MooncakeBlockTokens
	g.out = append(g.out, MooncakeRecord{
		Timestamp:    math.Round(atS * 1000),
		InputLength:  tokens,
		OutputLength: g.rng.uniform(50, 400),
		HashIDs:      append(append([]uint64(nil), prefix...), g.ids(blocks-len(prefix))...),
	})
}

func (g *shapeGen) bursts() {
	const durationS = 600
	for at := g.rng.exp(1.0 / 5); at < durationS; at += g.rng.exp(1.0 / 5) {
		g.add(at, nil, g.rng.uniform(500, 4000))
	}
	for start := 30.0; start < durationS; start += 60 {
		prefix := g.ids(g.rng.uniform(8, 29))
		for i := 0; i < 80; i++ {
			at := start + 2*float64(g.rng.next()>>11)/(1<<53)
			g.add(at, prefix, g.rng.uniform(100, 600))
		}
	}
}

func (g *shapeGen) documents() {
	docs := [][]uint64{g.ids(196), g.ids(196), g.ids(196)}
	at := 0.0
	for q := 0; q < 2500; q++ {
		at += g.rng.exp(1.0 / 6)
		g.add(at, docs[g.rng.next()%3], g.rng.uniform(50, 500))
	}
}

func (g *shapeGen) library() {
	docs := make([][]uint64, 6)
	for k := range docs {
		docs[k] = g.ids(150)
	}
	at := 0.0
	for q := 0; q < 3000; q++ {
		at += g.rng.exp(1.0 / 7)
		published := min(len(docs), int(at/60)+1)
		g.add(at, docs[g.rng.next()%uint64(published)], g.rng.uniform(50, 500))
	}
}

func (g *shapeGen) agents() {
	tools := make([][]uint64, 4)
	total := 0.0
	for k := range tools {
		tools[k] = g.ids(g.rng.uniform(8, 20))
		total += 1 / float64(k+1)
	}
	for start := g.rng.exp(1.0 / 2); start < 400; start += g.rng.exp(1.0 / 2) {
		u := float64(g.rng.next()>>11) / (1 << 53) * total
		k := 0
		for ; k < len(tools)-1; k++ {
			if u -= 1 / float64(k+1); u < 0 {
				break
			}
		}
		history, at := tools[k], start
		for turns := g.rng.uniform(3, 8); turns > 0; turns-- {
			tokens := len(history)*MooncakeBlockTokens + g.rng.uniform(200, 800)
			blocks := (tokens + MooncakeBlockTokens - 1) / MooncakeBlockTokens
			hashes := append(append([]uint64(nil), history...), g.ids(blocks-len(history))...)
			out := g.rng.uniform(50, 300)
			g.out = append(g.out, MooncakeRecord{Timestamp: math.Round(at * 1000), InputLength: tokens,
				OutputLength: out, HashIDs: hashes})
			// The next turn holds this prompt's full blocks and the answer.
			full := (tokens + out) / MooncakeBlockTokens
			history = append(hashes[:min(len(hashes), full):min(len(hashes), full)], g.ids(max(0, full-len(hashes)))...)
			at += 2 + 8*float64(g.rng.next()>>11)/(1<<53)
		}
	}
}

func (g *shapeGen) apps() {
	const apps = 20
	prompts := make([][]uint64, apps)
	total := 0.0
	for k := range prompts {
		prompts[k] = g.ids(16)
		total += 1 / float64(k+1)
	}
	at := 0.0
	for q := 0; q < 4000; q++ {
		at += g.rng.exp(1.0 / 10)
		u := float64(g.rng.next()>>11) / (1 << 53) * total
		k := 0
		for ; k < apps-1; k++ {
			if u -= 1 / float64(k+1); u < 0 {
				break
			}
		}
		g.add(at, prompts[k], g.rng.uniform(100, 1500))
	}
}

// writeShape writes the workload of shape for seed, in arrival order.
func writeShape(w io.Writer, shape string, seed uint64) error {
	gen, ok := shapes[shape]
	if !ok {
		return fmt.Errorf("unknown shape %q (bursts, documents, library, apps, agents)", shape)
	}
	g := &shapeGen{rng: &chatRand{s: seed}}
	gen(g)
	sort.SliceStable(g.out, func(i, j int) bool { return g.out[i].Timestamp < g.out[j].Timestamp })
	return writeJSONLines(w, g.out)
}

// shapeMain is `kvroute-replay -gen-shape <shape> [-o file] [-seed n]`: it writes the
// workload and returns the exit code.
func shapeMain(args []string) int {
	if len(args) == 0 || args[0] == "" || args[0][0] == '-' {
		fmt.Fprintln(os.Stderr, "usage: kvroute-replay -gen-shape bursts|documents|library|apps|agents [-o file] [-seed n]")
		return 2
	}
	shape := args[0]
	fs := flag.NewFlagSet("kvroute-replay -gen-shape", flag.ContinueOnError)
	out := fs.String("o", "build/"+shape+".jsonl", "write the trace here")
	seed := fs.Uint64("seed", 1, "seed")
	if err := fs.Parse(args[1:]); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if err := writeFile(*out, func(w io.Writer) error { return writeShape(w, shape, *seed) }); err != nil {
		fmt.Fprintln(os.Stderr, "kvroute-replay -gen-shape:", err)
		return 1
	}
	fmt.Printf("wrote %s: %s, seed %d\n", *out, shape, *seed)
	return 0
}
