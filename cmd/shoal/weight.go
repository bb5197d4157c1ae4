package main

import (
	"fmt"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/urfave/cli/v2"
)

var weightCommand = &cli.Command{
	Name:        "weight",
	Usage:       "set a node's load weight on a rule",
	Description: "A node's share of a multiple-host rule is its weight over the sum of the\neligible nodes' weights. 0 takes no new connections; equal is the default (50).",
	Subcommands: []*cli.Command{{
		Name:      "set",
		Usage:     "set a node's load weight on a rule",
		ArgsUsage: "<vip:port|rule-id|all> <node>[,<node>...] <0-100|equal>",
		Description: "Existing connections stay where they are; only new ones follow the new weights.\n" +
			"Several nodes (node3,node4) or all rules change in one step: one view change.",
		Action: func(c *cli.Context) error {
			if c.NArg() != 3 {
				return usageError("weight set: want <rule> <node>[,<node>...] <0-100|equal>")
			}
			req := control.WeightRequest{Rule: c.Args().Get(0), Node: c.Args().Get(1), Weight: c.Args().Get(2)}
			if err := client(c).Do(c.Context, "POST", "/v1/weight", req, nil); err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "node %s weight on rule %s: %s\n", req.Node, req.Rule, req.Weight)
			return nil
		},
	}},
}
