package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/filter"
)

var displayCommand = &cli.Command{
	Name:        "display",
	Aliases:     []string{"params"},
	Usage:       "show this node's configuration and live counters",
	Description: "Prints the agent's configuration, the cluster settings, and the data plane's\npacket counters (accepted, dropped by reason) per rule, with heartbeat and ARP counters.",
	Flags:       []cli.Flag{jsonFlag},
	Action: func(c *cli.Context) error {
		var p control.Params
		if err := client(c).Do(c.Context, "GET", "/v1/params", nil, &p); err != nil {
			return err
		}
		if c.Bool("json") {
			return printJSON(c.App.Writer, p)
		}
		w := c.App.Writer
		cfg := p.Config
		fmt.Fprintf(w, "node %s on %s, vips %v\n", cfg.NodeName, cfg.Interface, cfg.VIPs)
		fmt.Fprintf(w, "heartbeat %s, raft %s, peer api %s, metrics %s\n", cfg.HeartbeatAddr, cfg.RaftAddr, cfg.PeerAddr, orNone(cfg.MetricsAddr))
		fmt.Fprintf(w, "cluster %08x: hash seed %08x, heartbeat every %s, dead after %d missed\n",
			p.Settings.ClusterID, p.Settings.HashSeed, p.Settings.HeartbeatPeriod, p.Settings.HeartbeatTolerance)
		ids := make([]filter.RuleID, 0, len(p.Packets))
		for id := range p.Packets {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		fmt.Fprintf(w, "%-8s %12s  %s\n", "RULE", "ACCEPTED", "DROPPED")
		for _, id := range ids {
			pc := p.Packets[id]
			var drops []string
			for _, reason := range sortedKeys(pc.Dropped) {
				drops = append(drops, fmt.Sprintf("%s=%d", reason, pc.Dropped[reason]))
			}
			fmt.Fprintf(w, "%-8s %12d  %s\n", ruleName(id), pc.Accepted, strings.Join(drops, " "))
		}
		fmt.Fprintf(w, "heartbeat: %s\n", counters(p.Heartbeat))
		fmt.Fprintf(w, "arp: %s\n", counters(p.ARP))
		return nil
	},
}

func counters(m map[string]uint64) string {
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
