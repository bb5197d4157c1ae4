package main

import (
	"fmt"
	"strconv"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/urfave/cli/v2"
)

var priorityCommand = &cli.Command{
	Name:  "priority",
	Usage: "set a node's host priority or a rule's handling priority",
	Description: "The host priority (1-64, unique; 1-32 until every node runs command level 5) picks the default host, which takes VIP traffic\n" +
		"no rule covers; a single-host rule goes to the eligible node with the lowest\nhandling priority.",
	Subcommands: []*cli.Command{{
		Name:        "set",
		Usage:       "set a priority",
		ArgsUsage:   "<node> <1-64>",
		Description: "Without --rule sets the host priority; with --rule the handling priority on that rule.",
		Flags:       []cli.Flag{&cli.StringFlag{Name: "rule", Usage: "a single-host rule (vip:port or id)"}},
		Action: func(c *cli.Context) error {
			if c.NArg() != 2 {
				return usageError("priority set: want <node> <1-64>")
			}
			p, err := strconv.Atoi(c.Args().Get(1))
			if err != nil {
				return usageError("priority set: %q is not a number", c.Args().Get(1))
			}
			req := control.PriorityRequest{Rule: c.String("rule"), Node: c.Args().Get(0), Priority: p}
			if err := client(c).Do(c.Context, "POST", "/v1/priority", req, nil); err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "node %s priority %d\n", req.Node, p)
			return nil
		},
	}},
}
