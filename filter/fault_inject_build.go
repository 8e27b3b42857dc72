//go:build kvroute_faults

package main

func init() { injectFaults() }
