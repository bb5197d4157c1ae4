#!/usr/bin/env bash
# bench/run-all.sh: every benchmark, one after the other: the side-by-side
# comparison (compare.sh), the XDP per-packet cost (xdp.sh), failover over
# 20 pulled plugs at the default heartbeat and at 50 ms (failover.sh) and
# the plug drills with their plots (drill.sh). Results go to OUT
# (bench/out); the console log too.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
need_root
shoal_bin
export SHOAL
export OUT=${OUT:-$here/out}
mkdir -p "$OUT"
log=$OUT/run-all-$(date -u +%Y%m%dT%H%M%SZ).log
{
	machine
	"$here/compare.sh"
	"$here/xdp.sh"
	"$here/failover.sh"
	"$here/drill.sh"
} 2>&1 | tee "$log"
echo "log: $log"
