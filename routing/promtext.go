package routing

import (
	"errors"
	"strconv"
	"unsafe"
)

// A small strict reader of the Prometheus text exposition format (version 0.0.4), enough
// for the /metrics pages of inference engines: it skips comment lines (# HELP, # TYPE
// and any other "#" line) and blank lines, and reads samples
//
//	name{label="value",...} value [timestamp]
//
// with label values escaped as \\, \" and \n, values in Go float syntax including NaN,
// +Inf and -Inf, and an optional integer timestamp. A line it cannot read is an error
// (wrapping ErrPromText) and stops the scan: a page that is not what we expect is
// better ignored whole than half-trusted. The work is linear in the text: every byte is
// looked at a bounded number of times, and nothing is allocated per sample.
//
// Why not github.com/prometheus/common/expfmt: it builds for GOOS=wasip1, but linking
// its TextParser into the filter more than doubles build/kvroute.wasm, mostly with its
// protobuf metric model (prometheus/client_model, google.golang.org/protobuf), and it
// raises go.mod's Go version. This reader adds a few kilobytes.

// ErrPromText is wrapped by every error scanPrometheus returns.
var ErrPromText = errors.New("kvroute: malformed prometheus text")

// promTextError names the line (1-based) that could not be read, and why.
type promTextError struct {
	Line   int
	Reason string
}

func (e *promTextError) Error() string {
	return "kvroute: malformed prometheus text, line " + strconv.Itoa(e.Line) + ": " + e.Reason
}

func (e *promTextError) Unwrap() error { return ErrPromText }

// promLabels is a view of one sample's label block, the text between its braces, already
// checked to be well formed. It holds no copy and allocates nothing; it is valid only
// during the scanPrometheus callback that received it.
type promLabels struct {
	raw []byte
}

// Len is the number of labels.
func (l promLabels) Len() int {
	n := 0
	l.each(func(_, _ []byte, _ bool) bool { n++; return true })
	return n
}

// Get returns the unescaped value of the label called name. A value without escapes
// is returned as a view of the scanned text, not a copy: it is valid while that text
// is unchanged (strings.Clone it to keep it longer). A value with escapes is copied.
func (l promLabels) Get(name string) (string, bool) {
	v, esc, ok := l.lookup(name)
	if !ok {
		return "", false
	}
	if !esc {
		if len(v) == 0 {
			return "", true
		}
		return unsafe.String(unsafe.SliceData(v), len(v)), true
	}
	out := make([]byte, 0, len(v))
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == '\\' {
			i++
			c = unescapeLabelByte(v[i])
		}
		out = append(out, c)
	}
	return string(out), true
}

// Int returns the label's value as a non-negative decimal int (at most 9 digits), without
// allocating. ok is false when the label is absent or is not such a number.
func (l promLabels) Int(name string) (n int, ok bool) {
	v, esc, found := l.lookup(name)
	if !found || esc || len(v) == 0 || len(v) > 9 {
		return 0, false
	}
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// Has reports whether the label is present.
func (l promLabels) Has(name string) bool {
	_, _, ok := l.lookup(name)
	return ok
}

// hash is an FNV-1a hash of the label's unescaped value (0 when absent), so samples can
// be grouped by a label's value without copying it.
func (l promLabels) hash(name string) uint64 {
	v, _, ok := l.lookup(name)
	if !ok {
		return 0
	}
	h := uint64(14695981039346656037)
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == '\\' {
			i++
			c = unescapeLabelByte(v[i])
		}
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

// lookup finds the first label called name and returns its raw (still escaped) value.
func (l promLabels) lookup(name string) (value []byte, escaped, ok bool) {
	l.each(func(n, v []byte, esc bool) bool {
		if string(n) == name {
			value, escaped, ok = v, esc, true
			return false
		}
		return true
	})
	return
}

// each walks a label block that scanLabels has already validated.
func (l promLabels) each(fn func(name, value []byte, escaped bool) bool) {
	b := l.raw
	i := 0
	for {
		i = skipBlanks(b, i)
		if i >= len(b) {
			return
		}
		start := i
		for i < len(b) && isLabelNameByte(b[i], i > start) {
			i++
		}
		name := b[start:i]
		i = skipBlanks(b, i)
		i++ // '='
		i = skipBlanks(b, i)
		i++ // opening quote
		vs := i
		esc := false
		for b[i] != '"' {
			if b[i] == '\\' {
				esc = true
				i++
			}
			i++
		}
		if !fn(name, b[vs:i], esc) {
			return
		}
		i++ // closing quote
		i = skipBlanks(b, i)
		if i < len(b) && b[i] == ',' {
			i++
		}
	}
}

func unescapeLabelByte(c byte) byte {
	if c == 'n' {
		return '\n'
	}
	return c // '\\' or '"'
}

func skipBlanks(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
		i++
	}
	return i
}

func isMetricNameByte(c byte, notFirst bool) bool {
	return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		(notFirst && c >= '0' && c <= '9')
}

func isLabelNameByte(c byte, notFirst bool) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		(notFirst && c >= '0' && c <= '9')
}

