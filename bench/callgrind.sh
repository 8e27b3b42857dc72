#!/bin/bash
# Counts the instructions of 300 requests of the CostRatio 4 KiB stream through one
# compiled module, exactly (callgrind), where timings on a shared machine move by more
# than most changes. Run from the repository root after `make bench` (which builds
# build/kvroute.wasm and build/floor.wasm); needs valgrind.
#   bench/callgrind.sh [kvroute|floor] [out]
# Prints the instructions for the 300 requests and leaves <out>.out (callgrind's profile)
# and <out>.map (wazero's perf map, which names the guest's JIT code by address).
set -eu
name=${1:-kvroute}
out=${2:-build/callgrind-$name}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
CGO_ENABLED=0 go test -tags perfmap -c -o "$tmp/bench.test" ./bench
# GOMAXPROCS=1 and no asynchronous preemption: valgrind 3.19 aborts on Go's signals
# otherwise; cpu.rdtscp=off: it does not know the instruction; GOGC=off: a host
# collection inside the window would add ~30 M.
(cd bench && KVROUTE_CALLGRIND=$name GOGC=off GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off \
	valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.%p" \
	"$tmp/bench.test" -test.run TestCallgrindWindow -test.count=1 >/dev/null 2>"$tmp/err") ||
	{ tail -20 "$tmp/err"; exit 1; }
dump=$(ls -S "$tmp"/cg.*.1 | head -1)
pid=${dump##*/cg.}
pid=${pid%.1}
cp "$dump" "$out.out"
mv "/tmp/perf-$pid.map" "$out.map"
echo "$name: $(grep '^summary' "$out.out" | cut -d' ' -f2) instructions for 300 requests ($out.out, $out.map)"
