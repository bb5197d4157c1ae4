package main

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/urfave/cli/v2"
)

var queryCommand = &cli.Command{
	Name:  "query",
	Usage: "show the cluster: every node, its state and its share of each rule",
	Description: "Like NLB's query: lists every registered node with its admin state, whether it\n" +
		"is alive, healthy and eligible, and its share of each port rule in the current\n" +
		"view, then whether the cluster has converged.\n\n" +
		"With --flow CLIENT_IP:PORT VIP:PORT[/tcp|/udp] it explains one flow instead:\n" +
		"the rule that covers it, its flow key, hash and bucket, the bucket's owner in\n" +
		"the current view, each node's own state for that bucket and whether it holds\n" +
		"this connection, and which node would take the flow if any one node failed.",
	ArgsUsage: "[VIP:PORT[/tcp|/udp] with --flow]",
	Flags: []cli.Flag{jsonFlag,
		&cli.StringFlag{Name: "flow", Usage: "explain the flow from this `CLIENT_IP:PORT` to the VIP:PORT argument"},
		&cli.BoolFlag{Name: "local", Usage: "with --flow: this node's answer only, without asking the others"},
	},
	Action: func(c *cli.Context) error {
		if c.IsSet("flow") {
			return queryFlow(c)
		}
		if c.NArg() > 0 {
			return usageError("query takes no arguments without --flow")
		}
		q, err := client(c).Query(c.Context)
		if err != nil {
			return err
		}
		if c.Bool("json") {
			return printJSON(c.App.Writer, q)
		}
		printQuery(c.App.Writer, q)
		return nil
	},
}

