package main

import (
	"fmt"
	"net/url"
	"slices"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/urfave/cli/v2"
)

var simulateCommand = &cli.Command{
	Name:      "simulate",
	Usage:     "show which node takes a flow, now and if any one node failed",
	ArgsUsage: "<client-ip:port> <vip:port>",
	Description: "Runs the ownership function on one flow with the cluster's current rules and\n" +
		"view: the rule and bucket it falls in, the node that owns it, this node's state\n" +
		"for the bucket, and where it would go if each eligible node failed.",
	Flags: []cli.Flag{&cli.StringFlag{Name: "proto", Value: "tcp", Usage: "tcp or udp"}, jsonFlag},
	Action: func(c *cli.Context) error {
		if c.NArg() != 2 {
			return usageError("simulate: want <client-ip:port> <vip:port>")
		}
		q := url.Values{"client": {c.Args().Get(0)}, "to": {c.Args().Get(1)}, "proto": {c.String("proto")}}
		var sim control.Simulation
		if err := client(c).Do(c.Context, "GET", "/v1/simulate?"+q.Encode(), nil, &sim); err != nil {
			return err
		}
		if c.Bool("json") {
			return printJSON(c.App.Writer, sim)
		}
		w := c.App.Writer
		fmt.Fprintf(w, "rule %s, bucket %d: owner %s (here: %s)\n", ruleName(sim.Rule), sim.Bucket, orNone(sim.Owner), sim.Here)
		names := make([]string, 0, len(sim.IfDown))
		for n := range sim.IfDown {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			fmt.Fprintf(w, "  if %s failed: %s\n", n, orNone(sim.IfDown[n]))
		}
		return nil
	},
}
