#!/usr/bin/env bash
# bench/idle.sh: the CPU an idle agent uses. Builds a lab of NODES (3)
# nodes, waits until they have converged and accept every bucket, optionally
# fills every node's namespace with SOCKETS unrelated TCP sockets
# (bench/sockfill: loopback connections in TIME_WAIT, or established with
# SOCKMODE=established), then reads every agent's utime+stime from
# /proc/PID/stat over WINDOW (20) seconds and prints, per node, the share of
# one core it used (the Raft leader marked). No traffic flows.
#
#   sudo bench/idle.sh                           # NODES=3 WINDOW=20 SOCKETS=0
#   sudo SOCKETS=100000 bench/idle.sh            # 100,000 TIME_WAIT sockets per node
#   sudo SOCKETS=100000 SOCKMODE=established bench/idle.sh
#   sudo LAB_FLAGS="--mac-mode routed" bench/idle.sh   # any shoal lab up flags
#
# PROFILE=DIR also takes a 20 s CPU profile of every agent with perf (when
# installed), for `perf report -i DIR/nodeN.perf`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
need_root
shoal_bin
need_pkgs jq:jq

NODES=${NODES:-3}
WINDOW=${WINDOW:-20}
SOCKETS=${SOCKETS:-0}
SOCKMODE=${SOCKMODE:-timewait}
OUT=${OUT:-$here/out}
mkdir -p "$OUT"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
md=$OUT/idle-$stamp.md
work=$(mktemp -d)
pids=()

cleanup() {
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	lab_down
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
lab_up "$NODES" ${LAB_FLAGS:-}
for i in $(seq 1 "$NODES"); do wait_for 60 eligible_is "${NODE_SOCK[i]}" "$NODES"; done

if [ "$SOCKETS" -gt 0 ]; then
	(cd "$here/.." && go build -o "$work/sockfill" ./bench/sockfill)
	for i in $(seq 1 "$NODES"); do
		ip netns exec "${NODE_NS[i]}" "$work/sockfill" -mode "$SOCKMODE" -count "$SOCKETS" >"$work/fill$i.out" &
		pids+=($!)
	done
	for i in $(seq 1 "$NODES"); do wait_for 120 grep -q ready "$work/fill$i.out"; done
fi

# tcp_sockets NS: TCP sockets in a namespace (every state).
tcp_sockets() { ip netns exec "$1" ss -Htan | wc -l; }

leader=$("$SHOAL" --socket "${NODE_SOCK[1]}" query --json | jq -r .leader)
pid=() t0=() t1=() s0=()
for i in $(seq 1 "$NODES"); do
	pid[$i]=$(agent_pid "node$i")
	s0[$i]=$(tcp_sockets "${NODE_NS[i]}")
done
if [ -n "${PROFILE:-}" ] && command -v perf >/dev/null; then
	mkdir -p "$PROFILE"
	for i in $(seq 1 "$NODES"); do
		perf record -q -F 499 -g -p "${pid[i]}" -o "$PROFILE/node$i.perf" -- sleep "$WINDOW" 2>/dev/null &
		pids+=($!)
	done
fi
start=$(now_s)
for i in $(seq 1 "$NODES"); do t0[$i]=$(proc_ticks "${pid[i]}"); done
sleep "$WINDOW"
for i in $(seq 1 "$NODES"); do t1[$i]=$(proc_ticks "${pid[i]}"); done
end=$(now_s)
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

{
	echo "# shoal bench/idle.sh, $stamp"
	echo
	machine
	echo "lab $LAB_ID, $NODES nodes, idle (no traffic), window ${WINDOW}s, unrelated sockets per node: $SOCKETS ($SOCKMODE), load before $load_before, after $load_after"
	echo
	echo "| node | Raft leader | TCP sockets in its namespace | agent CPU (% of one core) |"
	echo "|---|---|---|---|"
	for i in $(seq 1 "$NODES"); do
		lead=
		case $leader in "node$i" | "${NODE_ADDR[i]}":*) lead=yes ;; esac
		echo "| node$i | $lead | ${s0[i]} | $(cpu_pct "${t0[i]}" "${t1[i]}" "$start" "$end") |"
	done
} | tee "$md"
echo "results: $md" >&2
