package main

import (
	"fmt"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/urfave/cli/v2"
)

// adminAction sets a node's admin state and says what happened.
func adminAction(state, done string) cli.ActionFunc {
	return func(c *cli.Context) error {
		if c.NArg() > 0 {
			return usageError("%s takes no arguments; use --node NAME for another node", c.Command.Name)
		}
		req := control.AdminRequest{Node: c.String("node"), State: state}
		if err := client(c).Do(c.Context, "POST", "/v1/admin", req, nil); err != nil {
			return err
		}
		fmt.Fprintf(c.App.Writer, "%s: %s\n", nodeLabel(req.Node), done)
		return nil
	}
}

func nodeLabel(name string) string {
	if name == "" {
		return "this node"
	}
	return "node " + name
}
