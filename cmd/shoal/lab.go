package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/shoalnet/shoal/deploy/lab"
	"github.com/shoalnet/shoal/deploy/lab/load"
)

var labBaseFlag = &cli.StringFlag{Name: "base", Value: lab.DefaultBase, Hidden: true,
	Usage: "where labs keep their state files and work directories"}

var labBuildFlags = []cli.Flag{
	&cli.IntFlag{Name: "nodes", Value: 3, Usage: "number of node namespaces"},
	&cli.StringFlag{Name: "family", Value: string(lab.Family4),
		Usage: "the VIPs' address family: 4, 6 (an IPv6 VIP from 2001:db8::/32) or dual (an IPv4 and an IPv6 VIP)"},
	&cli.StringFlag{Name: "server", Value: string(lab.ServerBuiltin),
		Usage: "the HTTP server on every node: builtin (VIP:80), dualstack (the built-in one on [::]:80), nginx or apache (Debian's)"},
	&cli.IntFlag{Name: "servers", Usage: "run the HTTP server on the first `N` nodes only; the others run the agent alone, at weight 0 on the VIP's rules (default: every node)"},
	&cli.DurationFlag{Name: "period", Usage: "heartbeat period of the agents (default: the agent's)"},
	&cli.StringFlag{Name: "mac-mode", Value: "multicast", Usage: "the cluster's MAC mode: multicast (a flooding switch), igmp (a switch with IGMP snooping and a querier, and a bystander namespace) or routed (FRR in a router namespace between the client and the nodes, BGP and BFD to every node, kernel ECMP)"},
	&cli.BoolFlag{Name: "no-forward", Usage: "routed mode without forwarding to the owner: every node keeps what the router sends it, as plain ECMP does (to compare)"},
	&cli.BoolFlag{Name: "parallel-start", Hidden: true, Usage: "start every agent at once (default: one after the other)"},
	&cli.BoolFlag{Name: "keep-failed", Hidden: true, Usage: "leave a lab that failed to come up in place, for its logs"},
	&cli.StringFlag{Name: "binary", Hidden: true, Usage: "the shoal binary the namespaces run (default: this one)"},
	labKeepLogsFlag,
	labBaseFlag,
}

var labKeepLogsFlag = &cli.StringFlag{Name: "keep-logs",
	Usage: "copy the agents' and servers' logs into this directory when the lab is removed (SHOAL_LOG_LEVEL=debug for every step)"}

var labCommand = &cli.Command{
	Name:  "lab",
	Usage: "run a whole cluster on this machine, in network namespaces",
	Description: "The lab builds a virtual LAN in network namespaces: a bridge as the switch, N\n" +
		"nodes each running a real agent and an HTTP server on the VIP, and a client.\n" +
		"Addresses come from 198.18.0.0/15 (and 2001:db8::/32 with --family 6 or dual)\n" +
		"and exist only inside the lab's namespaces.\n" +
		"Needs root. See docs/LAB.md.",
	Subcommands: []*cli.Command{labUpCommand, labStatusCommand, labDownCommand, labRunCommand, labServeCommand, labLoadCommand},
}

var labUpCommand = &cli.Command{
	Name:        "up",
	Usage:       "build a lab and leave it running",
	Description: "Builds the namespaces, starts the agents and HTTP servers, waits until the\ncluster has converged with a port rule for the VIP's port 80, and prints how to\nreach it. Remove it with `shoal lab down`.",
	Flags:       labBuildFlags,
	Action: func(c *cli.Context) error {
		ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
		defer stop()
		l, err := lab.Up(ctx, labOptions(c))
		if err != nil {
			return err
		}
		w := c.App.Writer
		fmt.Fprintf(w, "lab %s is up: VIP %v, server %s\n", l.ID, l.VIPs(), l.Server)
		for _, n := range l.Nodes {
			fmt.Fprintf(w, "  %s %s  shoal --socket %s status\n", n.Name, n.Addr, n.Socket)
		}
		for _, vip := range l.VIPs() {
			fmt.Fprintf(w, "  client %s  ip netns exec %s curl %s\n", l.Client.Addr, l.Client.Namespace, lab.URL(vip))
		}
		fmt.Fprintf(w, "shoal lab status %s; shoal lab down %s\n", l.ID, l.ID)
		return nil
	},
}

