package main

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/shoalnet/shoal/agent"
)

var restartCommand = &cli.Command{
	Name:  "restart",
	Usage: "arm a hitless restart of this node's agent: the next stop keeps its traffic",
	Description: "Makes the agent's next stop (within a minute) a restart instead of a graceful\n" +
		"stop: it keeps its XDP program and tables pinned, its VIPs, sysctls and cluster MAC\n" +
		"memberships, and announces a restart window to its peers, which keep its buckets\n" +
		"with it until the window ends. The next agent adopts all of it; no connection\n" +
		"breaks. Restart the service right after, e.g.\n\n" +
		"   shoal restart && systemctl restart shoal\n\n" +
		"If no agent comes back within the window, the peers take its buckets over as after\n" +
		"a failure. A stop without `shoal restart` first stays a graceful stop (handoff).",
	Flags: []cli.Flag{
		&cli.DurationFlag{Name: "window", Value: agent.DefaultRestartWindow, Usage: "how long the peers wait for the agent to come back (1s-10s)"},
		jsonFlag,
	},
	Action: func(c *cli.Context) error {
		var armed agent.RestartArmed
		if err := client(c).Do(c.Context, "POST", "/v1/restart", agent.RestartRequest{Window: c.Duration("window")}, &armed); err != nil {
			return err
		}
		if c.Bool("json") {
			return printJSON(c.App.Writer, armed)
		}
		fmt.Fprintf(c.App.Writer, "restart armed: a stop before %s keeps the traffic (window %v)\n", armed.Until.Format(time.TimeOnly), armed.Window)
		return nil
	},
}
