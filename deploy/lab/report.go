package lab

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/shoalnet/shoal/deploy/lab/load"
)

// Report is what `shoal lab run` measured.
type Report struct {
	Lab        string  `json:"lab"`
	Nodes      int     `json:"nodes"`
	Family     string  `json:"family,omitempty"` // of the VIPs: 4, 6 or dual
	VIP        string  `json:"vip"`
	ClusterMAC string  `json:"cluster_mac"` // what the VIP must resolve to
	ClientARP  string  `json:"client_arp"`  // what the client resolved it to (ARP, or NDP for an IPv6 VIP)
	Period     string  `json:"heartbeat_period,omitempty"`
	Victim     string  `json:"victim"`     // the node whose plug was pulled
	PullAtMS   float64 `json:"pull_at_ms"` // into the "during" traffic
	// FailoverMS is the time from the pull until every bucket of every rule
	// was accepted again by the survivors, all converged without the victim;
	// -1 if that did not happen within the timeout.
	FailoverMS float64 `json:"failover_ms"`
	// Failovers holds every pull's failover time, the first one included.
	Failovers     []float64 `json:"failovers_ms,omitempty"`
	FailoverP50MS float64   `json:"failover_p50_ms,omitempty"`
	FailoverP99MS float64   `json:"failover_p99_ms,omitempty"`
	FailoverMaxMS float64   `json:"failover_max_ms,omitempty"`
	// Mode is "routed" for a routed lab, where each failover is the
	// router's withdrawal of the victim (from the pull until its kernel
	// route to the VIP no longer has it), and every pull is made under
	// traffic: Recoveries holds, per pull, the time from the pull to the
	// start of the last request that failed; LaterFailures the failed
	// requests of the pulls after the first (the first's are in During).
	Mode          string    `json:"mode,omitempty"`
	Recoveries    []float64 `json:"recoveries_ms,omitempty"`
	RecoveryP50MS float64   `json:"recovery_p50_ms,omitempty"`
	RecoveryP99MS float64   `json:"recovery_p99_ms,omitempty"`
	LaterFailures int       `json:"later_pulls_failed,omitempty"`
	// Served is how many nodes run the HTTP server and take connections
	// (the others are at weight 0), if not every node.
	Served int `json:"served,omitempty"`
	// Balance is the most buckets a served node owns of a rule shared by
	// several nodes, over the mean (1 is even), before the first pull.
	Balance float64 `json:"balance,omitempty"`
	// Packets compares, before and after the pulls, the IPv4 packets the
	// client sent with those the nodes took (IPv4 labs). None is taken
	// twice; after a pull, the client's packets for the pulled node's
	// connections (retransmissions, resets) are taken by none.
	Packets map[string]PacketCheck `json:"packets,omitempty"`
	Before  load.Result            `json:"before"`
	During  load.Result            `json:"during"`
	After   load.Result            `json:"after"`
	// Also is the traffic to the lab's other VIP (the IPv6 one of a dual
	// lab), sent at the same time as to VIP, phase by phase.
	Also []VIPReport `json:"also,omitempty"`
	Kept bool        `json:"kept,omitempty"`
}

// VIPReport is what a run measured on one more VIP.
type VIPReport struct {
	VIP            string      `json:"vip"`
	ClusterMAC     string      `json:"cluster_mac"`
	ClientNeighbor string      `json:"client_neighbor"` // what the client resolved it to
	Before         load.Result `json:"before"`
	During         load.Result `json:"during"`
	After          load.Result `json:"after"`
}