var labStatusCommand = &cli.Command{
	Name:        "status",
	Usage:       "show a lab's namespaces, processes and agents",
	Description: "Shows the lab named by its id (the only lab if omitted): whether its\nnamespaces and processes are there, and each node's status.",
	ArgsUsage:   "[ID]",
	Flags:       []cli.Flag{jsonFlag, labBaseFlag},
	Action: func(c *cli.Context) error {
		id := c.Args().First()
		if id == "" {
			ids, err := lab.List(c.String("base"))
			if err != nil {
				return err
			}
			if len(ids) != 1 {
				return usageError("lab status: %d labs (%v); name one", len(ids), ids)
			}
			id = ids[0]
		}
		l, err := lab.Open(c.String("base"), id, nil)
		if err != nil {
			return err
		}
		st := l.Status(c.Context)
		if c.Bool("json") {
			return printJSON(c.App.Writer, st)
		}
		st.WriteText(c.App.Writer)
		return nil
	},
}

var labDownCommand = &cli.Command{
	Name:        "down",
	Usage:       "remove a lab, or every lab",
	Description: "Stops the lab's processes and deletes its namespaces and files, found by its\nstate file or, after a crash, by the lab's namespace prefix. Without an id it\nremoves every lab on this machine.",
	ArgsUsage:   "[ID...]",
	Flags:       []cli.Flag{labBaseFlag},
	Action: func(c *cli.Context) error {
		base := c.String("base")
		ctx := context.WithoutCancel(c.Context) // a half-done teardown helps nobody
		if c.NArg() == 0 {
			ids, err := lab.DownAll(ctx, base, cliLogger(c))
			for _, id := range ids {
				fmt.Fprintf(c.App.Writer, "lab %s removed\n", id)
			}
			if len(ids) == 0 && err == nil {
				fmt.Fprintln(c.App.Writer, "no lab found")
			}
			return err
		}
		var errs []error
		for _, id := range c.Args().Slice() {
			l, err := lab.Open(base, id, cliLogger(c))
			if err == nil {
				err = l.Down(ctx)
			}
			if err != nil {
				errs = append(errs, err)
				continue
			}
			fmt.Fprintf(c.App.Writer, "lab %s removed\n", id)
		}
		return errors.Join(errs...)
	},
}

var labRunCommand = &cli.Command{
	Name:  "run",
	Usage: "build a lab, pull a node's plug under traffic, report, remove it",
	Description: "Builds a lab, sends HTTP traffic on new connections from the client, pulls the\n" +
		"plug on the last node while the traffic goes on, measures the time until the\n" +
		"survivors own every bucket again, sends traffic again, prints a report and\n" +
		"removes the lab (also on failure or Ctrl-C, unless --keep).",
	Flags: append([]cli.Flag{
		&cli.DurationFlag{Name: "duration", Value: 3 * time.Second, Usage: "length of each traffic phase"},
		&cli.IntFlag{Name: "concurrency", Value: 8, Usage: "parallel client connections"},
		&cli.Float64Flag{Name: "rate", Usage: "requests per second (0: as fast as the client can)"},
		&cli.IntFlag{Name: "pulls", Value: 1, Usage: "plugs to pull: the first under traffic, the rest one after the other for a failover distribution"},
		&cli.BoolFlag{Name: "keep", Usage: "leave the lab up after the run"},
		jsonFlag,
	}, labBuildFlags...),
	Action: func(c *cli.Context) error {
		ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
		defer stop()
		rep, err := lab.Run(ctx, lab.RunOptions{
			Options:     labOptions(c),
			Duration:    c.Duration("duration"),
			Concurrency: c.Int("concurrency"),
			Rate:        c.Float64("rate"),
			Keep:        c.Bool("keep"),
			Pulls:       c.Int("pulls"),
			Progress:    c.App.ErrWriter,
		})
		if rep != nil {
			if c.Bool("json") {
				if perr := printJSON(c.App.Writer, rep); perr != nil {
					return perr
				}
			} else {
				rep.WriteText(c.App.Writer)
			}
		}
		return err
	},
}

