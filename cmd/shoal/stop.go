package main

import "github.com/urfave/cli/v2"

var stopCommand = &cli.Command{
	Name:        "stop",
	Usage:       "stop handling traffic on a node at once",
	Description: "Sets the node's admin state to stopped: it takes no new connections and drops\nthe packets of its existing ones (use drainstop to let them finish).",
	Flags:       []cli.Flag{nodeFlag},
	Action:      adminAction("stopped", "stopped"),
}
