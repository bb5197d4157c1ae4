#!/usr/bin/env bash
# bench/idle-ab.sh: idle agents of several builds side by side. Builds one
# 3-node lab per shoal binary given, all at once, waits until each has
# converged, then reads every agent's utime+stime from /proc/PID/stat over
# the same WINDOW (40) seconds, so that the builds are compared under the
# same machine load (bench/idle.sh measures one build). BIN@N runs that
# build's agents with GOMAXPROCS=N. SOCKETS=N first fills every node's
# namespace of every lab with N unrelated TCP sockets (bench/sockfill, in
# TIME_WAIT, or established with SOCKMODE=established), as bench/idle.sh.
#
#   sudo bench/idle-ab.sh /tmp/shoal-before bin/shoal
#   sudo bench/idle-ab.sh bin/shoal bin/shoal@1
#   sudo SOCKETS=100000 bench/idle-ab.sh /tmp/shoal-before bin/shoal
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
need_root
need_pkgs jq:jq
[ $# -gt 0 ] || { echo "usage: $0 SHOAL_BINARY[@GOMAXPROCS]..." >&2; exit 2; }
WINDOW=${WINDOW:-40}
SOCKETS=${SOCKETS:-0}
SOCKMODE=${SOCKMODE:-timewait}
labs=() bins=() fills=()
work=$(mktemp -d)
cleanup() {
	local i p
	for p in "${fills[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${fills[@]}"; do wait "$p" 2>/dev/null || true; done
	for i in "${!labs[@]}"; do "${bins[i]}" lab down "${labs[i]}" >/dev/null 2>&1 || true; done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

declare -A pid lead ns
for v in "$@"; do
	SHOAL=$(readlink -f "${v%@*}")
	case $v in *@*) export GOMAXPROCS=${v##*@} ;; *) unset GOMAXPROCS ;; esac
	lab_up 3
	labs+=("$LAB_ID") bins+=("$SHOAL")
	unset GOMAXPROCS
	for i in 1 2 3; do wait_for 60 eligible_is "${NODE_SOCK[i]}" 3; done
	lead[$v]=$("$SHOAL" --socket "${NODE_SOCK[1]}" query --json | jq -r .leader)
	for i in 1 2 3; do pid[$v,$i]=$(agent_pid "node$i"); done
	for i in 1 2 3; do ns[$v,$i]=${NODE_NS[i]}; done
done
if [ "$SOCKETS" -gt 0 ]; then
	(cd "$here/.." && go build -o "$work/sockfill" ./bench/sockfill)
	for k in "${!ns[@]}"; do
		ip netns exec "${ns[$k]}" "$work/sockfill" -mode "$SOCKMODE" -count "$SOCKETS" >"$work/fill-${k//[^a-z0-9]/_}.out" &
		fills+=($!)
	done
	for k in "${!ns[@]}"; do wait_for 300 grep -q ready "$work/fill-${k//[^a-z0-9]/_}.out"; done
fi
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
declare -A t0 t1
for k in "${!pid[@]}"; do t0[$k]=$(proc_ticks "${pid[$k]}"); done
start=$(now_s)
sleep "$WINDOW"
for k in "${!pid[@]}"; do t1[$k]=$(proc_ticks "${pid[$k]}"); done
end=$(now_s)
machine
echo "$# labs of 3 nodes side by side, idle, unrelated sockets per node: $SOCKETS ($SOCKMODE), window ${WINDOW}s, load before $load_before, after $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| build | node1 | node2 | node3 | Raft leader |"
echo "|---|---|---|---|---|"
for v in "$@"; do
	row="| $v"
	for i in 1 2 3; do row="$row | $(cpu_pct "${t0[$v,$i]}" "${t1[$v,$i]}" "$start" "$end")"; done
	echo "$row | ${lead[$v]} |"
done
