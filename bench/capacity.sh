#!/usr/bin/env bash
# bench/capacity.sh: does capacity grow with the cluster? For each mode
# (multicast: the switch floods every VIP packet to every node; routed: the
# lab's router spreads flows with ECMP and each node forwards what it does
# not own to the owner) and each cluster size (1, 2, 3 nodes), one lab with
# the same servers, and wrk from the client on new connections
# ("Connection: close") for DURATION seconds. Per run: requests/s and its
# ratio to the same mode's 1 node; per node, the CPU its processes (the
# HTTP server and the agent) used and the VIP packets its data plane
# judged (those forwarded to it included), both per 1,000 requests; and the
# whole machine's busy CPU per 1,000 requests (softirq included: the lab's
# packet processing runs there and cannot be told apart per node).
#
#   sudo bench/capacity.sh           # DURATION=10 CONNS=32 THREADS=2 SERVER=apache SIZES="1 2 3"
#
# One machine runs the client, the router, the switch and every node: on 2
# cores they share the same CPUs, so requests/s cannot grow with nodes here
# (the cores are the limit, whoever runs on them); what the figures can
# show is where each mode spends the CPU (docs/BENCHMARKS.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
need_root
shoal_bin
need_pkgs wrk:wrk jq:jq

DURATION=${DURATION:-10}
CONNS=${CONNS:-32}
THREADS=${THREADS:-2}
SERVER=${SERVER:-apache}
SIZES=${SIZES:-1 2 3}
OUT=${OUT:-$here/out}
mkdir -p "$OUT"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
md=$OUT/capacity-$stamp.md
work=$(mktemp -d)
cleanup() {
	lab_down
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ns_ticks NS: utime+stime of every process in a namespace, in ticks.
ns_ticks() {
	local p t=0
	for p in $(ip netns pids "$1"); do
		[ -r "/proc/$p/stat" ] && t=$((t + $(proc_ticks "$p" 2>/dev/null || echo 0)))
	done
	echo $t
}

# busy_ticks: the whole machine's non-idle CPU time, in ticks.
busy_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }

# vip_packets SOCK: VIP packets the node's data plane judged (accepted,
# dropped, forwarded on, handed over), those forwarded to it included.
vip_packets() {
	"$SHOAL" --socket "$1" params --json | jq '[.packets[] | .accepted + ([.dropped[]] | add // 0) + (.forwarded // 0) + ([(.handed // {})[]] | add // 0)] | add // 0'
}

{
	echo "# capacity: requests/s and CPU per 1,000 requests by cluster size, multicast and routed"
	echo
	machine
	echo
	echo "command: sudo DURATION=$DURATION CONNS=$CONNS THREADS=$THREADS SERVER=$SERVER bench/capacity.sh"
	echo "load: wrk -t$THREADS -c$CONNS -d${DURATION}s, new connections (Connection: close), from the lab's client namespace"
	echo
	echo "| mode | nodes | requests/s | ratio to 1 node | machine busy ms per 1,000 req | per node: processes' CPU ms per 1,000 req | per node: VIP packets handled per 1,000 req |"
	echo "|---|---|---|---|---|---|---|"
} >"$md"

for mode in multicast routed; do
	base=
	for n in $SIZES; do
		lab_up "$n" --mac-mode "$mode" --server "$SERVER"
		for i in $(seq 1 "$n"); do wait_for 60 eligible_is "${NODE_SOCK[i]}" "$n"; done
		# Warm up (connections, neighbour entries, the router's routes).
		ip netns exec "$CLIENT_NS" wrk -t1 -c4 -d2s -H "Connection: close" "http://$VIP/" >/dev/null 2>&1 || true
		declare -a t0 p0
		for i in $(seq 1 "$n"); do t0[i]=$(ns_ticks "${NODE_NS[i]}"); p0[i]=$(vip_packets "${NODE_SOCK[i]}"); done
		m0=$(busy_ticks)
		out=$(ip netns exec "$CLIENT_NS" wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" -H "Connection: close" "http://$VIP/" 2>&1)
		m1=$(busy_ticks)
		echo "$out" >>"$work/wrk.log"
		total=$(awk '/requests in/ { print $1 }' <<<"$out")
		rps=$(awk '/^Requests\/sec:/ { printf "%.0f", $2 }' <<<"$out")
		hz=$(getconf CLK_TCK)
		cpu=() pk=()
		for i in $(seq 1 "$n"); do
			t1=$(ns_ticks "${NODE_NS[i]}") p1=$(vip_packets "${NODE_SOCK[i]}")
			cpu+=("$(awk -v d=$((t1 - t0[i])) -v hz="$hz" -v r="$total" 'BEGIN { printf "%.1f", 1e6 * d / hz / r }')")
			pk+=("$(awk -v d=$((p1 - p0[i])) -v r="$total" 'BEGIN { printf "%.0f", 1000 * d / r }')")
		done
		busy=$(awk -v d=$((m1 - m0)) -v hz="$hz" -v r="$total" 'BEGIN { printf "%.1f", 1e6 * d / hz / r }')
		[ -z "$base" ] && base=$rps
		ratio=$(awk -v a="$rps" -v b="$base" 'BEGIN { printf "%.2f", a / b }')
		printf '| %s | %d | %s | %s | %s | %s | %s |\n' "$mode" "$n" "$rps" "$ratio" "$busy" "$(IFS=/; echo "${cpu[*]}")" "$(IFS=/; echo "${pk[*]}")" | tee -a "$md" >&2
		lab_down
	done
done
echo >>"$md"
echo "report: $md" >&2
cat "$md"
