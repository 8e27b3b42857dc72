package bench

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// TestCallgrindWindow runs the 4 KiB CostRatio stream through one module for
// bench/callgrind.sh, which runs it under valgrind: 2 000 requests of warm-up, then
// 300 counted, with callgrind's counters zeroed before and dumped after them.
// KVROUTE_CALLGRIND names the module (build/<name>.wasm: kvroute or floor); without
// it the test is skipped.
func TestCallgrindWindow(t *testing.T) {
	name := os.Getenv("KVROUTE_CALLGRIND")
	if name == "" {
		t.Skip("KVROUTE_CALLGRIND not set: run bench/callgrind.sh")
	}
	bodies := conversationTurns(4<<10, costConversations, 16384)
	vm := freshVM(t, name)
	defer vm.Close()
	cfg := fleetConfig(4, 2)
	if name == "floor" {
		cfg = ""
	}
	e := startOn(t, vm, cfg)
	defer e.close()
	for i := 0; i < 2000; i++ {
		e.exchange("/v1/chat/completions", bodies[i%len(bodies)])
	}
	pid := strconv.Itoa(os.Getpid())
	if err := exec.Command("callgrind_control", "-z", pid).Run(); err != nil {
		t.Fatalf("callgrind_control -z: %v (run under bench/callgrind.sh)", err)
	}
	for i := 0; i < 300; i++ {
		e.exchange("/v1/chat/completions", bodies[(2000+i)%len(bodies)])
		if name != "floor" && i%ticksEvery == ticksEvery-1 {
			e.Tick()
		}
	}
	if err := exec.Command("callgrind_control", "-d", pid).Run(); err != nil {
		t.Fatalf("callgrind_control -d: %v", err)
	}
}
