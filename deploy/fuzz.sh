#!/usr/bin/env bash
# deploy/fuzz.sh: fuzz every decoder of what reaches a node (heartbeats,
# Raft commands and snapshots, ARP frames, packets), FUZZTIME each (30s).
# CI runs the same targets for a few seconds each (.ci/run); this is the
# longer run. No root needed. Finds land in each package's
# testdata/fuzz/<target>/: commit the ones that found bugs as seeds.
#   deploy/fuzz.sh                 # every target, 30s each
#   FUZZTIME=5m deploy/fuzz.sh rules:FuzzDecodeSnapshot
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-30s}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
	# Every fuzz target in the module, as package:Target.
	mapfile -t targets < <(grep -rlE --include='*_test.go' '^func Fuzz' . |
		while read -r f; do
			pkg=$(dirname "$f" | sed 's|^\./||')
			grep -oE '^func Fuzz[A-Za-z0-9_]*' "$f" | sed "s|^func |$pkg:|"
		done | sort -u)
fi
echo "fuzz: ${#targets[@]} targets, $FUZZTIME each; load $(cut -d' ' -f1-3 /proc/loadavg)"
for t in "${targets[@]}"; do
	echo "== $t"
	go test -run '^$' -fuzz "^${t#*:}\$" -fuzztime "$FUZZTIME" "./${t%%:*}"
done
echo "fuzz: done; load $(cut -d' ' -f1-3 /proc/loadavg)"