func printQuery(w io.Writer, q *control.Query) {
	state := "converged"
	if !q.Converged {
		state = "converging"
	}
	fmt.Fprintf(w, "cluster %08x, %s, rules index %d, leader %s (asked %s)\n", q.Settings.ClusterID, state, q.RulesIndex, orNone(q.Leader), q.Self)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprint(tw, "ID\tNODE\tPRIO\tADMIN\tLIVE\tHEALTHY\tELIGIBLE\tRAFT")
	for _, r := range q.Rules {
		fmt.Fprintf(tw, "\tRULE %d", r.ID)
	}
	fmt.Fprintln(tw, "\tDEFAULT")
	for _, n := range q.Nodes {
		raft := n.Raft
		if n.Zone != "" {
			raft += " (" + n.Zone + ")"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s", n.ID, n.Name, n.HostPriority, n.Admin, yes(n.Live), yes(n.Healthy), yes(n.Eligible), raft)
		for _, r := range q.Rules {
			fmt.Fprintf(tw, "\t%.1f%%", 100*n.Share[r.ID])
		}
		fmt.Fprintf(tw, "\t%.0f%%\n", 100*n.Share[0])
	}
	tw.Flush()
	printRaft(w, q.Raft, q.Leader)
	if len(q.Rules) > 0 {
		fmt.Fprintln(w)
		printRules(w, q.Rules)
	}
	if q.BGP != nil {
		fmt.Fprintln(w)
		printBGP(w, q.BGP)
	}
	if q.Forwarding != nil {
		fmt.Fprintln(w)
		printForwarding(w, q.Forwarding)
	}
}

// printForwarding shows what the asked node forwarded to and received from
// each peer (routed mode).
func printForwarding(w io.Writer, f *control.ForwardInfo) {
	if !f.On {
		fmt.Fprintln(w, "forwarding: off (plain ECMP: this node keeps every packet the routers send it)")
		return
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FORWARDED TO/FROM	ADDRESS	TO OWNER	SECOND CHANCE	RECEIVED")
	for _, p := range f.Peers {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\n", p.Node, p.Addr, p.Forwarded, p.SecondChance, p.Received)
	}
	tw.Flush()
	fmt.Fprintf(w, "not forwarded: %d from strangers, %d without a next hop, %d past the hop limit, %d over the MTU\n",
		f.Foreign, f.NoRoute, f.HopLimit, f.TooBig)
	if f.ClampError != "" {
		fmt.Fprintf(w, "WARNING: SYN-ACKs are not MSS-clamped (%s): full-size segments forwarded here are dropped\n", f.ClampError)
	}
}

// printBGP shows the asked node's BGP sessions and announcements.
func printBGP(w io.Writer, b *control.BGPInfo) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BGP NEIGHBOR\tASN\tSTATE\tSINCE\tBFD\tSENT\tRECEIVED\tLAST ERROR")
	for _, s := range b.Sessions {
		since := "-"
		if !s.Since.IsZero() {
			since = s.Since.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%d\t%d\t%s\n", s.Neighbor, s.ASN, s.State, since, orNone(s.BFD), s.Sent, s.Received, orNone(s.LastError))
	}
	tw.Flush()
	vips := make([]netip.Addr, 0, len(b.Announced))
	for v := range b.Announced {
		vips = append(vips, v)
	}
	slices.SortFunc(vips, netip.Addr.Compare)
	if len(vips) == 0 {
		fmt.Fprintln(w, "announcing: nothing (this node is not eligible)")
	}
	for _, v := range vips {
		fmt.Fprintf(w, "announcing %s since %s\n", v, b.Announced[v].Format(time.RFC3339))
	}
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// queryFlow explains one flow: shoal query --flow CLIENT:PORT VIP:PORT/tcp.
func queryFlow(c *cli.Context) error {
	target, err := oneArg(c, "VIP:PORT[/tcp|/udp]")
	if err != nil {
		return err
	}
	cl, err := netip.ParseAddrPort(c.String("flow"))
	if err != nil {
		return usageError("--flow %q: want CLIENT_IP:PORT: %v", c.String("flow"), err)
	}
	q := url.Values{"client": {cl.String()}, "to": {target}}
	if c.Bool("local") {
		q.Set("peers", "0")
	}
	var f control.Flow
	if err := client(c).Do(c.Context, "GET", "/v1/flow?"+q.Encode(), nil, &f); err != nil {
		var se *control.StatusError
		if errors.As(err, &se) && se.Code == 400 {
			return usageError("%s", se.Msg)
		}
		return err
	}
	if c.Bool("json") {
		return printJSON(c.App.Writer, f)
	}
	printFlow(c.App.Writer, &f)
	return nil
}

func printFlow(w io.Writer, f *control.Flow) {
	fmt.Fprintf(w, "flow      %s -> %s/%s\n", f.Client, f.To, f.Proto)
	if f.Rule == 0 {
		fmt.Fprintf(w, "rule      default: %s\n", f.RuleDesc)
	} else {
		fmt.Fprintf(w, "rule      %d: %s\n", f.Rule, f.RuleDesc)
	}
	fmt.Fprintf(w, "flow key  %s (affinity %s), hash %#08x, bucket %d\n", f.Key, f.Affinity, f.Hash, f.Bucket)
	state := "converged"
	if !f.Converged {
		state = "not converged yet: the owner takes new connections once it is"
	}
	fmt.Fprintf(w, "owner     %s (view: %s; %s)\n", orNone(f.Owner), strings.Join(f.View, " "), state)
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tHOLDS THIS FLOW\tCONNECTIONS IN BUCKET")
	for _, n := range f.Nodes {
		if n.Error != "" {
			fmt.Fprintf(tw, "%s\t?\t?\t?\t(%s)\n", n.Name, n.Error)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", n.Name, n.State, yes(n.HoldsFlow), yes(n.BucketHeld))
	}
	tw.Flush()
	routed := false
	for _, n := range f.Nodes {
		routed = routed || n.Forwarding != ""
	}
	if routed {
		fmt.Fprintln(w, "\nrouted: if the router sends the flow to")
		for _, n := range f.Nodes {
			if n.Forwarding != "" {
				fmt.Fprintf(w, "  %s: it %s\n", n.Name, n.Forwarding)
			}
		}
	}
	if len(f.IfDown) > 0 {
		fmt.Fprintln(w, "\nif one node failed:")
		downs := make([]string, 0, len(f.IfDown))
		for d := range f.IfDown {
			downs = append(downs, d)
		}
		sort.Strings(downs)
		for _, d := range downs {
			fmt.Fprintf(w, "  %s down -> %s\n", d, orNone(f.IfDown[d]))
		}
	}
}

// printRaft says how many vote and, asked of the leader, how healthy they
// are and the last vote its autopilot gave or took.
func printRaft(w io.Writer, r control.RaftInfo, leader string) {
	fmt.Fprintf(w, "raft: %d voters, %d non-voters", r.Voters, r.NonVoters)
	if !r.Autopilot {
		fmt.Fprintf(w, "; the leader (%s) keeps five voters and knows their health: ask it\n", orNone(leader))
		return
	}
	health := "every member healthy"
	if !r.Healthy {
		health = "unhealthy: " + strings.Join(r.Unhealthy, ", ")
	}
	fmt.Fprintf(w, "; %s; %d voters may fail with the rules still writable", health, r.FailureTolerance)
	if c := r.LastChange; c != nil {
		what := "promoted " + c.Promoted
		if c.Demoted != "" {
			what = "demoted " + c.Demoted
		}
		fmt.Fprintf(w, "; last change %s, %s", c.At.Format("2006-01-02 15:04:05"), what)
	}
	fmt.Fprintln(w)
}
