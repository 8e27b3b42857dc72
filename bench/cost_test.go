package bench

import (
	"fmt"
	"testing"
)

// ticksEvery is how many requests one tick (100 ms) serves at 1000 requests/s per VM:
// kvroute's per-request cost includes that share of the tick's work.
const ticksEvery = 100

// BenchmarkCostRatio is SPEC §10's first bar: the per-request cost of the compiled
// kvroute over the floor filter, both measured in this one run, at each body size.
func BenchmarkCostRatio(b *testing.B) {
	for _, size := range []struct {
		name  string
		bytes int
	}{{"4KiB", 4 << 10}, {"64KiB", 64 << 10}, {"256KiB", 256 << 10}, {"1MiB", 1 << 20}} {
		bodies := chatBodies(size.bytes, 32, int64(size.bytes))
		b.Run(size.name, func(b *testing.B) {
			b.SetBytes(int64(size.bytes))
			floor := start(b, "floor", "")
			floorNs := perRequest(floor, b.N, func(i int) { floor.exchange("/v1/chat/completions", bodies[i%len(bodies)]) })
			floor.close()
			kv := start(b, "kvroute", fleetConfig(4, 2))
			kvNs := perRequest(kv, b.N, func(i int) {
				kv.exchange("/v1/chat/completions", bodies[i%len(bodies)])
				if i%ticksEvery == ticksEvery-1 {
					kv.Tick() // its share of the housekeeping, as at 1000 requests/s a VM
				}
			})
			kv.close()
			b.ReportMetric(floorNs, "floor-ns/req")
			b.ReportMetric(kvNs, "kvroute-ns/req")
			b.ReportMetric(kvNs/floorNs, "ratio")
		})
	}
}

// BenchmarkLiveConversations compares a sticky turn's cost with 10 and with 100 000
// live conversations in the table (SPEC §10: ≤ 1.2×).
func BenchmarkLiveConversations(b *testing.B) {
	body := chatBodies(4<<10, 1, 1)[0]
	for _, live := range []int{10, 100_000} {
		b.Run(fmt.Sprint(live), func(b *testing.B) {
			kv := start(b, "kvroute", fleetConfig(4, 2))
			defer kv.close()
			small := []byte(`{"model":"llama","messages":[{"role":"user","content":"hi"}]}`)
			for i := 0; i < live; i++ {
				kv.exchange("/v1/chat/completions", small, [2]string{"x-session-id", fmt.Sprint("conv-", i)})
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				kv.exchange("/v1/chat/completions", body, [2]string{"x-session-id", fmt.Sprint("conv-", (i*7919)%live)})
			}
		})
	}
}

// BenchmarkFleetSize compares an anonymous request's cost on 4 and 64 targets
// (SPEC §10: ≤ 1.5×).
func BenchmarkFleetSize(b *testing.B) {
	bodies := chatBodies(4<<10, 32, 2)
	for _, targets := range []int{4, 64} {
		b.Run(fmt.Sprint(targets), func(b *testing.B) {
			kv := start(b, "kvroute", fleetConfig(targets/2, 2))
			defer kv.close()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				kv.exchange("/v1/chat/completions", bodies[i%len(bodies)])
			}
		})
	}
}
