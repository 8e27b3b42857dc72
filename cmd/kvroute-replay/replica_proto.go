package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// The replica protocol: how the parent (the replicas policy, replicas.go) talks to a
// gateway-replica child (replica_child.go) over the child's stdin and stdout. Every
// message is one JSON object (a replicaMsg); which fields count depends on its kind.
// Bodies and pages are []byte, so any byte may appear in them; the strings (path,
// headers, endpoint, decision, error) must be UTF-8, as they are in every trace.
//
// Parent → child:
//
//	C  index, time_ms, path, headers, body   choose a target for request index
//	F  index, time_ms                        request index's first token (first body chunk)
//	D  index, time_ms                        request index completed
//	S                                        report the filter's counters
//	P  body                                  the metrics page asked for by M
//
// Child → parent:
//
//	M  text                 before a reply: a scrape wants the page of endpoint text
//	T  target, text         the reply to C: target index, decision header
//	ok                      the reply to F and D
//	S  stats                the reply to S
//	E  text                 the child failed; it exits after this
//
// Times are replay milliseconds; encoding/json writes a float64 so that it reads back
// exactly.

// replicaMsg is one protocol message; which fields count depends on Kind.
type replicaMsg struct {
	Kind    string        `json:"kind"` // "C", "F", "D", "S", "P", "M", "T", "ok", "E"
	Index   int           `json:"index,omitempty"`
	TimeMS  float64       `json:"time_ms,omitempty"`
	Path    string        `json:"path,omitempty"`
	Headers [][2]string   `json:"headers,omitempty"`
	Body    []byte        `json:"body"` // C: the request body; P: the page
	Target  int           `json:"target,omitempty"`
	Text    string        `json:"text,omitempty"`  // M: the endpoint; T: the decision; E: the message
	Stats   *replicaStats `json:"stats,omitempty"` // S from the child; nil in the request
}

// replicaConn reads and writes protocol messages on one stream pair.
type replicaConn struct {
	dec *json.Decoder
	enc *json.Encoder
}

func newReplicaConn(r io.Reader, w io.Writer) *replicaConn {
	c := &replicaConn{}
	if r != nil {
		c.dec = json.NewDecoder(r)
	}
	if w != nil {
		c.enc = json.NewEncoder(w)
	}
	return c
}

// Send writes m in one write.
func (c *replicaConn) Send(m *replicaMsg) error {
	if err := c.enc.Encode(m); err != nil {
		return fmt.Errorf("replica protocol: %w", err)
	}
	return nil
}

// Receive reads the next message; io.EOF when the stream ended between messages.
func (c *replicaConn) Receive() (*replicaMsg, error) {
	m := &replicaMsg{}
	if err := c.dec.Decode(m); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		return nil, fmt.Errorf("replica protocol: %w", err)
	}
	if m.Kind == "" {
		return nil, fmt.Errorf("replica protocol: a message without a kind")
	}
	return m, nil
}
