package main

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

// BenchmarkRequestGoPlugin runs whole requests through the Go plugin (no wasm), to
// profile the filter's own work: go test ./filter -bench RequestGoPlugin -cpuprofile.
func BenchmarkRequestGoPlugin(b *testing.B) {
	for _, size := range []int{4 << 10, 256 << 10} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			rng := rand.New(rand.NewSource(1))
			var bodies []string
			for i := 0; i < 32; i++ {
				var sb strings.Builder
				for sb.Len() < size {
					fmt.Fprintf(&sb, "w%d ", rng.Intn(1<<20))
				}
				bodies = append(bodies, chat(sb.String()))
			}
			h := startHost(b, &vmContext{}, threeEndpoints)
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				id, _ := h.send(post("/v1/chat/completions", bodies[i%len(bodies)]))
				h.respond(id, 200)
			}
		})
	}
}

var _ = types.ActionContinue
