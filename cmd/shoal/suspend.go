package main

import "github.com/urfave/cli/v2"

var suspendCommand = &cli.Command{
	Name:        "suspend",
	Usage:       "stop a node and ignore start/stop until resumed",
	Description: "Like NLB's suspend: the node stops handling traffic and refuses every admin\nchange except resume, also across agent restarts.",
	Flags:       []cli.Flag{nodeFlag},
	Action:      adminAction("suspended", "suspended"),
}
