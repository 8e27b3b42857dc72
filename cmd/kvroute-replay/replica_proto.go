package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strconv"
)

// The replica protocol: how the parent (the replicas policy, replicas.go) talks to a
// gateway-replica child (replica_child.go) over the child's stdin and stdout. Every
// message is one ASCII header line of space-separated fields; whatever is bytes (a
// path, headers, a body, a page, a text) follows the line raw, its length given in the
// line, so any byte may appear in it.
//
// Parent → child:
//
//	C <index> <time_ms> <path_len> <n_headers> <body_len>\n<path>
//	  then per header: <name_len> <value_len>\n<name><value>
//	  then <body>                          choose a target for request <index>
//	F <index> <time_ms>\n                 request <index>'s first token (first body chunk)
//	D <index> <time_ms>\n                 request <index> completed
//	S\n                                   report the filter's counters
//	P <page_len>\n<page>                  the metrics page asked for by M
//
// Child → parent:
//
//	M <endpoint_len>\n<endpoint>          before a reply: a scrape wants this page
//	T <target> <kind_len>\n<kind>         the reply to C: target index, decision header
//	ok\n                                  the reply to F and D
//	S <len>\n<json>                       the reply to S
//	E <len>\n<message>                    the child failed; it exits after this
//
// Times are replay milliseconds, written so that they read back exactly.

// replicaMsg is one protocol message; which fields count depends on Kind.
type replicaMsg struct {
	Kind    byte // 'C', 'F', 'D', 'S', 'P', 'M', 'T', 'O' (ok), 'E'
	Index   int
	TimeMS  float64
	Path    string
	Headers [][2]string
	Body    []byte // C: the request body; P: the page; S: the JSON
	Target  int
	Text    string // M: the endpoint; T: the decision; E: the message
}

// maxReplicaPayload bounds one length field, so a corrupt stream fails instead of
// allocating without end.
const maxReplicaPayload = 1 << 30

// replicaConn reads and writes protocol messages on one stream pair.
type replicaConn struct {
	r *bufio.Reader
	w *bufio.Writer
}

func newReplicaConn(r io.Reader, w io.Writer) *replicaConn {
	return &replicaConn{r: bufio.NewReaderSize(r, 64<<10), w: bufio.NewWriterSize(w, 64<<10)}
}

func formatMS(t float64) string { return strconv.FormatFloat(t, 'g', -1, 64) }

// Send writes m and flushes it.
func (c *replicaConn) Send(m *replicaMsg) error {
	w := c.w
	switch m.Kind {
	case 'C':
		fmt.Fprintf(w, "C %d %s %d %d %d\n", m.Index, formatMS(m.TimeMS), len(m.Path), len(m.Headers), len(m.Body))
		w.WriteString(m.Path)
		for _, h := range m.Headers {
			fmt.Fprintf(w, "%d %d\n", len(h[0]), len(h[1]))
			w.WriteString(h[0])
			w.WriteString(h[1])
		}
		w.Write(m.Body)
	case 'F', 'D':
		fmt.Fprintf(w, "%c %d %s\n", m.Kind, m.Index, formatMS(m.TimeMS))
	case 'S':
		if m.Body == nil {
			w.WriteString("S\n")
		} else {
			fmt.Fprintf(w, "S %d\n", len(m.Body))
			w.Write(m.Body)
		}
	case 'P':
		fmt.Fprintf(w, "P %d\n", len(m.Body))
		w.Write(m.Body)
	case 'M', 'E':
		fmt.Fprintf(w, "%c %d\n", m.Kind, len(m.Text))
		w.WriteString(m.Text)
	case 'T':
		fmt.Fprintf(w, "T %d %d\n", m.Target, len(m.Text))
		w.WriteString(m.Text)
	case 'O':
		w.WriteString("ok\n")
	default:
		return fmt.Errorf("replica protocol: cannot send message kind %q", m.Kind)
	}
	return w.Flush()
}

