package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/shoalnet/shoal/agent/config"
	"github.com/shoalnet/shoal/deploy/drill"
	"github.com/shoalnet/shoal/deploy/lab"
)

var drillCommand = &cli.Command{
	Name:      "drill",
	Usage:     "pull a node's plug (or kill, drain, join, reweight it) under load and report what clients saw",
	ArgsUsage: "plug|kill|drainstop|join|weight|rule|sigterm|restart|rehash",
	Description: "Sends HTTP GET requests to the VIP (new connections, or --keepalive) and, after\n" +
		"--lead, acts on one node: plug (a pulled cable), kill (SIGKILL the agent, lab\n" +
		"only), drainstop, join (the node is stopped first, then started) or weight\n" +
		"(set its weight on the port rule to --weight); in a lab also rule (the port\n" +
		"rule's range grows to 80-81, a change of its mapping), sigterm (a graceful\n" +
		"stop of the node's agent, as systemctl stop) and restart (a hitless restart of\n" +
		"the node's agent, as systemctl restart); in a routed lab (--mode routed) also\n" +
		"rehash (the node's next hop taken out of the router's route and put back).\n" +
		"--held N holds N keep-alive connections across the event and counts those that\n" +
		"break. It prints a live progress line,\n" +
		"then a timeline per 100 ms (successes, failures, p50/p99, responses per node and\n" +
		"each node's share of accepted packets from the agents' counters), the time the\n" +
		"cluster took to settle (the failover time) and every failed request.\n\n" +
		"With --lab it builds a lab in network namespaces, runs the drill there and\n" +
		"removes it (needs root). Otherwise it drills a real cluster: --vip (or --url)\n" +
		"is the target, the global --socket the local agent, and plug reaches the node\n" +
		"over the authenticated peer API (--peer ADDR --key-file F); its plug is put back\n" +
		"at the end. Flags go before the scenario: shoal drill --lab --keepalive plug.",
	Flags: []cli.Flag{
		&cli.BoolFlag{Name: "lab", Usage: "build a lab, run the drill in it, remove it"},
		&cli.IntFlag{Name: "nodes", Value: 3, Usage: "lab: number of nodes"},
		&cli.DurationFlag{Name: "period", Usage: "lab: heartbeat period of the agents (default: the agent's)"},
		&cli.StringFlag{Name: "server", Value: string(lab.ServerBuiltin), Usage: "lab: the HTTP server on every node: builtin, dualstack, nginx or apache"},
		&cli.StringFlag{Name: "family", Value: string(lab.Family4), Usage: "lab: the VIP's address family: 4 or 6 (dual: the drill's traffic goes to the IPv4 VIP)"},
		&cli.StringFlag{Name: "mac-mode", Aliases: []string{"mode"}, Value: "multicast", Usage: "lab: the cluster's mode: multicast, igmp or routed (FRR in front of the nodes, ECMP; docs/ROUTED.md)"},
		&cli.BoolFlag{Name: "no-forward", Usage: "lab, routed: no forwarding to the owner (plain ECMP, to compare)"},
		&cli.IntFlag{Name: "held", Usage: "lab: also hold this many keep-alive connections across the event (a request on each every 100 ms) and count those that break"},
		&cli.StringFlag{Name: "binary", Hidden: true, Usage: "lab: the shoal binary the namespaces run (default: this one)"},
		labKeepLogsFlag,
		labBaseFlag,
		&cli.StringFlag{Name: "vip", Usage: "cluster: the VIP to send traffic to"},
		&cli.IntFlag{Name: "port", Value: 80, Usage: "cluster: the VIP's HTTP port"},
		&cli.StringFlag{Name: "url", Usage: "cluster: the URL to GET (default http://VIP:PORT/)"},
		&cli.StringFlag{Name: "node", Usage: "the node to act on (lab default: the last node)"},
		&cli.StringFlag{Name: "peer", Usage: "cluster, plug: the node's peer API address (its peer_addr)"},
		&cli.StringFlag{Name: "key-file", Value: "/etc/shoal/cluster.key", Usage: "cluster, plug: the cluster key"},
		&cli.StringFlag{Name: "weight", Value: "0", Usage: "weight: the node's new weight on the port rule (0-100 or equal)"},
		&cli.StringFlag{Name: "rule", Usage: "cluster, weight: the rule (default VIP:PORT)"},
		&cli.DurationFlag{Name: "duration", Value: drillDefaults.Duration, Usage: "how long the traffic lasts"},
		&cli.DurationFlag{Name: "lead", Value: drillDefaults.Lead, Usage: "traffic before the event"},
		&cli.IntFlag{Name: "concurrency", Value: drillDefaults.Concurrency, Usage: "parallel workers"},
		&cli.Float64Flag{Name: "rate", Usage: "requests per second over all workers (0: as fast as possible)"},
		&cli.BoolFlag{Name: "keepalive", Usage: "reuse connections (default: a new connection per request)"},
		&cli.DurationFlag{Name: "timeout", Value: drillDefaults.Timeout, Usage: "per request"},
		&cli.DurationFlag{Name: "settle-timeout", Value: drill.DefaultSettleTimeout, Usage: "how long to wait for the cluster to settle"},
		jsonFlag,
		&cli.StringFlag{Name: "out-json", Usage: "also write the report as JSON to this file"},
		&cli.StringFlag{Name: "out-svg", Usage: "write the plot as SVG to this file"},
	},
	Action: func(c *cli.Context) error {
		arg, err := oneArg(c, "plug|kill|drainstop|join|weight|rule|sigterm|restart|rehash")
		if err != nil {
			return err
		}
		sc, err := drill.ParseScenario(arg)
		if err != nil {
			return usageError("%v", err)
		}
		ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
		defer stop()
		tr := drill.Traffic{
			Duration: c.Duration("duration"), Lead: c.Duration("lead"), Concurrency: c.Int("concurrency"),
			Rate: c.Float64("rate"), KeepAlive: c.Bool("keepalive"), Timeout: c.Duration("timeout"),
			Held: c.Int("held"),
		}
		rep, err := runDrill(ctx, c, sc, tr)
		if rep != nil {
			if werr := writeDrill(c, rep); werr != nil && err == nil {
				err = werr
			}
		}
		return err
	},
}

