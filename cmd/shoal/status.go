package main

import (
	"fmt"
	"io"
	"slices"

	"github.com/urfave/cli/v2"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/filter"
)

var statusCommand = &cli.Command{
	Name:        "status",
	Usage:       "show this node's own state",
	Description: "Prints the local node's admin state, health, whether it has converged with the\ncluster, and how many buckets of each rule it accepts, drains and shares.",
	Flags:       []cli.Flag{jsonFlag},
	Action: func(c *cli.Context) error {
		st, err := client(c).Status(c.Context)
		if err != nil {
			return err
		}
		if c.Bool("json") {
			return printJSON(c.App.Writer, st)
		}
		printStatus(c.App.Writer, st)
		return nil
	},
}

func printStatus(w io.Writer, st *control.Status) {
	fmt.Fprintf(w, "node %s (id %d): %s, %s\n", st.NodeName, st.NodeID, st.Admin, health(st.Healthy, st.HealthError))
	conv := "converged"
	if !st.Converged {
		conv = "converging"
	}
	fmt.Fprintf(w, "view: %s, eligible %v, rules index %d, leader %s\n", conv, st.View.Eligible, st.RulesIndex, orNone(st.Leader))
	fmt.Fprintf(w, "heartbeat: every %s, peer dead after %d periods; %d peer deaths, %d stalls\n", st.HeartbeatPeriod, st.HeartbeatTolerance, st.PeerDeaths, st.Stalls)
	fmt.Fprintf(w, "connections held on the VIPs: %d\n", st.Connections)
	if st.Plugged {
		fmt.Fprintln(w, "PLUG PULLED: this node sends no heartbeats and drops all VIP traffic")
	}
	ids := make([]filter.RuleID, 0, len(st.Accepting))
	for id := range st.Accepting {
		ids = append(ids, id)
	}
	for id := range st.Draining {
		if _, ok := st.Accepting[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	fmt.Fprintf(w, "%-8s %10s %10s %10s\n", "RULE", "ACCEPTING", "DIRTY", "DRAINING")
	for _, id := range ids {
		fmt.Fprintf(w, "%-8s %10d %10d %10d\n", ruleName(id), st.Accepting[id], st.Dirty[id], st.Draining[id])
	}
}

func health(ok bool, why string) string {
	if ok {
		return "healthy"
	}
	if why != "" {
		return "sick (" + why + ")"
	}
	return "sick"
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func ruleName(id filter.RuleID) string {
	if id == filter.DefaultRule {
		return "default"
	}
	return fmt.Sprint(id)
}
