package promtext

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

type promSample struct {
	name   string
	labels map[string]string
	value  float64
}

// scanAll collects every sample of text, copying what the views show.
func scanAll(t testing.TB, text string) ([]promSample, error) {
	t.Helper()
	var out []promSample
	err := Scan([]byte(text), func(name []byte, l Labels, v float64) bool {
		s := promSample{name: string(name), labels: map[string]string{}, value: v}
		l.each(func(n, _ []byte, _ bool) bool {
			val, ok := l.get(string(n))
			require.True(t, ok)
			if _, dup := s.labels[string(n)]; !dup {
				s.labels[string(n)] = strings.Clone(val)
			}
			return true
		})
		require.Equal(t, len(s.labels), l.count())
		out = append(out, s)
		return true
	})
	return out, err
}

// readEngineTestdata reads one of the engines' real pages, which live with the routing
// package's engine-metrics tests that also read them.
func readEngineTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "engine", "testdata", "engine", name))
	require.NoError(t, err)
	return b
}

func TestPromScanSamples(t *testing.T) {
	text := "# HELP a_metric Some help.\n" +
		"# TYPE a_metric gauge\n" +
		"\n" +
		"   \t\n" +
		"a_metric 1\n" +
		"b:metric{x=\"1\"} 2.5e+06\n" +
		"c{ a = \"x\" , b=\"y\", } -3 1700000000000\n" +
		"d{} +Inf\n" +
		"e -Inf\n" +
		"f NaN -5\n" +
		"g {le=\"+Inf\"} 7\r\n" +
		"h{v=\"a\\\\b\\\"c\\nd\"}\t8\n" +
		"  i 9   \n" +
		"j{x=\"\"} 0x1p-2\n" +
		"k 1e999\n" +
		"#comment without space\n" +
		"l{x=\"ünïcödé 🙂\"} 10"
	got, err := scanAll(t, text)
	require.NoError(t, err)
	names := make([]string, len(got))
	for i, s := range got {
		names[i] = s.name
	}
	require.Equal(t, []string{"a_metric", "b:metric", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"}, names)
	require.Equal(t, 2.5e6, got[1].value)
	require.Equal(t, map[string]string{"x": "1"}, got[1].labels)
	require.Equal(t, map[string]string{"a": "x", "b": "y"}, got[2].labels)
	require.Equal(t, -3.0, got[2].value)
	require.True(t, math.IsInf(got[3].value, 1))
	require.Empty(t, got[3].labels)
	require.True(t, math.IsInf(got[4].value, -1))
	require.True(t, math.IsNaN(got[5].value))
	require.Equal(t, map[string]string{"le": "+Inf"}, got[6].labels)
	require.Equal(t, "a\\b\"c\nd", got[7].labels["v"])
	require.Equal(t, 8.0, got[7].value)
	require.Equal(t, 9.0, got[8].value)
	require.Equal(t, map[string]string{"x": ""}, got[9].labels)
	require.Equal(t, 0.25, got[9].value)
	require.True(t, math.IsInf(got[10].value, 1), "a value beyond float64 is +Inf")
	require.Equal(t, "ünïcödé 🙂", got[11].labels["x"])
}

func TestPromLabelsAccessors(t *testing.T) {
	var seen int
	err := Scan([]byte(`m{engine="3",model_name="a\"b",big="1234567890",neg="-1",empty="",dup="1",dup="2"} 1`),
		func(_ []byte, l Labels, _ float64) bool {
			seen++
			n, ok := l.Int("engine")
			require.True(t, ok)
			require.Equal(t, 3, n)
			_, ok = l.Int("big") // 10 digits: refused, never overflows
			require.False(t, ok)
			_, ok = l.Int("neg")
			require.False(t, ok)
			_, ok = l.Int("empty")
			require.False(t, ok)
			_, ok = l.Int("absent")
			require.False(t, ok)
			v, ok := l.get("model_name")
			require.True(t, ok)
			require.Equal(t, `a"b`, v)
			v, ok = l.get("dup")
			require.True(t, ok)
			require.Equal(t, "1", v, "the first of duplicate labels wins")
			require.True(t, l.Has("empty"))
			require.False(t, l.Has("engin"))
			require.Equal(t, 7, l.count())
			require.Equal(t, l.Hash("model_name"), Labels{raw: []byte(`model_name="a\"b"`)}.Hash("model_name"))
			require.NotEqual(t, l.Hash("model_name"), l.Hash("engine"))
			return true
		})
	require.NoError(t, err)
	require.Equal(t, 1, seen)
}

func TestPromScanStopsEarly(t *testing.T) {
	n := 0
	err := Scan([]byte("a 1\nb 2\nthis is not a sample\n"), func([]byte, Labels, float64) bool {
		n++
		return n < 2
	})
	require.NoError(t, err, "fn stopped the scan before the bad line")
	require.Equal(t, 2, n)
}

func TestPromScanMalformed(t *testing.T) {
	cases := map[string]string{
		"no value":              "a_metric\n",
		"no value after labels": "a{x=\"1\"}\n",
		"value not a number":    "a 1x\n",
		"bad name start":        "1abc 2\n",
		"bad name char":         "a-b 2\n",
		"unquoted label":        "a{x=1} 2\n",
		"unterminated value":    "a{x=\"1} 2\n",
		"unterminated block":    "a{x=\"1\" 2\n",
		"missing equals":        "a{x \"1\"} 2\n",
		"bad escape":            "a{x=\"\\t\"} 2\n",
		"trailing backslash":    "a{x=\"\\",
		"empty label name":      "a{=\"1\"} 2\n",
		"leading comma":         "a{,x=\"1\"} 2\n",
		"double comma":          "a{x=\"1\",,y=\"2\"} 2\n",
		"label name digit":      "a{1x=\"1\"} 2\n",
		"no comma":              "a{x=\"1\" y=\"2\"} 2\n",
		"float timestamp":       "a 1 1.5\n",
		"text after timestamp":  "a 1 2 3\n",
		"sign only timestamp":   "a 1 -\n",
		"huge timestamp":        "a 1 123456789012345678901\n",
		"utf8 quoted name":      "{\"a.b\"} 1\n",
		"raw byte in name":      "a\x00 1\n",
		"second bad line":       "ok 1\nbad{\n",
	}
	for what, text := range cases {
		t.Run(what, func(t *testing.T) {
			err := Scan([]byte(text), func([]byte, Labels, float64) bool { return true })
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrMalformed))
			var pe *lineError
			require.True(t, errors.As(err, &pe))
			require.Positive(t, pe.Line)
			require.Contains(t, err.Error(), "line")
		})
	}
	var pe *lineError
	err := Scan([]byte("# c\n\nok 1\nbad{\n"), func([]byte, Labels, float64) bool { return true })
	require.True(t, errors.As(err, &pe))
	require.Equal(t, 4, pe.Line)
}