// Receive reads the next message; io.EOF when the stream ended between messages.
func (c *replicaConn) Receive() (*replicaMsg, error) {
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		if err == io.EOF && len(line) == 0 {
			return nil, io.EOF
		}
		if err == bufio.ErrBufferFull {
			return nil, fmt.Errorf("replica protocol: header line longer than %d bytes", c.r.Size())
		}
		return nil, fmt.Errorf("replica protocol: reading a header line: %w", unexpectedEOF(err))
	}
	fields := bytes.Fields(line)
	if len(fields) == 0 {
		return nil, fmt.Errorf("replica protocol: empty header line")
	}
	ints := func(want int, from int) ([]int, error) {
		if len(fields) != want {
			return nil, fmt.Errorf("replica protocol: %q: want %d fields", bytes.TrimSpace(line), want)
		}
		out := make([]int, 0, want-from)
		for _, f := range fields[from:] {
			n, err := strconv.Atoi(string(f))
			if err != nil || n < 0 || n > maxReplicaPayload {
				return nil, fmt.Errorf("replica protocol: %q: bad number %q", bytes.TrimSpace(line), f)
			}
			out = append(out, n)
		}
		return out, nil
	}
	kind := string(fields[0])
	m := &replicaMsg{}
	switch kind {
	case "C":
		if len(fields) != 6 {
			return nil, fmt.Errorf("replica protocol: %q: want 6 fields", bytes.TrimSpace(line))
		}
		t, err := strconv.ParseFloat(string(fields[2]), 64)
		if err != nil {
			return nil, fmt.Errorf("replica protocol: bad time %q", fields[2])
		}
		fields = append(fields[:2:2], fields[3:]...) // drop the time, then all are ints
		n, err := ints(5, 1)
		if err != nil {
			return nil, err
		}
		m.Kind, m.Index, m.TimeMS = 'C', n[0], t
		path, err := c.readN(n[1])
		if err != nil {
			return nil, err
		}
		m.Path = string(path)
		for i := 0; i < n[2]; i++ {
			hl, err := c.r.ReadSlice('\n')
			if err != nil {
				return nil, fmt.Errorf("replica protocol: reading header %d: %w", i, unexpectedEOF(err))
			}
			hf := bytes.Fields(hl)
			if len(hf) != 2 {
				return nil, fmt.Errorf("replica protocol: header %d: %q", i, bytes.TrimSpace(hl))
			}
			kl, err1 := strconv.Atoi(string(hf[0]))
			vl, err2 := strconv.Atoi(string(hf[1]))
			if err1 != nil || err2 != nil || kl < 0 || vl < 0 || kl+vl > maxReplicaPayload {
				return nil, fmt.Errorf("replica protocol: header %d: %q", i, bytes.TrimSpace(hl))
			}
			kv, err := c.readN(kl + vl)
			if err != nil {
				return nil, err
			}
			m.Headers = append(m.Headers, [2]string{string(kv[:kl]), string(kv[kl:])})
		}
		if m.Body, err = c.readN(n[3]); err != nil {
			return nil, err
		}
	case "F", "D":
		if len(fields) != 3 {
			return nil, fmt.Errorf("replica protocol: %q: want 3 fields", bytes.TrimSpace(line))
		}
		idx, err1 := strconv.Atoi(string(fields[1]))
		t, err2 := strconv.ParseFloat(string(fields[2]), 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("replica protocol: %q: bad fields", bytes.TrimSpace(line))
		}
		m.Kind, m.Index, m.TimeMS = fields[0][0], idx, t
	case "S":
		m.Kind = 'S'
		if len(fields) == 1 {
			return m, nil // the request
		}
		n, err := ints(2, 1)
		if err != nil {
			return nil, err
		}
		if m.Body, err = c.readN(n[0]); err != nil {
			return nil, err
		}
	case "P":
		n, err := ints(2, 1)
		if err != nil {
			return nil, err
		}
		m.Kind = 'P'
		if m.Body, err = c.readN(n[0]); err != nil {
			return nil, err
		}
	case "M", "E":
		n, err := ints(2, 1)
		if err != nil {
			return nil, err
		}
		m.Kind = kind[0]
		text, err := c.readN(n[0])
		if err != nil {
			return nil, err
		}
		m.Text = string(text)
	case "T":
		if len(fields) != 3 {
			return nil, fmt.Errorf("replica protocol: %q: want 3 fields", bytes.TrimSpace(line))
		}
		target, err1 := strconv.Atoi(string(fields[1]))
		kl, err2 := strconv.Atoi(string(fields[2]))
		if err1 != nil || err2 != nil || kl < 0 || kl > maxReplicaPayload {
			return nil, fmt.Errorf("replica protocol: %q: bad fields", bytes.TrimSpace(line))
		}
		text, err := c.readN(kl)
		if err != nil {
			return nil, err
		}
		m.Kind, m.Target, m.Text = 'T', target, string(text)
	case "ok":
		if len(fields) != 1 {
			return nil, fmt.Errorf("replica protocol: %q: want 1 field", bytes.TrimSpace(line))
		}
		m.Kind = 'O'
	default:
		return nil, fmt.Errorf("replica protocol: unknown message %q", bytes.TrimSpace(line))
	}
	return m, nil
}

// readN reads exactly n payload bytes into a new slice.
func (c *replicaConn) readN(n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(c.r, b); err != nil {
		return nil, fmt.Errorf("replica protocol: reading %d payload bytes: %w", n, unexpectedEOF(err))
	}
	return b, nil
}

func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
