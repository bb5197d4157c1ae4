#!/usr/bin/env bash
# bench/failover.sh: failover time (plug pulled -> every bucket owned again)
# over CYCLES pulled plugs (20) in one 3-node lab, with full re-convergence
# between pulls, at the agents' default heartbeat period and at 50 ms (or
# the periods in PERIODS, "default" for the agent's). The defaults are read
# from the cluster (`shoal query --json`), never assumed. Results go to
# OUT (bench/out) as JSON, one line per period.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
need_root
shoal_bin
CYCLES=${CYCLES:-20}
PERIODS=${PERIODS:-default 50ms}
OUT=${OUT:-$here/out}
mkdir -p "$OUT"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out=$OUT/failover-$stamp.jsonl
helper=$(mktemp -d)/failover
trap 'rm -rf "$(dirname "$helper")"' EXIT
(cd "$here/.." && go build -o "$helper" ./bench/failover)
machine
for p in $PERIODS; do
	args=(--binary "$SHOAL" --cycles "$CYCLES" --json)
	[ "$p" != default ] && args+=(--period "$p")
	echo "failover, heartbeat period $p: $helper ${args[*]}" >&2
	"$helper" "${args[@]}" | tee -a "$out"
done
echo "results: $out" >&2
