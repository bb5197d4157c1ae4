package main

import "github.com/urfave/cli/v2"

var startCommand = &cli.Command{
	Name:        "start",
	Usage:       "start handling traffic on a node",
	Description: "Sets the node's admin state to started: once the cluster converges it takes its\nshare of new connections. A suspended node must be resumed first.",
	Flags:       []cli.Flag{nodeFlag},
	Action:      adminAction("started", "started"),
}
