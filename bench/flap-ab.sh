#!/usr/bin/env bash
# bench/flap-ab.sh: what a view change costs the whole cluster, build
# against build. For each shoal binary given, in turn and ROUNDS times
# alternating (one lab at a time, nothing else running), it builds an
# N-node lab (a server on the first SERVERS nodes), lets it settle, then:
#
#   - at rest, over WINDOW (20) s: the CPU of every agent together
#     (utime+stime from /proc/PID/stat), as % of one core per agent;
#   - FLAPS (3) times, the last node's plug pulled at the lab's switch for
#     3 s and put back, 4 s more: the agents' CPU-seconds together above
#     what the same time at rest costs, per flap (a pull is one view change
#     without the node, the plug one with it again);
#   - RULES (2) times, a port rule (VIP:8080) added through node1 and
#     removed 5 s later, 5 s more: the same, per rule change (each remaps
#     the flows of the VIP's port 8080 and moves them between the nodes).
#
#   sudo bench/flap-ab.sh /tmp/shoal-before bin/shoal
#   sudo NODES=16 ROUNDS=1 bench/flap-ab.sh bin/shoal
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
need_root
need_pkgs jq:jq
[ $# -gt 0 ] || { echo "usage: $0 SHOAL_BINARY..." >&2; exit 2; }
NODES=${NODES:-32}
SERVERS=${SERVERS:-8}
WINDOW=${WINDOW:-20}
FLAPS=${FLAPS:-3}
RULES=${RULES:-2}
ROUNDS=${ROUNDS:-2}
SETTLE=${SETTLE:-15}
trap lab_down EXIT
trap 'exit 130' INT TERM

# agents_ticks: every agent of the lab's utime+stime, summed.
agents_ticks() {
	local t=0 p
	for p in $(jq -r '.processes[] | select(.role == "agent") | .pid' "/run/shoal-lab/$LAB_ID.json"); do
		t=$((t + $(proc_ticks "$p")))
	done
	echo "$t"
}

# flap NODE: its plug out for 3 s, then back, and 4 s more.
flap() {
	ip netns exec "$SW_NS" ip link set "p-$1" down
	sleep 3
	ip netns exec "$SW_NS" ip link set "p-$1" up
	sleep 4
}

# rule_change: a port rule added, 5 s, removed, 5 s.
rule_change() {
	"$SHOAL" --socket "${NODE_SOCK[1]}" rules add --vip "$VIP" --ports 8080 --affinity none >/dev/null
	sleep 5
	"$SHOAL" --socket "${NODE_SOCK[1]}" rules remove "$VIP:8080" >/dev/null
	sleep 5
}

# above_rest T0 T1 S0 S1 K: the CPU-s of the ticks between T0 and T1 over
# the seconds S0 to S1, less what rest costs in that time, per each of K.
above_rest() {
	awk -v d=$(($2 - $1)) -v hz="$hz" -v a="$3" -v b="$4" -v r="$rest" -v k="$5" 'BEGIN { printf "%.2f", (d / hz - r * (b - a)) / k }'
}

hz=$(getconf CLK_TCK)
echo "| build | round | nodes | idle CPU per agent, % of a core | CPU-s of all agents per flap, above rest | per rule change, above rest |"
echo "|---|---|---|---|---|---|"
for round in $(seq 1 "$ROUNDS"); do
	for b in "$@"; do
		SHOAL=$(readlink -f "$b")
		lab_up "$NODES" --servers "$SERVERS"
		sleep "$SETTLE"
		t0=$(agents_ticks) s0=$(now_s)
		sleep "$WINDOW"
		t1=$(agents_ticks) s1=$(now_s)
		rest=$(awk -v d=$((t1 - t0)) -v hz="$hz" -v a="$s0" -v b="$s1" 'BEGIN { print d / hz / (b - a) }') # CPU-s a second
		idle=$(awk -v r="$rest" -v n="$NODES" 'BEGIN { printf "%.2f", 100 * r / n }')
		f0=$(agents_ticks) s0=$(now_s)
		for _ in $(seq 1 "$FLAPS"); do flap "node$NODES"; done
		f1=$(agents_ticks) s1=$(now_s)
		per=$(above_rest "$f0" "$f1" "$s0" "$s1" "$FLAPS")
		sleep "$SETTLE"
		r0=$(agents_ticks) s0=$(now_s)
		for _ in $(seq 1 "$RULES"); do rule_change; done
		r1=$(agents_ticks) s1=$(now_s)
		rule=$(above_rest "$r0" "$r1" "$s0" "$s1" $((2 * RULES)))
		echo "| $b | $round | $NODES | $idle | $per | $rule |"
		lab_down
	done
done
