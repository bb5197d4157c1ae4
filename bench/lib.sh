# bench/lib.sh: helpers the bench scripts source. Needs bash, iproute2 and
# the shoal binary; every address is in the lab's 198.18.0.0/15 subnet and
# every process runs inside the lab's namespaces.

# need_root exits unless run as root.
need_root() {
	if [ "$(id -u)" != 0 ]; then
		echo "$0: run as root (the lab builds network namespaces)" >&2
		exit 1
	fi
}

# shoal_bin sets SHOAL to the shoal binary: $SHOAL, else bin/shoal (built
# with make build if missing).
shoal_bin() {
	local root
	root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
	if [ -z "${SHOAL:-}" ]; then
		SHOAL=$root/bin/shoal
		if [ ! -x "$SHOAL" ]; then
			echo "building $SHOAL" >&2
			(cd "$root" && make build >&2)
		fi
	fi
	SHOAL=$(readlink -f "$SHOAL")
}

# need_pkgs installs the Debian packages that provide the given commands
# (command:package pairs) if a command is missing.
need_pkgs() {
	local pkgs=() pair
	for pair in "$@"; do
		command -v "${pair%%:*}" >/dev/null 2>&1 || pkgs+=("${pair#*:}")
	done
	if [ ${#pkgs[@]} -gt 0 ]; then
		echo "installing ${pkgs[*]} from Debian" >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y "${pkgs[@]}" >&2 ||
			{ apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y "${pkgs[@]}" >&2; }
	fi
}

# machine prints the machine a figure was measured on.
machine() {
	echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), kernel $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ)"
}

# lab_up NODES [shoal lab up flags...]: builds a lab and sets LAB_ID, VIP,
# CLIENT_NS, SW_NS, PREFIX (the /24 without its last byte) and, per node i
# (1-based), NODE_ADDR[i], NODE_NS[i], NODE_SOCK[i].
lab_up() {
	local nodes=$1 out line
	shift
	local errs
	errs=$(mktemp)
	out=$("$SHOAL" lab up --nodes "$nodes" "$@" 2>"$errs") || {
		echo "shoal lab up --nodes $nodes $* failed: $(grep -v 'level=INFO' "$errs" | tail -n 3)" >&2
		rm -f "$errs"
		return 1
	}
	rm -f "$errs"
	LAB_ID=$(sed -n 's/^lab \(shl[0-9a-f]*\) is up: VIP \(.*\)$/\1/p' <<<"$out")
	VIP=$(sed -n 's/^lab \(shl[0-9a-f]*\) is up: VIP \[\{0,1\}\([0-9a-f.:]*\).*$/\2/p' <<<"$out")
	CLIENT_NS=$LAB_ID-client
	SW_NS=$LAB_ID-sw
	PREFIX=${VIP%.*}
	NODE_ADDR=() NODE_NS=() NODE_SOCK=()
	while read -r line; do
		set -- $line
		case $1 in node*)
			local i=${1#node}
			NODE_ADDR[i]=$2
			NODE_NS[i]=$LAB_ID-$1
			NODE_SOCK[i]=$5
			;;
		esac
	done <<<"$out"
	echo "lab $LAB_ID: VIP $VIP, nodes ${NODE_ADDR[*]}" >&2
}

# lab_down removes the lab (its namespaces and every process in them).
lab_down() {
	[ -n "${LAB_ID:-}" ] && "$SHOAL" lab down "$LAB_ID" >&2 || true
	LAB_ID=
}

# accepting_all SOCKET: true when that agent is converged and accepts every
# bucket of every rule (it is the only node taking traffic).
accepting_all() {
	local js acc
	js=$("$SHOAL" --socket "$1" status --json 2>/dev/null | tr -d ' \n') || return 1
	case $js in *'"converged":true'*) ;; *) return 1 ;; esac
	acc=$(sed -n 's/.*"accepting":{\([^}]*\)}.*/\1/p' <<<"$js")
	[ -n "$acc" ] || return 1
	! tr ',' '\n' <<<"$acc" | grep -qv ':4096$'
}

# eligible_count SOCKET: how many nodes the agent's converged view holds
# (0 while not converged).
eligible_count() {
	local js
	js=$("$SHOAL" --socket "$1" status --json 2>/dev/null | tr -d ' \n') || { echo 0; return; }
	case $js in *'"converged":true'*) ;; *) echo 0; return ;; esac
	sed -n 's/.*"view":{"eligible":\[\([^]]*\)\].*/\1/p' <<<"$js" | tr ',' '\n' | grep -c .
}

# eligible_is SOCKET N: true when the agent's converged view holds N nodes.
eligible_is() { [ "$(eligible_count "$1")" = "$2" ]; }

# wait_for SECONDS CMD...: polls CMD every 50 ms until it succeeds.
wait_for() {
	local deadline=$((SECONDS + $1))
	shift
	until "$@"; do
		if [ $SECONDS -ge $deadline ]; then
			echo "timed out waiting for: $*" >&2
			return 1
		fi
		sleep 0.05
	done
}

# heartbeat_settings SOCKET: prints "PERIOD TOLERANCE" as the cluster has
# them (the agents' defaults unless set).
heartbeat_settings() {
	local js
	js=$("$SHOAL" --socket "$1" query --json | tr -d ' \n')
	echo "$(sed -n 's/.*"heartbeat_period":"\([^"]*\)".*/\1/p' <<<"$js") $(sed -n 's/.*"heartbeat_tolerance":\([0-9]*\).*/\1/p' <<<"$js")"
}

# agent_pid NODE: the PID the lab (LAB_ID) recorded for that node's agent.
agent_pid() {
	jq -r --arg h "$1" '.processes[] | select(.role == "agent" and .host == $h) | .pid' "/run/shoal-lab/$LAB_ID.json"
}

# proc_ticks PID: the CPU a process has used (utime + stime), in clock ticks.
proc_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# now_s: the time in seconds, with nanoseconds.
now_s() { date +%s.%N; }

# cpu_pct TICKS0 TICKS1 START END: the share of one core (%) used between two
# readings of proc_ticks taken at START and END (now_s).
cpu_pct() {
	awk -v d=$(($2 - $1)) -v hz="$(getconf CLK_TCK)" -v a="$3" -v b="$4" 'BEGIN { printf "%.2f", 100 * d / hz / (b - a) }'
}
