package prefix

import (
	"math/rand"
	"testing"

	"github.com/kvroute/kvroute/routing/state"
)

var promptSizes = []struct {
	name  string
	bytes int
}{{"4KiB", 4 << 10}, {"64KiB", 64 << 10}, {"1MiB", 1 << 20}}

// BenchmarkHashCheckpoints measures the chained block hashing of a whole prompt
// (blocks of 16 tokens × 4 bytes).
func BenchmarkHashCheckpoints(b *testing.B) {
	for _, size := range promptSizes {
		b.Run(size.name, func(b *testing.B) {
			p := make([]byte, size.bytes)
			rand.New(rand.NewSource(1)).Read(p)
			var cps []Checkpoint
			b.SetBytes(int64(size.bytes))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				cps, _ = HashCheckpoints("llama", p, 64, cps)
			}
			b.ReportMetric(float64(len(cps)), "checkpoints")
		})
	}
}

// BenchmarkPrefixIndexRequest measures one request's lookup and record in the prefix
// index, and reports the shared-data operations per request and per tick: each
// request is a new turn of one of 64 conversations, and a tick comes every 100
// requests (10 ticks a second at 1000 requests a second).
func BenchmarkPrefixIndexRequest(b *testing.B) {
	for _, size := range promptSizes {
		b.Run(size.name, func(b *testing.B) {
			cs := &countingStore{Store: state.NewMemoryStore()}
			x := NewPrefixIndex(cs, "ns", "decode", 262144, 8)
			rng := rand.New(rand.NewSource(2))
			convs := make([][]byte, 64)
			for i := range convs {
				convs[i] = make([]byte, size.bytes/2)
				rng.Read(convs[i])
			}
			known := func(uint32) bool { return true }
			var hashed Prompt
			var onRequest, onTick, ticks int
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c := i % len(convs)
				if len(convs[c]) >= size.bytes {
					convs[c] = convs[c][:size.bytes/2] // the conversation starts over
				}
				turn := make([]byte, 256)
				rng.Read(turn)
				convs[c] = append(convs[c], turn...)
				before := cs.gets + cs.sets
				hashed.Hash("llama", convs[c], 64)
				m := x.StartPromptMatch(&hashed, known, nil)
				for m.Next() {
				}
				x.Record(hashed.Checkpoints, uint64(1+c%8), 0, 0)
				onRequest += cs.gets + cs.sets - before
				if i%100 == 99 {
					before = cs.gets + cs.sets
					if err := x.Sync(int64(1e6+i), nil); err != nil {
						b.Fatal(err)
					}
					onTick += cs.gets + cs.sets - before
					ticks++
				}
			}
			b.ReportMetric(float64(onRequest)/float64(b.N), "hostcalls/req")
			if ticks > 0 {
				b.ReportMetric(float64(onTick)/float64(ticks), "hostcalls/tick")
			}
		})
	}
}

// BenchmarkQuestionOnADocument measures a lookup's worst case for the blocks between
// checkpoints: questions on a document of 100 000 tokens that no request sent alone,
// so every block between the document's last checkpoint and the next is hashed and
// probed in vain. gridOnly is the lookup without those probes.
func BenchmarkQuestionOnADocument(b *testing.B) {
	for _, gridOnly := range []bool{false, true} {
		name := "between"
		if gridOnly {
			name = "gridOnly"
		}
		b.Run(name, func(b *testing.B) {
			rng := rand.New(rand.NewSource(3))
			doc := make([]byte, 400_000)
			rng.Read(doc)
			x := NewPrefixIndex(state.NewMemoryStore(), "ns", "decode", 262144, 8)
			known := func(uint32) bool { return true }
			var hashed Prompt
			questions := make([][]byte, 16)
			for i := range questions {
				questions[i] = append(append([]byte(nil), doc...), make([]byte, 2000)...)
				rng.Read(questions[i][len(doc):])
				hashed.Hash("llama", questions[i], 64)
				x.Record(hashed.Checkpoints, uint64(1+i%8), 0, 0)
			}
			b.SetBytes(int64(len(questions[0])))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				hashed.Hash("llama", questions[i%len(questions)], 64)
				var m *PrefixSearch
				if gridOnly {
					m = x.StartMatch(hashed.Checkpoints, known)
				} else {
					m = x.StartPromptMatch(&hashed, known, nil)
				}
				for m.Next() {
				}
			}
		})
	}
}
