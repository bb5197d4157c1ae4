#!/usr/bin/env bash
# bench/compare.sh: requests/s and latency (p50, p99) with wrk and ab, on new
# connections and on keep-alive, through
#   (a) the shoal VIP with 2 nodes,
#   (b) HAProxy (roundrobin; http mode, or tcp mode with HAPROXY_MODE=tcp)
#       in its own namespace on the lab's switch, in front of the same 2
#       backends,
#   (c) straight to one backend,
#   (d) the shoal VIP with 1 node (the other stopped with `shoal stop --node`),
# all in one lab, from the same client namespace, in one run; then the ratios
# a/b (target >= 1.8) and d/c (target >= 0.97) per tool and connection mode.
#
# The backends are the lab's HTTP servers (`shoal lab serve`): each node runs
# one on VIP:80 (what the VIP reaches) and this script starts a second one,
# the same program, on the node's own address, port 8080 (what HAProxy and
# the direct runs reach).
#
# Environment: SHOAL (binary; bin/shoal), ROUNDS (2), DURATION (wrk seconds,
# 10), CONNS (concurrent connections, 32), THREADS (wrk threads, 2), AB_N
# (ab requests per run, 20000), HAPROXY_MODE (http or tcp, http), OUT
# (where results go, bench/out). In http mode HAProxy keeps its connections
# to the backends alive even when the client closes each one; in tcp mode
# every client connection is one backend connection, as through the VIP.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
need_root
shoal_bin
need_pkgs wrk:wrk ab:apache2-utils haproxy:haproxy jq:jq

ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-10}
CONNS=${CONNS:-32}
THREADS=${THREADS:-2}
AB_N=${AB_N:-20000}
HAPROXY_MODE=${HAPROXY_MODE:-http}
case $HAPROXY_MODE in http | tcp) ;; *) echo "HAPROXY_MODE: http or tcp" >&2; exit 2 ;; esac
OUT=${OUT:-$here/out}
mkdir -p "$OUT"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
tsv=$OUT/compare-$stamp.tsv
md=$OUT/compare-$stamp.md
work=$(mktemp -d)
pids=()
HAP_NS=

cleanup() {
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	if [ -n "$HAP_NS" ]; then ip netns del "$HAP_NS" 2>/dev/null || true; fi
	lab_down
	[ -n "${KEEP_WORK:-}" ] && echo "work dir kept: $work" >&2 || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

lab_up 2
S1=${NODE_SOCK[1]}
APID=("" "$(agent_pid node1)" "$(agent_pid node2)")

# A second HTTP server per node on its own address, for HAProxy and (c).
for i in 1 2; do
	ip netns exec "${NODE_NS[i]}" "$SHOAL" lab serve --name "node$i" --listen "${NODE_ADDR[i]}:8080" \
		>"$work/serve$i.log" 2>&1 &
	pids+=($!)
done

# HAProxy in its own namespace on the lab's switch, at .200 of the lab's /24.
HAP_NS=$LAB_ID-hap
HAP_ADDR=$PREFIX.200
ip netns add "$HAP_NS"
ip -n "$HAP_NS" link set lo up
ip -n "$SW_NS" link add p-hap type veth peer name eth0 netns "$HAP_NS"
ip -n "$SW_NS" link set p-hap master br0
ip -n "$SW_NS" link set p-hap up
ip -n "$HAP_NS" addr add "$HAP_ADDR/24" dev eth0
ip -n "$HAP_NS" link set eth0 up
cat >"$work/haproxy.cfg" <<CFG
global
    maxconn 8000
defaults
    mode $HAPROXY_MODE
    timeout connect 2s
    timeout client 30s
    timeout server 30s
frontend shoal_bench
    bind $HAP_ADDR:80
    default_backend lab
backend lab
    balance roundrobin
    server node1 ${NODE_ADDR[1]}:8080
    server node2 ${NODE_ADDR[2]}:8080
CFG
ip netns exec "$HAP_NS" haproxy -db -f "$work/haproxy.cfg" >"$work/haproxy.log" 2>&1 &
pids+=($!)

reachable() { ip netns exec "$CLIENT_NS" bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; }
for t in "${NODE_ADDR[1]} 8080" "${NODE_ADDR[2]} 8080" "$HAP_ADDR 80" "$VIP 80"; do
	wait_for 15 reachable $t
done

# to_ms VALUE-with-unit (wrk: 850.00us, 4.37ms, 1.20s) -> milliseconds.
to_ms() {
	awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) ; else if (v ~ /s$/) n *= 1000; printf "%.2f", n }'
}

