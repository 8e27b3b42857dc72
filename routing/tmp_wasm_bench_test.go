package routing

import (
	"github.com/tidwall/gjson"
	"encoding/binary"
	"math/bits"
	"time"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"unsafe"
)

func tmpBody() []byte {
	rng := rand.New(rand.NewSource(1))
	var sb strings.Builder
	for sb.Len() < 4000 {
		fmt.Fprintf(&sb, "w%d ", rng.Intn(1<<20))
	}
	return []byte(`{"model":"m","stream":true,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` + sb.String() + `"}]}`)
}

func BenchmarkTmpShape(b *testing.B) {
	body := tmpBody()
	s := unsafe.String(&body[0], len(body))
	for i := 0; i < b.N; i++ {
		if !jsonShapeOK(s) {
			b.Fatal()
		}
	}
}
func BenchmarkTmpIndexByte(b *testing.B) {
	body := tmpBody()
	s := unsafe.String(&body[0], len(body))
	for i := 0; i < b.N; i++ {
		if strings.IndexByte(s[40:], '}') < 0 {
			b.Fatal()
		}
	}
}
func BenchmarkTmpExtract(b *testing.B) {
	body := tmpBody()
	opt := ExtractOptions{CharsPerToken: 4, BlockTokens: 16, BodyFields: []string{"conversation_params.conversation_id", "prompt_cache_key", "conversation"}}
	var req Request
	for i := 0; i < b.N; i++ {
		req.HasConversation = false
		if err := Extract(APIChatCompletions, body, opt, &req); err != nil {
			b.Fatal(err)
		}
	}
}
func BenchmarkTmpHash(b *testing.B) {
	body := tmpBody()
	opt := ExtractOptions{CharsPerToken: 4, BlockTokens: 16}
	var req Request
	Extract(APIChatCompletions, body, opt, &req)
	var cp []Checkpoint
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cp, _ = HashCheckpoints(req.Model, req.Prompt, req.BlockBytes, cp[:0])
	}
}

func tmpDecideBench(b *testing.B, extra string) {
	cfg := testConfig(b, extra)
	r := NewRouter(cfg, NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	opt := ExtractOptions{CharsPerToken: 4, BlockTokens: 16}
	var bodies [][]byte
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 32; i++ {
		var sb strings.Builder
		for sb.Len() < 3000 {
			fmt.Fprintf(&sb, "w%d ", rng.Intn(1<<20))
		}
		bodies = append(bodies, []byte(`{"model":"m","messages":[{"role":"system","content":"`+strings.Repeat("sys ", 256)+`"},{"role":"user","content":"`+sb.String()+`"}]}`))
	}
	reqs := make([]Request, 32)
	for i := range reqs {
		Extract(APIChatCompletions, bodies[i], opt, &reqs[i])
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req := reqs[i%32]
		req.Identity = uint64(i)
		d := r.Decide(&req, NoRank)
		_ = r.Release(d.Ticket)
	}
}
func BenchmarkTmpDecidePrefix(b *testing.B)   { tmpDecideBench(b, "") }
func BenchmarkTmpDecideNoPrefix(b *testing.B) { tmpDecideBench(b, `,"prefix":{"enabled":false}`) }
func BenchmarkTmpMatchRecord(b *testing.B) {
	body := tmpBody()
	opt := ExtractOptions{CharsPerToken: 4, BlockTokens: 16}
	var req Request
	Extract(APIChatCompletions, body, opt, &req)
	cps, _ := HashCheckpoints(req.Model, req.Prompt, req.BlockBytes, nil)
	x := NewPrefixIndex(NewMemoryStore(), "kvroute", "decode", 262144, 8)
	known := map[uint32]int{1: 0, 2: 1, 3: 2}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		x.Match(cps, func(t uint32) bool { _, ok := known[t]; return ok })
		x.Record(cps, uint64(i%3+1))
	}
}

