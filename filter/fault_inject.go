package main

import "github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"

// faultProperty is the host property that arms an injected fault in a test build.
const faultProperty = "kvroute_test_fault"

// injectFaults makes the filter's clock panic once each time the host property
// kvroute_test_fault is "1" (it sets it back to "0" first): the clock is read in
// every callback, so a test can prove the recovery of each one. Only the tests of the
// Go plugin and a module built with the kvroute_faults tag (make test builds
// build/kvroute-faults.wasm) call it; the shipped module never does.
func injectFaults() {
	clock := nowMS
	nowMS = func() int64 {
		if v, err := proxywasm.GetProperty([]string{faultProperty}); err == nil && string(v) == "1" {
			_ = proxywasm.SetProperty([]string{faultProperty}, []byte("0"))
			panic("injected fault")
		}
		return clock()
	}
}