# run_wrk URL MODE -> "rps p50 p99 errors"
run_wrk() {
	local hdr=() out
	[ "$2" = new ] && hdr=(-H "Connection: close")
	out=$(ip netns exec "$CLIENT_NS" wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --latency "${hdr[@]}" "$1" 2>&1)
	echo "$out" >>"$work/wrk.log"
	local rps p50 p99 errs
	rps=$(awk '/^Requests\/sec:/ { printf "%.0f", $2 }' <<<"$out")
	p50=$(to_ms "$(awk '$1 == "50%" { print $2 }' <<<"$out")")
	p99=$(to_ms "$(awk '$1 == "99%" { print $2 }' <<<"$out")")
	errs=$(awk '/Socket errors:/ { gsub(",", ""); s = $4 + $6 + $8 + $10 } /Non-2xx/ { s += $5 } END { print s + 0 }' <<<"$out")
	echo "${rps:-0} $p50 $p99 $errs"
}

# run_ab URL MODE -> "rps p50 p99 errors" (ab's percentiles are whole ms)
run_ab() {
	local k=() out
	[ "$2" = keepalive ] && k=(-k)
	out=$(ip netns exec "$CLIENT_NS" ab -q -r -s 5 -n "$AB_N" -c "$CONNS" "${k[@]}" "$1" 2>&1)
	echo "$out" >>"$work/ab.log"
	local rps p50 p99 errs
	rps=$(awk '/^Requests per second:/ { printf "%.0f", $4 }' <<<"$out")
	p50=$(awk '$1 == "50%" { print $2 }' <<<"$out")
	p99=$(awk '$1 == "99%" { print $2 }' <<<"$out")
	errs=$(awk '/^Failed requests:/ { s += $3 } /^Non-2xx/ { s += $3 } END { print s + 0 }' <<<"$out")
	echo "${rps:-0} ${p50:-0} ${p99:-0} $errs"
}