func tmpCps() []Checkpoint {
	body := tmpBody()
	opt := ExtractOptions{CharsPerToken: 4, BlockTokens: 16}
	var req Request
	Extract(APIChatCompletions, body, opt, &req)
	cps, _ := HashCheckpoints(req.Model, req.Prompt, req.BlockBytes, nil)
	return cps
}
func BenchmarkTmpMatchOnly(b *testing.B) {
	cps := tmpCps()
	x := NewPrefixIndex(NewMemoryStore(), "kvroute", "decode", 262144, 8)
	x.Record(cps, 1)
	x.Record(cps[:10], 2)
	known := map[uint32]int{1: 0, 2: 1, 3: 2}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		x.Match(cps, func(t uint32) bool { _, ok := known[t]; return ok })
	}
}
func BenchmarkTmpMatchOnlyNoMap(b *testing.B) {
	cps := tmpCps()
	x := NewPrefixIndex(NewMemoryStore(), "kvroute", "decode", 262144, 8)
	x.Record(cps, 1)
	x.Record(cps[:10], 2)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		x.Match(cps, func(t uint32) bool { return t <= 3 })
	}
}
func BenchmarkTmpRecordSame(b *testing.B) {
	cps := tmpCps()
	x := NewPrefixIndex(NewMemoryStore(), "kvroute", "decode", 262144, 8)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		x.Record(cps, 1)
	}
}
func BenchmarkTmpRecordNew(b *testing.B) {
	cps := tmpCps()
	x := NewPrefixIndex(NewMemoryStore(), "kvroute", "decode", 262144, 8)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range cps {
			cps[j].Hash += 0x9e3779b97f4a7c15
		}
		x.Record(cps, 1)
		if i%100 == 0 {
			x.journal.outbox = x.journal.outbox[:0]
		}
	}
}
func BenchmarkTmpRecordNewSmall(b *testing.B) {
	cps := tmpCps()
	x := NewPrefixIndex(NewMemoryStore(), "kvroute", "decode", 4096, 8)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range cps {
			cps[j].Hash += 0x9e3779b97f4a7c15
		}
		x.Record(cps, 1)
		if i%100 == 0 {
			x.journal.outbox = x.journal.outbox[:0]
		}
	}
}
func BenchmarkTmpTableNewOnly(b *testing.B) {
	cps := tmpCps()
	x := newPrefixTable(262144)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range cps {
			cps[j].Hash += 0x9e3779b97f4a7c15
			x.record(cps[j].Hash, 1)
		}
	}
}
func BenchmarkTmpRecordNewReset1(b *testing.B) {
	cps := tmpCps()
	x := NewPrefixIndex(NewMemoryStore(), "kvroute", "decode", 262144, 8)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range cps {
			cps[j].Hash += 0x9e3779b97f4a7c15
		}
		x.Record(cps, 1)
		x.journal.outbox = x.journal.outbox[:0]
	}
}
func BenchmarkTmpTableNewOnlyViaIndex(b *testing.B) {
	cps := tmpCps()
	x := NewPrefixIndex(NewMemoryStore(), "kvroute", "decode", 262144, 8)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range cps {
			cps[j].Hash += 0x9e3779b97f4a7c15
			x.table.record(cps[j].Hash, 1)
		}
	}
}
func BenchmarkTmpQueueOnly(b *testing.B) {
	x := NewPrefixIndex(NewMemoryStore(), "kvroute", "decode", 262144, 8)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := 0; j < 32; j++ {
			x.journal.queue(uint64(i*32+j), 1)
		}
		x.journal.outbox = x.journal.outbox[:0]
	}
}
func BenchmarkTmpQuoteScan(b *testing.B) {
	body := tmpBody()
	s := unsafe.String(&body[0], len(body))
	for i := 0; i < b.N; i++ {
		if quoteOrEscape(s, 120) < 0 {
			b.Fatal()
		}
	}
}
func BenchmarkTmpXXSum(b *testing.B) {
	body := tmpBody()[:4096]
	for i := 0; i < b.N; i++ {
		benchSinkU64 = Fingerprint(body)
	}
}

var benchSinkU64 uint64
func BenchmarkTmpTimeNow(b *testing.B) {
	for i := 0; i < b.N; i++ {
		benchSinkU64 += uint64(time.Now().UnixMilli())
	}
}
func quoteOrEscapeB(s string, i int) int {
	b := unsafe.Slice(unsafe.StringData(s), len(s))
	for ; i+8 <= len(b); i += 8 {
		if m := quoteOrEscapeMask(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	for ; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			return i
		}
	}
	return len(s)
}
func BenchmarkTmpQuoteScanB(b *testing.B) {
	body := tmpBody()
	s := unsafe.String(&body[0], len(body))
	for i := 0; i < b.N; i++ {
		if quoteOrEscapeB(s, 120) < 0 {
			b.Fatal()
		}
	}
}
func BenchmarkTmpMemchr2(b *testing.B) {
	body := tmpBody()
	s := unsafe.String(&body[0], len(body))
	for i := 0; i < b.N; i++ {
		if strings.IndexByte(s[120:], '"')+strings.IndexByte(s[120:len(s)-30], '\\') < -5 {
			b.Fatal()
		}
	}
}
func BenchmarkTmpFloorGjson(b *testing.B) {
	body := tmpBody()
	for i := 0; i < b.N; i++ {
		r := gjson.ParseBytes(body)
		if !r.Get("model").Exists() || !r.Get("messages").IsArray() {
			b.Fatal()
		}
	}
}
