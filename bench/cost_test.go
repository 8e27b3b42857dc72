package bench

import (
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
)

// ticksEvery is how many requests one tick (100 ms) serves at 1000 requests/s per VM:
// kvroute's per-request cost includes that share of the tick's work.
const ticksEvery = 100

// costRounds interleaves the two filters: round r runs a batch through the floor,
// then one through kvroute, so drift on a shared machine (other jobs, the guest
// heap's growth) falls on both alike; the reported figures are the medians of the
// per-batch means.
const costRounds = 9

// costConversations is how many conversations the cost benchmark's stream
// interleaves (see conversationTurns).
const costConversations = 32

// BenchmarkCostRatio is the first cost bar: the per-request cost of the compiled
// kvroute over the floor filter, both measured in this one run, at each body size.
// Each size gets freshly compiled modules, so a guest heap grown by one size does
// not weigh on the next. Both filters see the same stream of conversation turns.
func BenchmarkCostRatio(b *testing.B) {
	for _, size := range []struct {
		name  string
		bytes int
	}{{"4KiB", 4 << 10}, {"64KiB", 64 << 10}, {"256KiB", 256 << 10}, {"1MiB", 1 << 20}} {
		// Distinct turns, within 64 MiB of bodies: 4 KiB requests never repeat, 1 MiB
		// ones repeat after 64.
		bodies := conversationTurns(size.bytes, costConversations, min(16384, (64<<20)/size.bytes))
		b.Run(size.name, func(b *testing.B) {
			b.SetBytes(int64(size.bytes))
			floorVM, kvVM := freshVM(b, "floor"), freshVM(b, "kvroute")
			defer floorVM.Close()
			defer kvVM.Close()
			batch := max(1, b.N/costRounds)
			if size.bytes >= 1<<20 {
				// The floor's guest runs out of memory after about 2 000 requests of
				// 1 MiB (gjson copies every body into a string): keep well below.
				batch = min(batch, 100)
			}
			var floorNs, kvNs []float64
			for r := 0; r < costRounds; r++ {
				start := r * (costConversations + batch)
				runFloor := func() {
					floor := startOn(b, floorVM, "")
					floorNs = append(floorNs, floor.warmThenTime(bodies, costConversations, start, batch, false))
					floor.close()
				}
				runKV := func() {
					kv := startOn(b, kvVM, fleetConfig(4, 2))
					kvNs = append(kvNs, kv.warmThenTime(bodies, costConversations, start, batch, true))
					kv.close()
				}
				// The order alternates: whatever the batch before leaves behind (the
				// host's garbage, a colder cache) falls on both filters alike.
				if r%2 == 0 {
					runFloor()
					runKV()
				} else {
					runKV()
					runFloor()
				}
			}
			f, k := median(floorNs), median(kvNs)
			b.ReportMetric(f, "floor-ns/req")
			b.ReportMetric(k, "kvroute-ns/req")
			b.ReportMetric(k/f, "ratio")
		})
	}
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// freshVM compiles build/<name>.wasm anew.
func freshVM(tb testing.TB, name string) proxytest.WasmVMContext {
	bin, err := os.ReadFile("../build/" + name + ".wasm")
	if err != nil {
		tb.Fatalf("%v (run `make bench`, which builds both modules)", err)
	}
	v, err := proxytest.NewWasmVMContext(bin)
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

// BenchmarkLiveConversations compares a sticky turn's cost with 10 and with 100 000
// live conversations in the table (bar: ≤ 1.2×), interleaved like CostRatio.
func BenchmarkLiveConversations(b *testing.B) {
	body := chatBodies(4<<10, 1, 1)[0]
	small := []byte(`{"model":"llama","messages":[{"role":"user","content":"hi"}]}`)
	b.Run("10-vs-100000", func(b *testing.B) {
		vm := freshVM(b, "kvroute")
		defer vm.Close()
		batch := max(1, b.N/costRounds)
		ns := map[int][]float64{}
		for r := 0; r < costRounds; r++ {
			for _, live := range []int{10, 100_000} {
				kv := startOn(b, vm, fleetConfig(4, 2))
				for i := 0; i < live; i++ {
					kv.exchange("/v1/chat/completions", small, [2]string{"x-session-id", fmt.Sprint("conv-", i)})
				}
				turn := func(i int) {
					kv.exchange("/v1/chat/completions", body, [2]string{"x-session-id", fmt.Sprint("conv-", (i*7919)%live)})
				}
				// Untimed first: filling the table leaves the guest's collector a debt
				// in proportion to the requests it took, which would otherwise fall on
				// the timed turns of the larger table alone.
				for i := 0; i < batch; i++ {
					turn(batch + i)
				}
				runtime.GC() // as warmThenTime does
				ns[live] = append(ns[live], perRequest(kv, batch, turn))
				kv.close()
			}
		}
		a, c := median(ns[10]), median(ns[100_000])
		b.ReportMetric(a, "ns/req@10")
		b.ReportMetric(c, "ns/req@100000")
		b.ReportMetric(c/a, "ratio")
	})
}

// BenchmarkFleetSize compares an anonymous request's cost on 4 and 64 targets
// (bar: ≤ 1.5×), interleaved like CostRatio.
func BenchmarkFleetSize(b *testing.B) {
	bodies := chatBodies(4<<10, 32, 2)
	b.Run("4-vs-64", func(b *testing.B) {
		vm := freshVM(b, "kvroute")
		defer vm.Close()
		batch := max(1, b.N/costRounds)
		ns := map[int][]float64{}
		for r := 0; r < costRounds; r++ {
			for _, targets := range []int{4, 64} {
				kv := startOn(b, vm, fleetConfig(targets/2, 2))
				ns[targets] = append(ns[targets], kv.warmThenTime(bodies, len(bodies), 0, batch, false))
				kv.close()
			}
		}
		a, c := median(ns[4]), median(ns[64])
		b.ReportMetric(a, "ns/req@4")
		b.ReportMetric(c, "ns/req@64")
		b.ReportMetric(c/a, "ratio")
	})
}

// BenchmarkModels compares a request's cost with no models (the top-level pools), one
// fleet of models and 20 fleets (bar: the cost does not grow with the fleets), each of
// 4 targets, interleaved like CostRatio and with the tick's share. The 20-fleet
// request names the last fleet, behind 19 exact names and 19 prefixes.
func BenchmarkModels(b *testing.B) {
	bodies := chatBodies(4<<10, 32, 3)
	configs := map[string]string{"none": fleetConfig(2, 2), "1": modelsConfig(1), "20": modelsConfig(20)}
	b.Run("none-vs-1-vs-20", func(b *testing.B) {
		vm := freshVM(b, "kvroute")
		defer vm.Close()
		batch := max(1, b.N/costRounds)
		ns := map[string][]float64{}
		for r := 0; r < costRounds; r++ {
			for _, n := range []string{"none", "1", "20"} {
				kv := startOn(b, vm, configs[n])
				ns[n] = append(ns[n], kv.warmThenTime(bodies, len(bodies), 0, batch, true))
				kv.close()
			}
		}
		none, one, twenty := median(ns["none"]), median(ns["1"]), median(ns["20"])
		b.ReportMetric(none, "ns/req@none")
		b.ReportMetric(one, "ns/req@1")
		b.ReportMetric(twenty, "ns/req@20")
		b.ReportMetric(twenty/one, "ratio20/1")
		b.ReportMetric(twenty/none, "ratio20/none")
	})
}

// modelsConfig is n fleets of 2 endpoints × 2 ranks; the last serves "llama" (the
// benchmark bodies' model), the others model-<i> and its prefix.
func modelsConfig(n int) string {
	var fleets []string
	for f := 0; f < n; f++ {
		names := fmt.Sprintf(`"model-%02d","model-%02d-*"`, f, f)
		if f == n-1 {
			names = `"llama","llama-*"`
		}
		fleets = append(fleets, fmt.Sprintf(`{"names":[%s],"pools":{"decode":{"endpoints":[
			{"address":"10.1.%d.1:8000","dp_size":2},{"address":"10.1.%d.2:8000","dp_size":2}]}}}`, names, f, f))
	}
	return `{"models":[` + strings.Join(fleets, ",") + `]}`
}
