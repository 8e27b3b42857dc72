package config

import "github.com/tidwall/gjson"

// The rules a configured endpoint is held to, shared with the discovery sources so that
// a discovered endpoint is held to the same ones.

// Bounds of an endpoint's port and dp_size.
const (
	PortMax   = cfgPortMax
	DPSizeMax = cfgDPSizeMax
)

// HostPort says why s is not a host:port the configuration accepts, naming path.
func HostPort(path, s string) error { return cfgHostPort(path, s) }

// Int reads v as an integer in [lo, hi], naming path in its error.
func Int(path string, v gjson.Result, lo, hi int64) (int64, error) { return cfgInt(path, v, lo, hi) }

// Quote quotes s for an error message, cut short when long.
func Quote(s string) string { return cfgQuote(s) }