// drillDefaults are the traffic defaults the flags show.
var drillDefaults = drill.Traffic{Duration: 8 * time.Second, Lead: 2 * time.Second, Concurrency: 8, Timeout: 2 * time.Second}

func runDrill(ctx context.Context, c *cli.Context, sc drill.Scenario, tr drill.Traffic) (*drill.Report, error) {
	progress := c.App.ErrWriter
	if c.Bool("lab") {
		o := labOptions(c)
		o.Log = nil // the drill's own progress lines say enough
		return drill.RunLab(ctx, drill.LabOptions{
			Scenario: sc, Traffic: tr, Lab: o, Node: c.String("node"), Weight: c.String("weight"),
			SettleTimeout: c.Duration("settle-timeout"), Progress: progress,
		})
	}
	url := c.String("url")
	if url == "" {
		if c.String("vip") == "" {
			return nil, usageError("drill: give --lab, or --vip (or --url) of a real cluster")
		}
		url = "http://" + net.JoinHostPort(c.String("vip"), fmt.Sprint(c.Int("port"))) + "/"
	}
	var key []byte
	if sc == drill.Plug {
		if c.String("peer") == "" {
			return nil, usageError("drill plug on a real cluster: give --peer ADDR (the node's peer_addr) and --key-file")
		}
		var err error
		if key, err = config.ReadKey(c.String("key-file")); err != nil {
			return nil, err
		}
	}
	return drill.RunCluster(ctx, drill.ClusterOptions{
		Scenario: sc, Traffic: tr, URL: url, Socket: c.String("socket"), Node: c.String("node"),
		Peer: c.String("peer"), Key: key, Weight: c.String("weight"), Rule: c.String("rule"),
		SettleTimeout: c.Duration("settle-timeout"), Progress: progress,
	})
}

// writeDrill prints the report (text, or JSON with --json) and writes the
// files asked for.
func writeDrill(c *cli.Context, rep *drill.Report) error {
	var err error
	if c.Bool("json") {
		err = rep.WriteJSON(c.App.Writer)
	} else {
		err = rep.WriteText(c.App.Writer)
	}
	if err != nil {
		return err
	}
	if p := c.String("out-json"); p != "" {
		if err := writeFile(p, rep.WriteJSON); err != nil {
			return err
		}
	}
	if p := c.String("out-svg"); p != "" {
		if err := writeFile(p, rep.WriteSVG); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
