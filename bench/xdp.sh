#!/usr/bin/env bash
# bench/xdp.sh: XDP per-packet cost from the filter package's benchmarks
# (prog test runs of the real program beside a bare XDP program, in the same
# process; IPv4 and IPv6 cases). Root is needed to load BPF programs; COUNT
# runs each (2).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
need_root
COUNT=${COUNT:-2}
machine
cd "$here/.."
echo "go test -run '^\$' -bench XDP -count $COUNT ./filter/"
go test -run '^$' -bench XDP -count "$COUNT" ./filter/
