package main

import (
	"fmt"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
)

// failLogPeriodMS is the least time between two fail-open log lines of one VM. A fault
// that repeats on every request must not flood Envoy's log: the counter
// kvroute_fail_open counts every one, the log shows at most one a second.
const failLogPeriodMS = 1000

// failLimiter lets one line through per failLogPeriodMS and counts the lines it holds
// back, so the next line can say how many there were.
type failLimiter struct {
	next       int64 // the time (ms) from which the next line may be written
	suppressed int   // lines held back since the last one written
}

// allow says whether a line may be written at now and, if so, how many were held
// back before it.
func (l *failLimiter) allow(now int64) (ok bool, suppressed int) {
	if l.next != 0 && now < l.next && now >= l.next-failLogPeriodMS {
		l.suppressed++
		return false, 0
	}
	suppressed, l.suppressed = l.suppressed, 0
	l.next = now + failLogPeriodMS
	return true, suppressed
}

// failLog is the VM's limiter (each VM is one wasm instance, so a global is per VM).
var failLog failLimiter

// logFailOpen writes a fail-open error line, at most one per failLogPeriodMS.
func logFailOpen(format string, args ...any) {
	ok, suppressed := failLog.allow(nowMS())
	if !ok {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if suppressed > 0 {
		msg += fmt.Sprintf(" (%d similar lines suppressed since the last one)", suppressed)
	}
	proxywasm.LogError(msg)
}
