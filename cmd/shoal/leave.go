package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

var leaveCommand = &cli.Command{
	Name:        "leave",
	Usage:       "take this node out of the cluster for good",
	Description: "Removes this node from the Raft configuration and the node registry. Drainstop\nit first to let its connections finish. The agent then exits.",
	Action: func(c *cli.Context) error {
		if err := client(c).Do(c.Context, "POST", "/v1/leave", nil, nil); err != nil {
			return err
		}
		fmt.Fprintln(c.App.Writer, "this node left the cluster")
		return nil
	},
}