// The engines' own pages (routing/engine/testdata/engine, each naming its source) scan cleanly.
func TestPromScanEnginePages(t *testing.T) {
	for file, want := range map[string]int{
		"vllm.txt": 14, "vllm_docs.txt": 2, "sglang.txt": 21, "trtllm.txt": 5, "trtllm_1.1.txt": 15,
	} {
		t.Run(file, func(t *testing.T) {
			got, err := scanAll(t, string(readEngineTestdata(t, file)))
			require.NoError(t, err)
			require.Len(t, got, want)
		})
	}
	got, err := scanAll(t, string(readEngineTestdata(t, "sglang.txt")))
	require.NoError(t, err)
	require.Equal(t, "+Inf", got[7].labels["le"])
	require.Equal(t, 11008.0, got[7].value)
}

// Scanning allocates nothing per sample, and neither do the zero-alloc accessors.
func TestPromScanAllocs(t *testing.T) {
	text := bytes.Repeat([]byte("vllm:num_requests_running{engine=\"1\",model_name=\"qwen\"} 5.0 1700000000000\n"), 64)
	var sum float64
	allocs := testing.AllocsPerRun(20, func() {
		_ = Scan(text, func(name []byte, l Labels, v float64) bool {
			if string(name) == "vllm:num_requests_running" {
				r, _ := l.Int("engine")
				m, _ := l.get("model_name")
				sum += v + float64(r) + float64(len(m)) + float64(l.Hash("model_name")&1)
			}
			return true
		})
	})
	require.Zero(t, allocs)
	require.Positive(t, sum)
}

