package routing

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/routing/extract"
	"github.com/kvroute/kvroute/routing/state"
)

// BenchmarkRequestPath is one request's routing work at 4 KiB: extraction, the
// decision (prefix index, ledger, health) and the release, over an in-memory store.
// Run it in wasm too: GOOS=wasip1 GOARCH=wasm go test -c, then any WASI runtime.
func BenchmarkRequestPath(b *testing.B) {
	cfg := testConfig(b, "")
	r := NewRouter(cfg, state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	rng := rand.New(rand.NewSource(1))
	var bodies [][]byte
	for i := 0; i < 32; i++ {
		var sb strings.Builder
		for sb.Len() < 4000 {
			fmt.Fprintf(&sb, "w%d ", rng.Intn(1<<20))
		}
		bodies = append(bodies, []byte(`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"`+sb.String()+`"}]}`))
	}
	opt := extract.ExtractOptions{CharsPerToken: 4, BlockTokens: 16}
	var req extract.Request
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req = extract.Request{Prompt: req.Prompt[:0], Identity: uint64(i)}
		_ = extract.Extract(extract.APIChatCompletions, bodies[i%len(bodies)], opt, &req)
		d := r.Decide(&req, NoRank)
		_ = r.Release(d.Ticket)
	}
}
