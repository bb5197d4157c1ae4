#!/usr/bin/env bash
# bench/routed-drills.sh: every planned change in routed mode, with
# forwarding to the owner and without (plain ECMP), side by side. Each
# drill builds a 3-node routed lab (FRR in front of the nodes), holds HELD
# keep-alive connections (a request on each every 100 ms) beside a
# new-connection load (2 s client timeout), applies the change to node3
# after the lead, and reports failed requests, requests delayed by a SYN
# retransmission and held connections broken.
#
#   sudo bench/routed-drills.sh      # HELD=30 SERVER=apache DURATION=8s SCENARIOS="drainstop join weight rule rehash sigterm restart"
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
need_root
shoal_bin
need_pkgs jq:jq vtysh:frr

HELD=${HELD:-30}
SERVER=${SERVER:-apache}
DURATION=${DURATION:-8s}
SCENARIOS=${SCENARIOS:-drainstop join weight rule rehash sigterm restart}
OUT=${OUT:-$here/out}
mkdir -p "$OUT"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
md=$OUT/routed-drills-$stamp.md
{
	echo "# routed mode: planned changes with and without forwarding to the owner"
	echo
	machine
	echo
	echo "command: sudo HELD=$HELD SERVER=$SERVER DURATION=$DURATION bench/routed-drills.sh"
	echo "each: shoal drill --lab --mode routed --server $SERVER --held $HELD --duration $DURATION --json [--no-forward] SCENARIO"
	echo
	echo "| scenario | forwarding | requests | failed | delayed (SYN retransmitted) | held broken | of which on node3 | settled ms |"
	echo "|---|---|---|---|---|---|---|---|"
} >"$md"
for sc in $SCENARIOS; do
	for fwd in on off; do
		flag=()
		[ "$fwd" = off ] && flag=(--no-forward)
		js=$OUT/routed-drill-$sc-$fwd-$stamp.json
		"$SHOAL" drill --lab --mode routed --server "$SERVER" --held "$HELD" --duration "$DURATION" --json "${flag[@]}" "$sc" >"$js" 2>/dev/null || true
		if ! jq -e . "$js" >/dev/null 2>&1; then
			printf '| %s | %s | (drill failed) | | | | | |\n' "$sc" "$fwd" | tee -a "$md" >&2
			continue
		fi
		jq -r --arg sc "$sc" --arg fwd "$fwd" '"| \($sc) | \($fwd) | \(.requests) | \(.failures) | \(.syn_delayed) | \(.held.broken // "-") | \([(.held.broken_list // [])[] | select(startswith("opened on node3"))] | length) | \(.settled_ms) |"' "$js" | tee -a "$md" >&2
	done
done
echo >>"$md"
echo "report: $md" >&2
cat "$md"
