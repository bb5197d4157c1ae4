package main

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/urfave/cli/v2"
)

var rulesCommand = &cli.Command{
	Name:        "rules",
	Usage:       "list, add, change and remove port rules",
	Description: "Port rules say how the cluster spreads the traffic of a VIP's port range:\nmultiple-host (by weight), single-host (by handling priority) or disabled.",
	Subcommands: []*cli.Command{
		{
			Name:        "list",
			Usage:       "list the port rules with every node's settings",
			Description: "Lists every port rule and, per node, its weight, handling priority and state.",
			Flags:       []cli.Flag{jsonFlag},
			Action: func(c *cli.Context) error {
				var rs []control.RuleInfo
				if err := client(c).Do(c.Context, "GET", "/v1/rules", nil, &rs); err != nil {
					return err
				}
				if c.Bool("json") {
					return printJSON(c.App.Writer, rs)
				}
				printRules(c.App.Writer, rs)
				return nil
			},
		},
		{
			Name:        "add",
			Usage:       "add a port rule",
			Description: "Adds a port rule. Port ranges of one VIP and protocol must not overlap.",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "vip", Value: "all", Usage: "the VIP, or all"},
				&cli.StringFlag{Name: "ports", Required: true, Usage: "a port or a range: 80, 8000-8099, 0-65535"},
				&cli.StringFlag{Name: "proto", Value: "tcp", Usage: "tcp, udp or both"},
				&cli.StringFlag{Name: "mode", Value: "multiple", Usage: "multiple, single or disabled"},
				&cli.StringFlag{Name: "affinity", Value: "single", Usage: "none (client ip+port), single (client ip) or network (client /24)"},
				jsonFlag,
			},
			Action: func(c *cli.Context) error {
				req := control.RuleRequest{VIP: c.String("vip"), Ports: c.String("ports"), Proto: c.String("proto"),
					Mode: c.String("mode"), Affinity: c.String("affinity")}
				var info control.RuleInfo
				if err := client(c).Do(c.Context, "POST", "/v1/rules", req, &info); err != nil {
					return err
				}
				if c.Bool("json") {
					return printJSON(c.App.Writer, info)
				}
				fmt.Fprintf(c.App.Writer, "added rule %d: %s:%s/%s %s affinity %s\n", info.ID, info.VIP, info.Ports, info.Proto, info.Mode, info.Affinity)
				return nil
			},
		},
		{
			Name:      "set",
			Usage:     "change a port rule in place",
			ArgsUsage: "<vip:port|rule-id>",
			Description: "Changes the given fields of one rule and keeps the others, its state and\n" +
				"every node's weight and priority for it. The change is one replicated command,\n" +
				"so no node ever sees the rule missing. Connections the rule's new mapping\n" +
				"would move are drained like any other move.",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "vip", Usage: "the VIP, or all"},
				&cli.StringFlag{Name: "ports", Usage: "a port or a range: 80, 8000-8099, 0-65535"},
				&cli.StringFlag{Name: "proto", Usage: "tcp, udp or both"},
				&cli.StringFlag{Name: "mode", Usage: "multiple, single or disabled"},
				&cli.StringFlag{Name: "affinity", Usage: "none (client ip+port), single (client ip) or network (client /24)"},
				jsonFlag,
			},
			Action: func(c *cli.Context) error {
				target, err := oneArg(c, "<vip:port|rule-id>")
				if err != nil {
					return err
				}
				req := control.RuleEditRequest{VIP: c.String("vip"), Ports: c.String("ports"), Proto: c.String("proto"),
					Mode: c.String("mode"), Affinity: c.String("affinity")}
				if req == (control.RuleEditRequest{}) {
					return usageError("rules set: nothing to change; give --vip, --ports, --proto, --mode or --affinity")
				}
				var info control.RuleInfo
				if err := client(c).Do(c.Context, "PUT", "/v1/rules/"+target, req, &info); err != nil {
					return err
				}
				if c.Bool("json") {
					return printJSON(c.App.Writer, info)
				}
				fmt.Fprintf(c.App.Writer, "rule %d is now %s:%s/%s %s affinity %s\n", info.ID, info.VIP, info.Ports, info.Proto, info.Mode, info.Affinity)
				return nil
			},
		},
		{
			Name:        "remove",
			Usage:       "remove a port rule",
			ArgsUsage:   "<vip:port|rule-id>",
			Description: "Removes a port rule; its traffic then goes to the default host.",
			Action: func(c *cli.Context) error {
				target, err := oneArg(c, "<vip:port|rule-id>")
				if err != nil {
					return err
				}
				if err := client(c).Do(c.Context, "DELETE", "/v1/rules/"+target, nil, nil); err != nil {
					return err
				}
				fmt.Fprintf(c.App.Writer, "removed rule %s\n", target)
				return nil
			},
		},
	},
}

func printRules(w io.Writer, rs []control.RuleInfo) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tVIP\tPORTS\tPROTO\tMODE\tAFFINITY\tSTATE\tNODES (weight/priority/state)")
	for _, r := range rs {
		names := make([]string, 0, len(r.Nodes))
		for n := range r.Nodes {
			names = append(names, n)
		}
		slices.Sort(names)
		nodes := ""
		for _, n := range names {
			nr := r.Nodes[n]
			nodes += fmt.Sprintf("%s=%d/%d/%s ", n, nr.Weight, nr.HandlingPriority, nr.State)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.VIP, r.Ports, r.Proto, r.Mode, r.Affinity, r.State, nodes)
	}
	tw.Flush()
}