var labServeCommand = &cli.Command{
	Name:        "serve",
	Hidden:      true,
	Usage:       "the lab's node HTTP server",
	Description: "Answers every request with the node's name in the body and an X-Shoal-Node\nheader; binds even before the address exists (IP_FREEBIND).",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "name", Required: true, Usage: "the node name to answer with"},
		&cli.StringSliceFlag{Name: "listen", Required: true, Usage: "address:port to listen on (repeat for more)"},
	},
	Action: func(c *cli.Context) error {
		ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
		defer stop()
		return lab.Serve(ctx, c.String("name"), c.StringSlice("listen"), cliLogger(c))
	},
}

var labLoadCommand = &cli.Command{
	Name:        "load",
	Hidden:      true,
	Usage:       "the lab's HTTP load generator",
	Description: "Sends HTTP GET requests to --url and prints what happened: totals, share per\nnode (X-Shoal-Node), a timeline per 100 ms and every failure. Progress lines go\nto stderr.",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "url", Required: true, Usage: "the URL to GET"},
		&cli.DurationFlag{Name: "duration", Usage: "how long to send requests"},
		&cli.IntFlag{Name: "requests", Usage: "how many requests to send (0: bounded by --duration)"},
		&cli.IntFlag{Name: "concurrency", Value: 8, Usage: "parallel workers"},
		&cli.Float64Flag{Name: "rate", Usage: "requests per second over all workers (0: as fast as possible)"},
		&cli.BoolFlag{Name: "keepalive", Usage: "reuse connections (default: a new connection per request)"},
		&cli.DurationFlag{Name: "timeout", Value: 2 * time.Second, Usage: "per request"},
		&cli.IntFlag{Name: "held", Usage: "also hold this many keep-alive connections open, a request on each every 100 ms, and count those that break"},
		jsonFlag,
	},
	Action: func(c *cli.Context) error {
		ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
		defer stop()
		fmt.Fprintln(c.App.ErrWriter, lab.LoadStarted) // the lab times its drill from this line
		res, err := load.Run(ctx, load.Options{
			URL:         c.String("url"),
			Duration:    c.Duration("duration"),
			Requests:    c.Int("requests"),
			Concurrency: c.Int("concurrency"),
			Rate:        c.Float64("rate"),
			KeepAlive:   c.Bool("keepalive"),
			Timeout:     c.Duration("timeout"),
			Held:        c.Int("held"),
			Progress:    func(p load.Progress) { fmt.Fprintln(c.App.ErrWriter, p) },
		})
		if errors.Is(err, load.ErrNoBound) {
			return usageError("lab load: give --duration or --requests")
		}
		if err != nil {
			return err
		}
		if c.Bool("json") {
			return printJSON(c.App.Writer, res)
		}
		fmt.Fprintf(c.App.Writer, "%d requests, %d failed, %.0f req/s, p50 %.2f ms, p99 %.2f ms\n",
			res.Requests, res.Failures, res.RatePerSec, res.P50MS, res.P99MS)
		for n, s := range res.Share {
			fmt.Fprintf(c.App.Writer, "  %s %.1f%%\n", n, 100*s)
		}
		for cl, n := range res.Errors {
			fmt.Fprintf(c.App.Writer, "  %s: %d\n", cl, n)
		}
		return nil
	},
}

func labOptions(c *cli.Context) lab.Options {
	return lab.Options{
		Nodes:   c.Int("nodes"),
		Period:  c.Duration("period"),
		Server:  lab.Server(c.String("server")),
		Servers: c.Int("servers"),
		Family:  lab.Family(c.String("family")),
		Binary:  c.String("binary"),
		Base:    c.String("base"),

		MACMode:   c.String("mac-mode"),
		NoForward: c.Bool("no-forward"),
		Log:       cliLogger(c),

		KeepLogs:      c.String("keep-logs"),
		KeepOnFailure: c.Bool("keep-failed"),
		ParallelStart: c.Bool("parallel-start"),
	}
}

// cliLogger logs the lab's steps to the command's error stream.
func cliLogger(c *cli.Context) *slog.Logger {
	return slog.New(slog.NewTextHandler(c.App.ErrWriter, &slog.HandlerOptions{Level: slog.LevelInfo}))
}
