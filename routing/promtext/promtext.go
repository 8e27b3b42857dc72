// Package promtext reads the Prometheus text exposition format, as much of it as the
// /metrics pages of inference engines use. It is a package of its own because it is a
// parser of untrusted text with its own fuzz target; it is hand-written rather than
// github.com/prometheus/common/expfmt because linking expfmt's TextParser into the filter
// more than doubles build/kvroute.wasm (mostly its protobuf metric model) and raises
// go.mod's Go version, while this reader adds a few kilobytes.
package promtext

import (
	"errors"
	"strconv"
	"unsafe"
)

// ErrMalformed is wrapped by every error Scan returns.
var ErrMalformed = errors.New("kvroute: malformed prometheus text")

// lineError names the line (1-based) that could not be read, and why.
type lineError struct {
	Line   int
	Reason string
}

func (e *lineError) Error() string {
	return "kvroute: malformed prometheus text, line " + strconv.Itoa(e.Line) + ": " + e.Reason
}

func (e *lineError) Unwrap() error { return ErrMalformed }

// Labels is a view of one sample's label block, the text between its braces, already
// checked to be well formed. It holds no copy and allocates nothing; it is valid only
// during the Scan callback that received it.
type Labels struct {
	raw []byte
}

// count is the number of labels.
func (l Labels) count() int {
	n := 0
	l.each(func(_, _ []byte, _ bool) bool { n++; return true })
	return n
}

// get returns the unescaped value of the label called name. A value without escapes
// is returned as a view of the scanned text, not a copy: it is valid while that text
// is unchanged (strings.Clone it to keep it longer). A value with escapes is copied.
func (l Labels) get(name string) (string, bool) {
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
func (l Labels) Int(name string) (n int, ok bool) {
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
func (l Labels) Has(name string) bool {
	_, _, ok := l.lookup(name)
	return ok
}

// Hash is an FNV-1a hash of the label's unescaped value (0 when absent), so samples can
// be grouped by a label's value without copying it.
func (l Labels) Hash(name string) uint64 {
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
func (l Labels) lookup(name string) (value []byte, escaped, ok bool) {
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
func (l Labels) each(fn func(name, value []byte, escaped bool) bool) {
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

// Scan reads text in the text exposition format (version 0.0.4) and calls fn for every
// sample in order; fn returns false to stop early. It skips comment lines (# HELP,
// # TYPE and any other "#" line) and blank lines, and reads samples
//
//	name{label="value",...} value [timestamp]
//
// with label values escaped as \\, \" and \n, values in Go float syntax including NaN,
// +Inf and -Inf, and an optional integer timestamp. name and labels are views of text,
// valid only during the call. It returns nil at the end of the text (or when fn stops
// it), and an error wrapping ErrMalformed that names the first line it cannot read: a
// page that is not what we expect is better ignored whole than half-trusted. The work is
// linear in the text, nothing is allocated per sample, and it never panics.
func Scan(text []byte, fn func(name []byte, labels Labels, value float64) bool) error {
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
			return &lineError{Line: line, Reason: reason}
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
func parseSample(l []byte, i int) (name []byte, labels Labels, value float64, reason string) {
	start := i
	for i < len(l) && isMetricNameByte(l[i], i > start) {
		i++
	}
	if i == start {
		return nil, Labels{}, 0, "a sample must start with a metric name"
	}
	name = l[start:i]
	if i < len(l) && l[i] != ' ' && l[i] != '\t' && l[i] != '{' {
		return nil, Labels{}, 0, "invalid character in metric name"
	}
	i = skipBlanks(l, i)
	if i < len(l) && l[i] == '{' {
		end, r := scanLabels(l, i+1)
		if r != "" {
			return nil, Labels{}, 0, r
		}
		labels = Labels{raw: l[i+1 : end]}
		i = skipBlanks(l, end+1)
	}
	vs := i
	for i < len(l) && l[i] != ' ' && l[i] != '\t' {
		i++
	}
	if i == vs {
		return nil, Labels{}, 0, "missing value"
	}
	v, err := strconv.ParseFloat(string(l[vs:i]), 64)
	if err != nil && !isRangeError(err) {
		return nil, Labels{}, 0, "value is not a number"
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
			return nil, Labels{}, 0, "timestamp is not an integer"
		}
		if skipBlanks(l, i) != len(l) {
			return nil, Labels{}, 0, "unexpected text after the timestamp"
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