// scanPrometheus reads text and calls fn for every sample in order; fn returns false to
// stop early. name and labels are views of text, valid only during the call. It
// returns nil at the end of the text (or when fn stops it), and a *promTextError
// (wrapping ErrPromText) at the first line it cannot read. It never panics.
func scanPrometheus(text []byte, fn func(name []byte, labels promLabels, value float64) bool) error {
	line := 0
	for len(text) > 0 {
		line++
		var l []byte
		if nl := indexByte(text, '\n'); nl >= 0 {
			l, text = text[:nl], text[nl+1:]
		} else {
			l, text = text, nil
		}
		if n := len(l); n > 0 && l[n-1] == '\r' {
			l = l[:n-1]
		}
		i := skipBlanks(l, 0)
		if i == len(l) || l[i] == '#' {
			continue
		}
		name, labels, value, reason := parseSample(l, i)
		if reason != "" {
			return &promTextError{Line: line, Reason: reason}
		}
		if !fn(name, labels, value) {
			return nil
		}
	}
	return nil
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// parseSample reads one sample line from position i (its first non-blank byte).
func parseSample(l []byte, i int) (name []byte, labels promLabels, value float64, reason string) {
	start := i
	for i < len(l) && isMetricNameByte(l[i], i > start) {
		i++
	}
	if i == start {
		return nil, promLabels{}, 0, "a sample must start with a metric name"
	}
	name = l[start:i]
	if i < len(l) && l[i] != ' ' && l[i] != '\t' && l[i] != '{' {
		return nil, promLabels{}, 0, "invalid character in metric name"
	}
	i = skipBlanks(l, i)
	if i < len(l) && l[i] == '{' {
		end, r := scanLabels(l, i+1)
		if r != "" {
			return nil, promLabels{}, 0, r
		}
		labels = promLabels{raw: l[i+1 : end]}
		i = skipBlanks(l, end+1)
	}
	vs := i
	for i < len(l) && l[i] != ' ' && l[i] != '\t' {
		i++
	}
	if i == vs {
		return nil, promLabels{}, 0, "missing value"
	}
	v, err := strconv.ParseFloat(string(l[vs:i]), 64)
	if err != nil && !isRangeError(err) {
		return nil, promLabels{}, 0, "value is not a number"
	}
	i = skipBlanks(l, i)
	if i < len(l) {
		ts := i
		if l[i] == '-' || l[i] == '+' {
			i++
		}
		ds := i
		for i < len(l) && l[i] >= '0' && l[i] <= '9' {
			i++
		}
		if i == ds || i-ts > 20 {
			return nil, promLabels{}, 0, "timestamp is not an integer"
		}
		if skipBlanks(l, i) != len(l) {
			return nil, promLabels{}, 0, "unexpected text after the timestamp"
		}
	}
	return name, labels, v, ""
}

// isRangeError accepts a value too large or too small for a float64 (ParseFloat then
// returns ±Inf or 0, which is what the number means).
func isRangeError(err error) bool {
	ne, ok := err.(*strconv.NumError)
	return ok && ne.Err == strconv.ErrRange
}

// scanLabels checks the label block starting just after '{' and returns the position
// of its closing '}'.
func scanLabels(l []byte, i int) (end int, reason string) {
	for {
		i = skipBlanks(l, i)
		if i >= len(l) {
			return 0, "unterminated label block"
		}
		if l[i] == '}' {
			return i, ""
		}
		start := i
		for i < len(l) && isLabelNameByte(l[i], i > start) {
			i++
		}
		if i == start {
			return 0, "invalid label name"
		}
		i = skipBlanks(l, i)
		if i >= len(l) || l[i] != '=' {
			return 0, "expected '=' after a label name"
		}
		i = skipBlanks(l, i+1)
		if i >= len(l) || l[i] != '"' {
			return 0, "a label value must be quoted"
		}
		i++
		for {
			if i >= len(l) {
				return 0, "unterminated label value"
			}
			c := l[i]
			if c == '"' {
				break
			}
			if c == '\\' {
				if i+1 >= len(l) {
					return 0, "unterminated label value"
				}
				switch l[i+1] {
				case '\\', '"', 'n':
				default:
					return 0, "invalid escape in a label value"
				}
				i++
			}
			i++
		}
		i = skipBlanks(l, i+1)
		if i >= len(l) {
			return 0, "unterminated label block"
		}
		switch l[i] {
		case ',':
			i++
		case '}':
			return i, ""
		default:
			return 0, "expected ',' or '}' after a label value"
		}
	}
}
