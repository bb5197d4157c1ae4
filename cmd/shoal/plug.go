package main

import (
	"fmt"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/urfave/cli/v2"
)

var plugCommand = &cli.Command{
	Name:  "plug",
	Usage: "pull or restore this node's virtual network plug (failover drills)",
	Description: "`shoal plug pull` makes this node look, to the cluster and its clients, like a\n" +
		"node whose cable was pulled: it stops heartbeating and drops every VIP packet.\n" +
		"`shoal plug restore` puts it back.",
	ArgsUsage: "pull|restore",
	Action: func(c *cli.Context) error {
		arg, err := oneArg(c, "pull|restore")
		if err != nil {
			return err
		}
		if arg != "pull" && arg != "restore" {
			return usageError("plug: want pull or restore, not %q", arg)
		}
		if err := client(c).Do(c.Context, "POST", "/v1/plug", control.PlugRequest{Pulled: arg == "pull"}, nil); err != nil {
			return err
		}
		fmt.Fprintf(c.App.Writer, "plug %s\n", map[string]string{"pull": "pulled", "restore": "restored"}[arg])
		return nil
	},
}
