package config

import (
	"net"
	"strings"
	"testing"
)

func FuzzParseConfig(f *testing.F) {
	for _, seed := range []string{
		``,
		`{}`,
		`[]`,
		`null`,
		cfgMinimal,
		cfgDecode(`{"address":"[::1]:8000","dp_size":8}`),
		`{"pools":{"decode":{"endpoints":[{"address":"a:1"}]},"prefill":{"endpoints":[{"address":"p:1","bootstrap_port":8998}]}},"disaggregation":{"mode":"sglang","threshold_tokens":1024}}`,
		cfgWith(`"routes":["/v1/chat/completions"],"prefix":{"block_tokens":32,"match_rate_threshold":0.5},"headers":{"decision":""}`),
		cfgWith(`"engine_metrics":{"enabled":true,"interval_ms":500,"stale_ms":2000},"state":{"namespace":"ns"}`),
		cfgWith(`"health":{"failure_statuses":[500,1e2]},"balance":{"load_weight":1e-3}`),
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			msg := err.Error()
			if msg == "" || strings.ContainsAny(msg, "\r\n") || !strings.Contains(msg, ": ") {
				t.Fatalf("bad error message %q", msg)
			}
			return
		}
		if len(c.Pools.Decode.Endpoints) < 1 {
			t.Fatalf("parsed config without a decode endpoint: %q", data)
		}
		for _, e := range c.Pools.Decode.Endpoints {
			if e.Address == "" || e.DPSize < 1 {
				t.Fatalf("bad decode endpoint %+v", e)
			}
		}
		if c.Disaggregation.Mode != ModeOff && len(c.Pools.Prefill.Endpoints) == 0 {
			t.Fatalf("mode %q without prefill endpoints", c.Disaggregation.Mode)
		}
	})
}

// splitHostPort stands in for net.SplitHostPort (package net is kept out of the
// module); it must split exactly as net does.
func FuzzSplitHostPortAgreesWithNet(f *testing.F) {
	for _, s := range []string{"10.0.0.1:8000", "[::1]:80", "[::1]", "::1:80", "host:", ":80",
		"[a]:b:c", "a]:80", "[a:80", "a[b]:80", "[::1]x:80", "[[::1]]:80", "[::1]:8]0", "h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		host, port, ok := splitHostPort(s)
		wantHost, wantPort, err := net.SplitHostPort(s)
		if ok != (err == nil) || ok && (host != wantHost || port != wantPort) {
			t.Fatalf("splitHostPort(%q) = %q, %q, %v; net says %q, %q, %v", s, host, port, ok, wantHost, wantPort, err)
		}
	})
}
