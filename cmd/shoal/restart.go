package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/shoalnet/shoal/agent/control"
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
		"The packaged unit runs `shoal restart --if-restarting shoal.service` as its\n" +
		"ExecStop=, so a plain `systemctl restart shoal` is hitless too, while\n" +
		"`systemctl stop shoal` stays a graceful stop: with --if-restarting the restart is\n" +
		"armed only when systemd's job for the unit is a restart (systemctl list-jobs).\n\n" +
		"If no agent comes back within the window, the peers take its buckets over as after\n" +
		"a failure. A stop without `shoal restart` first stays a graceful stop (handoff).",
	Flags: []cli.Flag{
		&cli.DurationFlag{Name: "window", Value: control.DefaultRestartWindow, Usage: "how long the peers wait for the agent to come back (1s-10s)"},
		&cli.StringFlag{Name: "if-restarting", Usage: "arm only if systemd is restarting `UNIT` now (for the unit's ExecStop=)"},
		jsonFlag,
	},
	Action: func(c *cli.Context) error {
		if unit := c.String("if-restarting"); unit != "" {
			job, err := systemdJob(c.Context, unit)
			if err != nil {
				return err
			}
			if job != "restart" {
				fmt.Fprintf(c.App.Writer, "restart not armed: systemd's job for %s is %q, not a restart\n", unit, job)
				return nil
			}
		}
		var armed control.RestartArmed
		if err := client(c).Do(c.Context, "POST", "/v1/restart", control.RestartRequest{Window: c.Duration("window")}, &armed); err != nil {
			return err
		}
		if c.Bool("json") {
			return printJSON(c.App.Writer, armed)
		}
		fmt.Fprintf(c.App.Writer, "restart armed: a stop before %s keeps the traffic (window %v)\n", armed.Until.Format(time.TimeOnly), armed.Window)
		return nil
	},
}

// systemdJob returns the type of systemd's job for unit ("restart",
// "stop", ...; "" when it has none), from `systemctl list-jobs`. While
// `systemctl restart` stops a service, its job is a restart: systemd turns
// it into a start only once the service has stopped.
func systemdJob(ctx context.Context, unit string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "systemctl", "list-jobs", "--no-legend", "--no-pager", unit)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("systemctl list-jobs %s: %v: %s", unit, err, strings.TrimSpace(stderr.String()))
	}
	return jobOf(out, unit), nil
}

// jobOf reads the type of unit's job from `systemctl list-jobs --no-legend`
// output: lines of JOB UNIT TYPE STATE.
func jobOf(out []byte, unit string) string {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 3 && f[1] == unit {
			return f[2]
		}
	}
	return ""
}