// adversarialPages are pages of about size bytes shaped to find a path that is not
// linear in the text: one huge label block, escapes, names, numbers, blank lines.
func adversarialPages(size int) map[string][]byte {
	return map[string][]byte{
		"many labels":    append(append([]byte("m{"), bytes.Repeat([]byte(`a="b",`), size/6)...), "} 1\n"...),
		"long value":     append(append([]byte(`m{a="`), bytes.Repeat([]byte(`\\\"`), size/4)...), "\"} 1\n"...),
		"many samples":   bytes.Repeat([]byte("m 1\n"), size/4),
		"many comments":  bytes.Repeat([]byte("# HELP\n"), size/7),
		"long name":      append(bytes.Repeat([]byte("m"), size), " 1\n"...),
		"unterminated":   append([]byte(`m{a="`), bytes.Repeat([]byte("x"), size)...),
		"blank lines":    bytes.Repeat([]byte(" \t\n"), size/3),
		"long number":    append([]byte("m "), bytes.Repeat([]byte("1"), size)...),
		"labels+lookups": bytes.Repeat([]byte(`m{a="1",b="2",c="3",d="4",e="5",f="6",g="7"} 1`+"\n"), size/48),
	}
}

func scanWithLookups(page []byte) error {
	return Scan(page, func(_ []byte, l Labels, _ float64) bool {
		l.Int("g")
		l.get("zz")
		return true
	})
}

// Work is linear in the text, whatever its shape: the time per byte of each adversarial
// page is the same at 256 KiB and at 4 MiB (a quadratic path would be 16 times slower
// per byte at the larger size). Compare the sub-benchmarks' MB/s:
//
//	go test ./routing/promtext -run '^$' -bench ScanAdversarial
func BenchmarkScanAdversarial(b *testing.B) {
	for _, size := range []int{256 << 10, 4 << 20} {
		pages := adversarialPages(size)
		for _, what := range slices.Sorted(maps.Keys(pages)) {
			page := pages[what]
			b.Run(fmt.Sprintf("%s/%dKiB", what, size>>10), func(b *testing.B) {
				b.SetBytes(int64(len(page)))
				for b.Loop() {
					_ = scanWithLookups(page)
				}
			})
		}
	}
}

var promFuzzSeeds = []string{
	"",
	"\n",
	"# HELP x y\n# TYPE x gauge\nx 1\n",
	"vllm:num_requests_running{engine=\"0\",model_name=\"qwen\"} 5\n",
	"a{b=\"c\\\\d\\\"e\\nf\",} NaN 123\n",
	"a +Inf\nb -Inf\r\nc 1e-3 -9\n",
	"a{b=\"\\x\"} 1\n",
	"a{b=\"c\"",
	"a{b=\"c\\",
	"{\"a\"} 1\n",
	"a{le=\"+Inf\",model_name=\"m\"} 7.400757e+06\n",
	"sglang:num_running_reqs{dp_rank=\"1\",engine_type=\"unified\",model_name=\"glm\",tp_rank=\"2\"} 0.0\n",
}

// FuzzScanPrometheus: never panics; a page that scans cleanly holds only valid names
// and label blocks; a page that does not fails with ErrMalformed; samples are delivered
// in order and a prefix of samples survives a stop.
func FuzzScanPrometheus(f *testing.F) {
	for _, s := range promFuzzSeeds {
		f.Add([]byte(s))
	}
	for _, file := range []string{"vllm.txt", "sglang.txt", "trtllm.txt", "trtllm_1.1.txt"} {
		f.Add(readEngineTestdata(f, file))
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		var names [][]byte
		err := Scan(text, func(name []byte, l Labels, _ float64) bool {
			if len(name) == 0 || !isMetricNameByte(name[0], false) {
				t.Fatalf("invalid name %q", name)
			}
			for i := 1; i < len(name); i++ {
				if !isMetricNameByte(name[i], true) {
					t.Fatalf("invalid name %q", name)
				}
			}
			n := 0
			l.each(func(ln, _ []byte, _ bool) bool {
				n++
				if _, ok := l.get(string(ln)); !ok {
					t.Fatalf("label %q not found again", ln)
				}
				l.Int(string(ln))
				l.Hash(string(ln))
				return true
			})
			if n != l.count() {
				t.Fatal("label count differs")
			}
			names = append(names, name)
			return true
		})
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v does not wrap ErrMalformed", err)
		}
		if len(names) > 0 {
			stopped := 0
			err2 := Scan(text, func([]byte, Labels, float64) bool { stopped++; return false })
			if stopped != 1 || err2 != nil {
				t.Fatalf("stop after the first sample: %d calls, %v", stopped, err2)
			}
		}
	})
}
