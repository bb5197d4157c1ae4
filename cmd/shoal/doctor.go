package main

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/shoalnet/shoal/agent/doctor"
	"github.com/shoalnet/shoal/rules"
)

var doctorCommand = &cli.Command{
	Name:  "doctor",
	Usage: "check the network around a node, or a client's entry for a VIP",
	Description: "Checks, on this node (the agent runs them): the kernel's BPF features (BTF, XDP,\n" +
		"the helpers the program calls, bpf_link); the XDP mode the agent uses and\n" +
		"whether the driver has native XDP; the sysctls (arp_ignore, arp_announce,\n" +
		"drop_unicast_in_l2_multicast, rp_filter shown); the clock's sync (adjtimex);\n" +
		"heartbeats both ways with every peer; the TCP Raft and peer API ports of every\n" +
		"peer; whether frames sent to the cluster MAC by every peer reach this node and\n" +
		"this node's reach every peer (probe frames, asked for and counted over the peer\n" +
		"API), with hypervisor hints when they do not; and the ARP requests for the VIPs\n" +
		"answered, with the static entry a router needs (this node cannot see the\n" +
		"router's table). --cluster runs the same on every registered node over the peer\n" +
		"API (mutual TLS), so every pair is checked both ways.\n\n" +
		"--neighbor <vip> runs on a client or Linux router instead, with no agent: it\n" +
		"compares this host's neighbour entry for the VIP with its cluster MAC in\n" +
		"--mac-mode (a wrong static entry, an entry learnt from a node's own MAC).\n\n" +
		"Each check says ok, warn, skip or FAIL, and what to do; the exit code is 1 when\n" +
		"any check failed.",
	Flags: []cli.Flag{
		jsonFlag,
		&cli.BoolFlag{Name: "cluster", Usage: "check every registered node, not only this one"},
		&cli.StringFlag{Name: "neighbor", Usage: "check this host's neighbour entry for `VIP` (on a client or router; no agent needed)"},
		&cli.StringFlag{Name: "mac-mode", Value: "multicast", Usage: "with --neighbor: the cluster's MAC mode, multicast or igmp"},
	},
	Action: func(c *cli.Context) error {
		if c.NArg() > 0 {
			return usageError("doctor takes no arguments")
		}
		var reps []doctor.Report
		if v := c.String("neighbor"); v != "" {
			vip, err := netip.ParseAddr(v)
			if err != nil || vip.Zone() != "" || vip.Is4In6() {
				return usageError("doctor: --neighbor %q is not an IPv4 or IPv6 address", v)
			}
			mode, err := rules.ParseMACMode(c.String("mac-mode"))
			if err == nil && mode == rules.MACRouted {
				err = errors.New("routed mode has no cluster MAC: the routers learn the VIPs over BGP")
			}
			if err != nil {
				return usageError("doctor: --mac-mode %q: want multicast or igmp: %v", c.String("mac-mode"), err)
			}
			chk, err := doctor.CheckNeighbour(vip, mode)
			if err != nil {
				return err
			}
			reps = []doctor.Report{{Node: "this host", Checks: []doctor.Check{chk}}}
		} else {
			path := "/v1/doctor"
			if c.Bool("cluster") {
				path += "?cluster=true"
			}
			if err := client(c).Do(c.Context, "GET", path, nil, &reps); err != nil {
				return err
			}
		}
		if c.Bool("json") {
			if err := printJSON(c.App.Writer, reps); err != nil {
				return err
			}
		} else {
			printDoctor(c.App.Writer, reps)
		}
		var failed []string
		for _, r := range reps {
			for _, ch := range r.Checks {
				if ch.Verdict == doctor.VerdictFail {
					failed = append(failed, r.Node+" "+ch.Name)
				}
			}
		}
		if len(failed) > 0 {
			return cli.Exit(fmt.Sprintf("doctor: failed: %s", strings.Join(failed, ", ")), exitError)
		}
		return nil
	},
}

// printDoctor prints each node's checks, one line each, with what to do
// under every check that did not pass.
func printDoctor(w io.Writer, reps []doctor.Report) {
	for i, r := range reps {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s\n", r.Node)
		for _, ch := range r.Checks {
			v := string(ch.Verdict)
			if ch.Verdict == doctor.VerdictFail {
				v = "FAIL"
			}
			fmt.Fprintf(w, "  %-4s  %-11s  %s\n", v, ch.Name, ch.Detail)
			if ch.Fix != "" && ch.Verdict != doctor.VerdictOK && ch.Verdict != doctor.VerdictSkip {
				fmt.Fprintf(w, "        %-11s  fix: %s\n", "", ch.Fix)
			}
		}
	}
}
