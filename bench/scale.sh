#!/usr/bin/env bash
# bench/scale.sh: the costs that grow with the cluster, per node, as
# functions of N. For each N in SIZES (3 8 16 32 64), one lab at a time and
# nothing else running, it builds an N-node lab (built-in server, agents at
# debug log level), waits until every node is in every view, then:
#
#   - idle, over WINDOW (20) s: each agent's CPU (utime+stime, % of one
#     core), resident memory, and heartbeat datagrams and bytes received a
#     second (the agent's own counters); median over the nodes, the busiest,
#     and the Raft leader's apart (it also sends Raft's heartbeats);
#   - a rule change: a port rule added through node1, and the time until
#     every node's tables are under it (p50 and max over the nodes, from
#     the agents' debug logs: bench/scalelog);
#   - a view change: node N's plug pulled; the time until every other node
#     pushed tables without it, and how long recomputing and pushing took
#     after the view was adopted (p50 and max).
#
#   sudo bench/scale.sh                      # SIZES="3 8 16 32 64" WINDOW=20 SERVERS=8
#   sudo SIZES="3 16" WINDOW=10 bench/scale.sh
#
# A server runs on the first SERVERS nodes only (shoal lab up --servers;
# the others at weight 0): what is measured is the agents, and 64 servers
# beside 64 agents on two cores only add to the load of a rule change.
#
# It prints a Markdown table (also in bench/out/scale-*.md) and an ASCII
# plot of the idle CPU per agent. A size whose lab does not come up is
# reported as such and the next one runs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
need_root
shoal_bin
need_pkgs jq:jq

SIZES=${SIZES:-3 8 16 32 64}
WINDOW=${WINDOW:-20}
SERVERS=${SERVERS:-8}
OUT=${OUT:-$here/out}
mkdir -p "$OUT"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
md=$OUT/scale-$stamp.md
work=$(mktemp -d)
(cd "$here/.." && go build -o "$work/scalelog" ./bench/scalelog)
cleanup() {
	lab_down
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
export SHOAL_LOG_LEVEL=debug

# median and max of numbers on stdin.
stats() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) { print "- -"; exit } printf "%s %s\n", v[int((NR + 1) / 2)], v[NR] }'; }
# hb NODE FIELD: a heartbeat counter from the agent's params.
hb() { "$SHOAL" --socket "${NODE_SOCK[$1]}" params --json | jq -r ".heartbeat.$2 // 0"; }
rss_mb() { awk '/^VmRSS:/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }
iso() { date -u +%Y-%m-%dT%H:%M:%S.%NZ; }

{
	echo "# shoal bench/scale.sh, $stamp"
	echo
	echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), kernel $(uname -r); idle window ${WINDOW}s; median (max) over the nodes, the Raft leader apart"
	echo
	echo "| nodes | agent CPU idle, % of a core | leader's CPU | RSS MB | heartbeats received /s | bytes received /s | rule change -> every node's tables, ms p50 (max) | view change (plug pulled) -> every node's tables, ms p50 (max) | recompute + push after adopting, ms p50 (max) |"
	echo "|---|---|---|---|---|---|---|---|---|"
} | tee "$md"

