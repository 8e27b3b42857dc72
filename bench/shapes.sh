#!/bin/bash
# Replays the generated workloads (kvroute-replay -gen-shape) and the shipped traces on
# seven fleets through one compiled module, at 1x and 2x over DRAWS tie-break draws, and
# writes kvroute's figures and the routing-quality bar's lines to a file: the wider check
# a routing change is measured by before it lands (BENCHMARKS.md says which ran where).
# Run from the repository root after `make build`; about 25 minutes at 2 draws.
#   bench/shapes.sh <module.wasm> <out>       measure (DRAWS=2, FLEETS to override)
#   bench/shapes.sh -compare <before> <after> the rows that moved, and the bar lines
#                                             that changed between PASS and FAIL
# Each row of <out>: trace|fleet flags|speed|mean|p99|hit (kvroute's; * the lowest),
# or bar|trace|fleet flags|speed|figure|PASS or FAIL|the replay's line.
set -eu

if [ "${1:-}" = "-compare" ]; then
	[ $# -eq 3 ] || { echo "usage: $0 -compare <before> <after>" >&2; exit 2; }
	awk -F'|' '
		FNR == NR { if ($1 == "bar") before["bar|" $2 "|" $3 "|" $4 "|" $5] = $6; else before[$1 "|" $2 "|" $3] = $4 " / " $5 " / " $6; next }
		$1 == "bar" {
			k = "bar|" $2 "|" $3 "|" $4 "|" $5
			if (k in before) { bars++; if ($6 == "PASS") pass++; if (before[k] == "PASS") was++
				if (before[k] != $6) flips = flips sprintf("  %s %s %s %s: %s -> %s\n", $2, ($3 == "" ? "(default)" : $3), $4, $5, before[k], $6) }
			next
		}
		{ k = $1 "|" $2 "|" $3; now = $4 " / " $5 " / " $6
		  if (k in before) { rows++; if (before[k] != now) { moved++; printf "%-26s %-20s %s  %s -> %s\n", $1, ($2 == "" ? "(default)" : $2), $3, before[k], now } } }
		END { printf "rows moved: %d of %d\nbar lines met: %d -> %d of %d\n%s", moved, rows, was, pass, bars, flips }
	' "$2" "$3"
	exit 0
fi

[ $# -eq 2 ] || { echo "usage: $0 <module.wasm> <out> | -compare <before> <after>" >&2; exit 2; }
wasm=$1
out=$2
draws=${DRAWS:-2}
mkdir -p build/shapes
go build -o build/kvroute-replay ./cmd/kvroute-replay
shapes=""
for s in apps1 apps2 apps3 apps4 bursts1 bursts2 documents1 documents2 library1 agents1 agents2; do
	f=build/shapes/$s.jsonl
	[ -s "$f" ] || build/kvroute-replay -gen-shape "${s%?}" -seed "${s: -1}" -o "$f" >/dev/null
	shapes="$shapes $f"
done
shipped="testdata/traces/mooncake_synthetic_trace.jsonl testdata/replay/chat_sessions.jsonl"
# The default fleet (4 servers of 2 ranks), then one constraint at a time.
fleets=${FLEETS:-"none|-slow-endpoints 2|-max-running 16|-decode-ms 40|-endpoints 8|-cache-blocks 128|-prefill-ms 0.02"}
: >"$out"
IFS='|' read -r -a fleetList <<<"$fleets"
for fleet in "${fleetList[@]}"; do
	[ "$fleet" = none ] && fleet=""
	traces="$shapes $shipped"
	[ -z "$fleet" ] && traces="$traces testdata/traces/azure_llm_2023_code.csv"
	for trace in $traces; do
		name=$(basename "$trace")
		name=${name%.*}
		# shellcheck disable=SC2086 # the fleet's flags are words
		build/kvroute-replay -wasm "$wasm" -config testdata/replay/kvroute.json -speed 1,2 -draws "$draws" \
			-svg "" $fleet -trace "$trace" 2>&1 |
			awk -v n="$name" -v f="$fleet" '
				/^speed x/ { sp = $2 }
				/^kvroute \(wasm\)/ { gsub(/\[[^]]*\]/, ""); $0 = $0; print n "|" f "|" sp "|" $3 "|" $4 "|" $6 }
				/(PASS|FAIL) +x[0-9], .*TTFT/ {
					v = ($1 == "PASS" || $1 == "FAIL") ? $1 : $2; s = $0; sub(/^ +/, "", s)
					match(s, /x[0-9]/); x = substr(s, RSTART, RLENGTH)
					fig = (s ~ /TTFT mean/) ? "mean" : "p99"
					print "bar|" n "|" f "|" x "|" fig "|" v "|" s
				}' >>"$out"
	done
done
echo "$(grep -vc '^bar|' "$out") rows in $out"
