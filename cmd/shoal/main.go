// Command shoal is the shoal agent and its command-line interface.
package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/shoalnet/shoal/agent/config"
	"github.com/shoalnet/shoal/agent/control"
)

func main() {
	if err := newApp().Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "shoal:", err)
		os.Exit(exitCode(err))
	}
}

// newApp assembles the commands; each lives in its own file.
func newApp() *cli.App {
	return &cli.App{
		Name:                 "shoal",
		Usage:                "peer-to-peer network load balancing for Linux",
		Version:              buildInfo().Version,
		EnableBashCompletion: true,
		Description: "shoal runs on every server of a web farm. The servers share virtual IPs and\n" +
			"each keeps, in XDP, only its share of the traffic. Run `shoal agent` on every\n" +
			"node; the other commands talk to the local agent over its control socket.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "socket", Value: config.DefaultSocket, EnvVars: []string{"SHOAL_SOCKET"},
				Usage: "the local agent's control socket"},
		},
		Commands: []*cli.Command{
			agentCommand,
			statusCommand,
			queryCommand,
			displayCommand,
			startCommand,
			stopCommand,
			drainstopCommand,
			suspendCommand,
			resumeCommand,
			enableCommand,
			disableCommand,
			drainCommand,
			rulesCommand,
			settingsCommand,
			weightCommand,
			priorityCommand,
			leaveCommand,
			restartCommand,
			plugCommand,
			ip2macCommand,
			doctorCommand,
			keygenCommand,
			tlsCommand,
			keyCommand,
			simulateCommand,
			drillCommand,
			labCommand,
			versionCommand,
			completionCommand,
			manCommand,
		},
		ExitErrHandler: func(*cli.Context, error) {}, // main prints and exits
	}
}

// Exit codes a script can rely on.
const (
	exitOK        = 0
	exitError     = 1 // the request failed (bad input, refused by the cluster)
	exitUsage     = 2 // bad flags or arguments
	exitAgentDown = 3 // no agent answers on the socket
	exitTimeout   = 4 // a wait (drainstop --timeout) ran out
)

func exitCode(err error) int {
	if ec, ok := err.(cli.ExitCoder); ok {
		return ec.ExitCode()
	}
	if isAgentDown(err) {
		return exitAgentDown
	}
	return exitError
}

func client(c *cli.Context) *control.Client { return control.NewClient(c.String("socket")) }
