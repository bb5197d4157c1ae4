package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/shoalnet/shoal/agent"
)

var queryCommand = &cli.Command{
	Name:  "query",
	Usage: "show the cluster: every node, its state and its share of each rule",
	Description: "Like NLB's query: lists every registered node with its admin state, whether it\n" +
		"is alive, healthy and eligible, and its share of each port rule in the current\n" +
		"view, then whether the cluster has converged.",
	Flags: []cli.Flag{jsonFlag},
	Action: func(c *cli.Context) error {
		q, err := client(c).Query(c.Context)
		if err != nil {
			return err
		}
		if c.Bool("json") {
			return printJSON(c.App.Writer, q)
		}
		printQuery(c.App.Writer, q)
		return nil
	},
}

func printQuery(w io.Writer, q *agent.Query) {
	state := "converged"
	if !q.Converged {
		state = "converging"
	}
	fmt.Fprintf(w, "cluster %08x, %s, rules index %d, leader %s (asked %s)\n", q.Settings.ClusterID, state, q.RulesIndex, orNone(q.Leader), q.Self)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprint(tw, "ID\tNODE\tPRIO\tADMIN\tLIVE\tHEALTHY\tELIGIBLE")
	for _, r := range q.Rules {
		fmt.Fprintf(tw, "\tRULE %d", r.ID)
	}
	fmt.Fprintln(tw, "\tDEFAULT")
	for _, n := range q.Nodes {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%s", n.ID, n.Name, n.HostPriority, n.Admin, yes(n.Live), yes(n.Healthy), yes(n.Eligible))
		for _, r := range q.Rules {
			fmt.Fprintf(tw, "\t%.1f%%", 100*n.Share[r.ID])
		}
		fmt.Fprintf(tw, "\t%.0f%%\n", 100*n.Share[0])
	}
	tw.Flush()
	if len(q.Rules) > 0 {
		fmt.Fprintln(w)
		printRules(w, q.Rules)
	}
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
