package lab

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The memory a lab's processes take, measured in a 64-node lab at rest
// (ps -o rss): an agent about 52 MB, the built-in server about 39 MB;
// nginx and Apache less. With a margin for the join's peak.
const (
	agentMemory  = 64 << 20
	serverMemory = 48 << 20
)

// MaxNodes is the most nodes a lab builds: the cluster's registry holds
// 64 (rules.MaxHostPriority).
const MaxNodes = 64

// machineFits says plainly when this machine cannot hold the lab asked
// for, and why, before anything is built.
func machineFits(o Options) error {
	if o.Nodes > MaxNodes {
		return fmt.Errorf("lab: %d nodes: a cluster holds at most %d (the registry's host priorities 1-%d)", o.Nodes, MaxNodes, MaxNodes)
	}
	if o.NoAgents {
		return nil
	}
	servers := o.Nodes
	if o.Servers > 0 {
		servers = o.Servers
	}
	need := uint64(o.Nodes)*agentMemory + uint64(servers)*serverMemory
	avail, err := memAvailable()
	if err != nil {
		return nil // not knowing is no reason to refuse
	}
	if need > avail {
		return fmt.Errorf("lab: this machine is too small for %d nodes: %d agents (about %d MB each) and %d servers (about %d MB each) need about %d MB, and %d MB of memory is available; try fewer nodes, or --servers to run the HTTP server on only some of them",
			o.Nodes, o.Nodes, agentMemory>>20, servers, serverMemory>>20, need>>20, avail>>20)
	}
	return nil
}

// memAvailable reads MemAvailable from /proc/meminfo, in bytes.
func memAvailable() (uint64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != "MemAvailable" {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/meminfo: %q: %w", sc.Text(), err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("/proc/meminfo: no MemAvailable")
}
