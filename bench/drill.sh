#!/usr/bin/env bash
# bench/drill.sh: one `shoal drill --lab` per scenario (SCENARIOS, default
# plug), new connections and keep-alive, writing the text report, the JSON
# and the SVG plot (and a PNG when rsvg-convert is installed) to OUT.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
need_root
shoal_bin
SCENARIOS=${SCENARIOS:-plug}
DRILL_FLAGS=${DRILL_FLAGS:---duration 8s --lead 2s --concurrency 8 --timeout 1s}
OUT=${OUT:-$here/out}
mkdir -p "$OUT"
machine
for sc in $SCENARIOS; do
	for mode in new keepalive; do
		k=()
		[ $mode = keepalive ] && k=(--keepalive)
		base=$OUT/drill-$sc-$mode
		echo "$SHOAL drill --lab $DRILL_FLAGS ${k[*]} --out-json $base.json --out-svg $base.svg $sc" >&2
		# shellcheck disable=SC2086
		"$SHOAL" drill --lab $DRILL_FLAGS "${k[@]}" --out-json "$base.json" --out-svg "$base.svg" "$sc" | tee "$base.txt"
		if command -v rsvg-convert >/dev/null; then rsvg-convert -o "$base.png" "$base.svg"; fi
	done
done
