#!/usr/bin/env bash
# bench/falsedeaths.sh: false deaths of live nodes in a 3-node lab over
# DURATION seconds (600) at heartbeat period PERIOD (20ms: the fast
# profile, 20 ms x 12), under MODE:
#   loss  LOSS% (20) of the heartbeats every node receives dropped, each
#         on its own (an nftables rule in every node namespace:
#         udp dport 7946 numgen random mod N == 0 drop, N = 100/LOSS)
#   burn  both cores kept busy by BURNERS (one per CPU) busy loops at nice
#         0 that this script starts and kills by PID
#   both  loss and burn at once
#   idle  neither (the baseline)
# No node fails during the run, so every "dead: no heartbeat" view change
# an agent logs is a false death; the script counts them per node, and the
# view changes of any cause. Prints one JSON line; needs root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
need_root
shoal_bin
MODE=${MODE:-loss}
PERIOD=${PERIOD:-20ms}
DURATION=${DURATION:-600}
LOSS=${LOSS:-20}
BURNERS=${BURNERS:-$(nproc)}
case $MODE in loss | burn | both | idle) ;; *) echo "MODE=$MODE: want loss, burn, both or idle" >&2; exit 2 ;; esac
lossy() { [ "$MODE" = loss ] || [ "$MODE" = both ]; }
busy() { [ "$MODE" = burn ] || [ "$MODE" = both ]; }
if lossy && { [ "$LOSS" -le 0 ] || [ $((100 % LOSS)) != 0 ]; }; then
	echo "LOSS=$LOSS: want a divisor of 100 (numgen mod 100/LOSS)" >&2
	exit 2
fi
logs=$(mktemp -d /tmp/shoal-falsedeaths.XXXXXX)
burners=()
cleanup() {
	for p in "${burners[@]}"; do kill "$p" 2>/dev/null || true; done
	lab_down
}
trap cleanup EXIT
machine >&2
echo "load before: $(cat /proc/loadavg)" >&2
lab_up 3 --period "$PERIOD" --keep-logs "$logs"
read -r period tolerance < <(heartbeat_settings "${NODE_SOCK[1]}")
echo "heartbeat $period x $tolerance, mode $MODE, $DURATION s" >&2
if lossy; then
	for i in 1 2 3; do
		ip netns exec "${NODE_NS[i]}" nft -f - <<EOF
table inet shoal_falsedeaths {
	chain input {
		type filter hook input priority 0; policy accept;
		udp dport 7946 numgen random mod $((100 / LOSS)) == 0 counter drop
	}
}
EOF
	done
fi
if busy; then
	for _ in $(seq "$BURNERS"); do
		nice -n 0 sh -c 'while :; do :; done' &
		burners+=($!)
	done
fi
# Every agent's log from the start of the run on: the counts below are of
# what happened during it.
declare -A from
state=/run/shoal-lab/$LAB_ID.json
for i in 1 2 3; do
	f=$(jq -r --arg h "node$i" '.processes[] | select(.role == "agent" and .host == $h) | .log' "$state")
	from[$i]=$(wc -l <"$f")
done
start=$(now_s)
sleep "$DURATION"
end=$(now_s)
dropped=0
if lossy; then
	for i in 1 2 3; do
		n=$(ip netns exec "${NODE_NS[i]}" nft list table inet shoal_falsedeaths | sed -n 's/.*counter packets \([0-9]*\).*/\1/p')
		dropped=$((dropped + ${n:-0}))
	done
fi
echo "load after: $(cat /proc/loadavg)" >&2
deaths=() changes=()
for i in 1 2 3; do
	f=$(jq -r --arg h "node$i" '.processes[] | select(.role == "agent" and .host == $h) | .log' "$state")
	tail -n +"$((from[$i] + 1))" "$f" >"$logs/run-node$i.log"
	deaths+=("$(grep -c 'dead: no heartbeat' "$logs/run-node$i.log" || true)")
	changes+=("$(grep -c 'msg="view changed"' "$logs/run-node$i.log" || true)")
done
total=$((deaths[0] + deaths[1] + deaths[2]))
printf '{"mode":"%s","period":"%s","tolerance":%s,"seconds":%.0f,"loss_pct":%s,"burners":%s,"heartbeats_dropped":%s,"false_deaths":%s,"false_deaths_per_node":[%s],"view_changes_per_node":[%s],"logs":"%s"}\n' \
	"$MODE" "$period" "$tolerance" "$(awk -v a="$start" -v b="$end" 'BEGIN{print b-a}')" \
	"$(lossy && echo "$LOSS" || echo 0)" "$(busy && echo "$BURNERS" || echo 0)" \
	"$dropped" "$total" "$(IFS=,; echo "${deaths[*]}")" "$(IFS=,; echo "${changes[*]}")" "$logs"