# measure ROUND TARGET URL: every tool and mode against URL, with the CPU
# each agent used meanwhile (% of one core; a stopped agent still runs).
measure() {
	local tool mode r a b t1 t2 u1 u2
	for tool in wrk ab; do
		for mode in new keepalive; do
			t1=$(proc_ticks "${APID[1]}") t2=$(proc_ticks "${APID[2]}") a=$(now_s)
			r=$(run_$tool "$3" $mode)
			u1=$(proc_ticks "${APID[1]}") u2=$(proc_ticks "${APID[2]}") b=$(now_s)
			printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$tool" "$mode" "${r// /$'\t'}" \
				"$(cpu_pct "$t1" "$u1" "$a" "$b")" "$(cpu_pct "$t2" "$u2" "$a" "$b")" | tee -a "$tsv" >&2
		done
	done
}

hb=$(heartbeat_settings "$S1")
{
	echo "# shoal bench/compare.sh, $stamp"
	echo
	machine
	echo "lab $LAB_ID, VIP $VIP, backends ${NODE_ADDR[1]}:8080 ${NODE_ADDR[2]}:8080 (and VIP:80 on each), HAProxy $HAP_ADDR:80 ($(haproxy -v | head -1 | awk '{print $3}'), $HAPROXY_MODE mode, roundrobin), heartbeat $hb"
	echo "wrk -t$THREADS -c$CONNS -d${DURATION}s --latency [-H 'Connection: close']; ab -q -r -s 5 -n $AB_N -c $CONNS [-k]"
	echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$md"
printf 'round\ttarget\ttool\tmode\trps\tp50_ms\tp99_ms\terrors\tagent1_cpu\tagent2_cpu\n' >"$tsv"
cat "$md" >&2

for round in $(seq 1 "$ROUNDS"); do
	echo "round $round: (a) VIP, 2 nodes" >&2
	wait_for 30 eligible_is "$S1" 2
	measure "$round" a-vip2 "http://$VIP/"
	echo "round $round: (b) HAProxy" >&2
	measure "$round" b-haproxy "http://$HAP_ADDR/"
	echo "round $round: (c) one backend direct" >&2
	measure "$round" c-direct "http://${NODE_ADDR[1]}:8080/"
	echo "round $round: (d) VIP, 1 node (node2 stopped)" >&2
	"$SHOAL" --socket "$S1" stop --node node2 >&2
	wait_for 30 accepting_all "$S1"
	measure "$round" d-vip1 "http://$VIP/"
	"$SHOAL" --socket "$S1" start --node node2 >&2
done

# The table and the ratios, per round.
{
	echo
	echo "| round | tool | connections | (a) VIP 2 nodes | (b) HAProxy | (c) direct | (d) VIP 1 node | a/b | d/c |"
	echo "|---|---|---|---|---|---|---|---|---|"
	awk -F'\t' '
	NR == 1 { next }
	{ k = $1 "\t" $3 "\t" $4; v[$2, k] = $5; p50[$2, k] = $6; p99[$2, k] = $7; e[$2, k] = $8; keys[k] = 1 }
	END {
		split("a-vip2 b-haproxy c-direct d-vip1", t, " ")
		for (k in keys) {
			split(k, f, "\t")
			line = "| " f[1] " | " f[2] " | " (f[3] == "new" ? "new" : "keep-alive") " |"
			for (j = 1; j <= 4; j++)
				line = line sprintf(" %d req/s, p50 %s, p99 %s ms%s |", v[t[j], k], p50[t[j], k], p99[t[j], k], e[t[j], k] > 0 ? ", " e[t[j], k] " errors" : "")
			ab = v["b-haproxy", k] > 0 ? v["a-vip2", k] / v["b-haproxy", k] : 0
			dc = v["c-direct", k] > 0 ? v["d-vip1", k] / v["c-direct", k] : 0
			print line sprintf(" %.2f | %.2f |", ab, dc)
		}
	}' "$tsv" | sort -t'|' -k2,2n -k3,3r -k4,4
} >>"$md"
# Each agent's CPU while each target was measured (mean over its runs).
{
	echo
	echo "| round | target | node1 agent CPU | node2 agent CPU |"
	echo "|---|---|---|---|"
	awk -F'\t' 'NR > 1 { k = $1 "\t" $2; n[k]++; c1[k] += $9; c2[k] += $10; if (!(k in seen)) { seen[k] = 1; order[++m] = k } }
	END { for (i = 1; i <= m; i++) { k = order[i]; split(k, f, "\t"); printf "| %s | %s | %.1f%% | %.1f%% |\n", f[1], f[2], c1[k] / n[k], c2[k] / n[k] } }' "$tsv"
} >>"$md"
echo >>"$md"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$md"
echo "raw: $(basename "$tsv")" >>"$md"
cat "$md"
# The bar chart, when Go is here to draw it (and a PNG with rsvg-convert).
if command -v go >/dev/null; then
	(cd "$here/.." && go run ./bench/compareplot "$tsv") >"${tsv%.tsv}.svg" &&
		if command -v rsvg-convert >/dev/null; then rsvg-convert -o "${tsv%.tsv}.png" "${tsv%.tsv}.svg"; fi
fi
echo "results: $md $tsv ${tsv%.tsv}.svg" >&2