plot=()
for n in $SIZES; do
	if ! lab_up "$n" --servers $((n < SERVERS ? n : SERVERS)); then
		echo "| $n | lab did not come up (shoal lab up --nodes $n) | | | | | | | |" | tee -a "$md"
		continue
	fi
	dir=$(jq -r .dir "/run/shoal-lab/$LAB_ID.json")
	ok=1
	for i in $(seq 1 "$n"); do wait_for $((60 + n)) eligible_is "${NODE_SOCK[i]}" "$n" || { ok=0; break; }; done
	if [ $ok = 0 ]; then
		echo "| $n | not every node in every view within $((60 + n)) s | | | | | | | |" | tee -a "$md"
		lab_down
		continue
	fi
	sleep 5
	leader=$("$SHOAL" --socket "${NODE_SOCK[1]}" query --json | jq -r .leader)
	pid=() t0=() t1=() r0=() r1=() b0=() b1=()
	for i in $(seq 1 "$n"); do
		pid[i]=$(agent_pid "node$i")
		r0[i]=$(hb "$i" received)
		b0[i]=$(hb "$i" received_bytes)
		t0[i]=$(proc_ticks "${pid[i]}")
	done
	start=$(now_s)
	sleep "$WINDOW"
	end=$(now_s)
	for i in $(seq 1 "$n"); do
		t1[i]=$(proc_ticks "${pid[i]}")
		r1[i]=$(hb "$i" received)
		b1[i]=$(hb "$i" received_bytes)
	done
	: >"$work/cpu" >"$work/rss" >"$work/rx" >"$work/bytes"
	lcpu=-
	for i in $(seq 1 "$n"); do
		c=$(cpu_pct "${t0[i]}" "${t1[i]}" "$start" "$end")
		if [ "node$i" = "$leader" ]; then lcpu=$c; else echo "$c" >>"$work/cpu"; fi
		rss_mb "${pid[i]}" >>"$work/rss"
		echo >>"$work/rss"
		awk -v a="${r0[i]}" -v b="${r1[i]}" -v s="$start" -v e="$end" 'BEGIN { printf "%.0f\n", (b - a) / (e - s) }' >>"$work/rx"
		awk -v a="${b0[i]}" -v b="${b1[i]}" -v s="$start" -v e="$end" 'BEGIN { printf "%.0f\n", (b - a) / (e - s) }' >>"$work/bytes"
	done
	read -r cmed cmax < <(stats <"$work/cpu")
	read -r rmed rmax < <(grep . "$work/rss" | stats)
	read -r xmed _ < <(stats <"$work/rx")
	read -r ymed _ < <(stats <"$work/bytes")

	# A rule change through node1.
	t=$(iso)
	"$SHOAL" --socket "${NODE_SOCK[1]}" rules add --vip "$VIP" --ports 8080 --proto tcp --mode multiple --affinity none >/dev/null
	idx=$("$SHOAL" --socket "${NODE_SOCK[1]}" status --json | jq -r .rules_index)
	sleep 3
	rule=$("$work/scalelog" -since "$t" -rules "$idx" "$dir"/node*.agent.log 2>/dev/null | awk '{ printf "%s (%s)", $4, $6 }') || rule="not every node within 3 s"

	# A view change: node n's plug pulled.
	t=$(iso)
	"$SHOAL" --socket "${NODE_SOCK[n]}" plug pull >/dev/null
	sleep 3
	logs=()
	for i in $(seq 1 $((n - 1))); do logs+=("$dir/node$i.agent.log"); done
	if view=$("$work/scalelog" -since "$t" -without "$n" "${logs[@]}" 2>/dev/null); then
		reach=$(awk '{ printf "%s (%s)", $4, $6 }' <<<"$view")
		apply=$(awk '{ printf "%s (%s)", $9, $11 }' <<<"$view")
	else
		reach="not every node within 3 s" apply=-
	fi
	"$SHOAL" --socket "${NODE_SOCK[n]}" plug restore >/dev/null || true

	echo "| $n | $cmed ($cmax) | $lcpu | $rmed ($rmax) | $xmed | $ymed | $rule | $reach | $apply |" | tee -a "$md"
	plot+=("$n $cmed")
	lab_down
done

{
	echo
	echo "idle CPU per agent (median, % of one core), one # per 0.05%:"
	echo '```'
	for p in "${plot[@]}"; do
		set -- $p
		printf "%4s nodes %6s%% " "$1" "$2"
		awk -v c="$2" 'BEGIN { n = int(c / 0.05 + 0.5); s = ""; for (i = 0; i < n; i++) s = s "#"; print s }'
	done
	echo '```'
} | tee -a "$md"
echo "results: $md"