// WriteText prints the report for a person.
func (r *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "lab %s: %d nodes, VIP %s\n", r.Lab, r.Nodes, r.VIP)
	if r.Mode == "routed" {
		fmt.Fprintln(w, "routed mode: the client reaches the VIP through the lab's router (FRR, ECMP over the nodes)")
	} else {
		fmt.Fprintf(w, "client resolved the VIP to %s\n", resolved(r.ClientARP, r.ClusterMAC))
	}
	if r.Period != "" {
		fmt.Fprintf(w, "heartbeat period %s\n", r.Period)
	}
	fmt.Fprintln(w)
	phase(w, "before", r.Before)
	phase(w, "during", r.During)
	if fl := r.During.FailureList; len(fl) > 0 && r.Victim != "" {
		first, last := fl[0].AtMS, fl[0].AtMS
		for _, f := range fl {
			first, last = min(first, f.AtMS), max(last, f.AtMS)
		}
		fmt.Fprintf(w, "        failed requests started %+.0f to %+.0f ms from the pull\n", first-r.PullAtMS, last-r.PullAtMS)
	}
	phase(w, "after", r.After)
	if r.Balance > 0 {
		fmt.Fprintf(w, "balance: the busiest node owns %.3f times the mean share of buckets\n", r.Balance)
	}
	for _, ph := range []string{"before", "after"} {
		if p, ok := r.Packets[ph]; ok {
			fmt.Fprintf(w, "packets %s: the client sent %d, the nodes took %d (%d twice, %d by none)\n", ph, p.Sent, p.Taken, p.Twice(), p.Untaken())
			if ph == "after" && p.Untaken() > 0 {
				fmt.Fprintln(w, "        (by none: the client's packets for connections the pulled node held)")
			}
		}
	}
	for _, a := range r.Also {
		fmt.Fprintf(w, "\nand at the same time, VIP %s (client resolved it to %s)\n", a.VIP, resolved(a.ClientNeighbor, a.ClusterMAC))
		phase(w, "before", a.Before)
		phase(w, "during", a.During)
		phase(w, "after", a.After)
	}
	fmt.Fprintln(w)
	switch {
	case r.Victim == "":
		fmt.Fprintln(w, "no plug was pulled")
	case r.FailoverMS < 0:
		fmt.Fprintf(w, "plug pulled on %s at %.0f ms: the survivors did NOT cover every bucket in time\n", r.Victim, r.PullAtMS)
	case r.Mode == "routed":
		fmt.Fprintf(w, "plug pulled on %s at %.0f ms: the router dropped it after %.0f ms\n", r.Victim, r.PullAtMS, r.FailoverMS)
		fmt.Fprintf(w, "%d pulls under traffic: router withdrawal p50 %.0f ms, p99 %.0f ms; pull to the last failed request p50 %.0f ms, p99 %.0f ms; %d failed in the later pulls\n",
			len(r.Failovers), r.FailoverP50MS, r.FailoverP99MS, r.RecoveryP50MS, r.RecoveryP99MS, r.LaterFailures)
	default:
		fmt.Fprintf(w, "plug pulled on %s at %.0f ms: every bucket owned again after %.0f ms\n", r.Victim, r.PullAtMS, r.FailoverMS)
	}
	if len(r.Failovers) > 1 && r.Mode != "routed" {
		fmt.Fprintf(w, "%d pulls: failover p50 %.0f ms, p99 %.0f ms, max %.0f ms\n",
			len(r.Failovers), r.FailoverP50MS, r.FailoverP99MS, r.FailoverMaxMS)
	}
	if r.Kept {
		fmt.Fprintf(w, "the lab is still up: `shoal lab status %s`, `shoal lab down %s`\n", r.Lab, r.Lab)
	}
}

// summarizeFailovers fills in the failover percentiles (nearest rank).
func (r *Report) summarizeFailovers() {
	if len(r.Failovers) == 0 {
		return
	}
	d := make([]time.Duration, len(r.Failovers))
	for i, f := range r.Failovers {
		d[i] = time.Duration(f * float64(time.Millisecond))
	}
	r.FailoverP50MS = ms(load.Percentile(d, 50))
	r.FailoverP99MS = ms(load.Percentile(d, 99))
	r.FailoverMaxMS = ms(d[len(d)-1]) // Percentile sorted d
	if len(r.Recoveries) > 0 {
		d := make([]time.Duration, len(r.Recoveries))
		for i, f := range r.Recoveries {
			d[i] = time.Duration(f * float64(time.Millisecond))
		}
		r.RecoveryP50MS = ms(load.Percentile(d, 50))
		r.RecoveryP99MS = ms(load.Percentile(d, 99))
	}
}

func phase(w io.Writer, name string, res load.Result) {
	if res.Requests == 0 {
		fmt.Fprintf(w, "%-7s -\n", name)
		return
	}
	fmt.Fprintf(w, "%-7s %6d requests %5d failed  %7.0f req/s  p50 %6.2f ms  p99 %7.2f ms  share %s\n",
		name, res.Requests, res.Failures, res.RatePerSec, res.P50MS, res.P99MS, shares(res.Share))
	if res.Delayed > 0 {
		fmt.Fprintf(w, "        %d delayed by a SYN retransmission (connect >= %v)\n", res.Delayed, load.SYNRetransmit)
	}
	if len(res.Errors) > 0 {
		var parts []string
		for c, n := range res.Errors {
			parts = append(parts, fmt.Sprintf("%s %d", c, n))
		}
		slices.Sort(parts)
		fmt.Fprintf(w, "        errors: %s\n", strings.Join(parts, ", "))
	}
}

// shares formats per-node shares in node name order.
func shares(s map[string]float64) string {
	names := make([]string, 0, len(s))
	for n := range s {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int {
		if len(a) != len(b) { // node2 before node10
			return len(a) - len(b)
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %.1f%%", n, 100*s[n]))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, "  ")
}

// resolved says what the client resolved a VIP to, and whether that is its
// cluster MAC.
func resolved(got, want string) string {
	verdict := "as it should"
	if !strings.EqualFold(got, want) {
		verdict = "WRONG, want " + want
	}
	return orDash(got) + " (" + verdict + ")"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
