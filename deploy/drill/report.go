package drill

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/shoalnet/shoal/deploy/lab/load"
)

// Report is what a drill measured.
type Report struct {
	Scenario Scenario `json:"scenario"`
	Target   string   `json:"target"` // "lab shl1234" or "cluster"
	URL      string   `json:"url"`
	Node     string   `json:"node"` // the node the scenario acted on
	Nodes    []string `json:"nodes"`
	// Heartbeat settings as the agents reported them.
	HeartbeatPeriod    string `json:"heartbeat_period,omitempty"`
	HeartbeatTolerance int    `json:"heartbeat_tolerance,omitempty"`

	KeepAlive   bool    `json:"keepalive"`
	Concurrency int     `json:"concurrency"`
	Rate        float64 `json:"rate,omitempty"` // requested rate; 0 = as fast as possible

	// EventAtMS is when the scenario acted, from the start of the traffic.
	EventAtMS float64 `json:"event_at_ms"`
	// SettledMS is how long after the event the cluster settled again: for
	// plug, kill and drainstop the failover time (the other nodes accept
	// every bucket again); for join and weight, until every node converged
	// on the new tables. -1 if it did not settle in time.
	SettledMS float64 `json:"settled_ms"`
	Settled   string  `json:"settled_what"`

	DurationMS      float64                 `json:"duration_ms"`
	Requests        int                     `json:"requests"`
	Successes       int                     `json:"successes"`
	Failures        int                     `json:"failures"`
	RatePerSec      float64                 `json:"rate_per_sec"`
	P50MS           float64                 `json:"p50_ms"`
	P99MS           float64                 `json:"p99_ms"`
	Errors          map[load.ErrorClass]int `json:"errors,omitempty"`
	FailureList     []load.Failure          `json:"failure_list,omitempty"`
	FailuresDropped int                     `json:"failures_dropped,omitempty"`
	// Delayed counts the requests that succeeded only after a SYN
	// retransmission (connect time >= 1 s): the SYN landed where nobody
	// took it. A planned change should delay none.
	Delayed     int            `json:"syn_delayed"`
	DelayedList []load.Failure `json:"syn_delayed_list,omitempty"`
	// Retransmits: TCP segments the client sent again after a loss (nil
	// where the system does not say). Packets the nodes dropped cause
	// them; a node slow to answer (starved of CPU) does not.
	Retransmits *uint64 `json:"retransmits,omitempty"`
	// Held: the long-lived connections held across the event (Traffic.Held)
	// and how many broke; nil without them.
	Held         *load.HeldResult `json:"held,omitempty"`
	Connects     int              `json:"connects"`
	ConnectP99MS float64          `json:"connect_p99_ms"`
	Timeline     []Slot           `json:"timeline"`
}

// NewReport fills a report's traffic fields from a load result and the
// agents' counter samples.
func NewReport(res load.Result, samples []Sample) Report {
	return Report{
		DurationMS:      res.DurationMS,
		Requests:        res.Requests,
		Successes:       res.Successes,
		Failures:        res.Failures,
		RatePerSec:      res.RatePerSec,
		P50MS:           res.P50MS,
		P99MS:           res.P99MS,
		Errors:          res.Errors,
		FailureList:     res.FailureList,
		FailuresDropped: res.FailuresDropped,
		Delayed:         res.Delayed,
		DelayedList:     res.DelayedList,
		Retransmits:     res.Retransmits,
		Connects:        res.Connects,
		ConnectP99MS:    res.ConnectP99MS,
		Timeline:        Timeline(res, samples),
		SettledMS:       -1,
	}
}

// FailureWindow returns when the first and the last failed request
// started, relative to the event (negative = before it); ok is false when
// no request failed.
func (r *Report) FailureWindow() (first, last float64, ok bool) {
	if len(r.FailureList) == 0 {
		return 0, 0, false
	}
	first, last = r.FailureList[0].AtMS, r.FailureList[0].AtMS
	for _, f := range r.FailureList {
		first, last = min(first, f.AtMS), max(last, f.AtMS)
	}
	return first - r.EventAtMS, last - r.EventAtMS, true
}

// SuccessAfter returns the fraction of requests that succeeded among those
// that started at least afterMS after the event, and how many there were.
func (r *Report) SuccessAfter(afterMS float64) (frac float64, n int) {
	var ok int
	for _, s := range r.Timeline {
		if s.AtMS < r.EventAtMS+afterMS {
			continue
		}
		ok += s.Successes
		n += s.Successes + s.Failures
	}
	if n == 0 {
		return 0, 0
	}
	return float64(ok) / float64(n), n
}

// NodeNames returns the nodes seen in the report: r.Nodes, then any other
// node the timeline names, sorted.
func (r *Report) NodeNames() []string {
	set := map[string]bool{}
	for _, n := range r.Nodes {
		set[n] = true
	}
	for _, s := range r.Timeline {
		for n := range s.Responses {
			set[n] = true
		}
		for n := range s.Packets {
			set[n] = true
		}
	}
	extra := []string{}
	for n := range set {
		if !slices.Contains(r.Nodes, n) {
			extra = append(extra, n)
		}
	}
	sort.Strings(extra)
	return append(slices.Clone(r.Nodes), extra...)
}

// EventLabel says what happened, e.g. "plug pulled on node3".
func (r *Report) EventLabel() string { return r.Scenario.verb() + " " + r.Node }

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// maxTextFailures bounds the failed requests WriteText lists one by one.
const maxTextFailures = 20

// WriteText writes the report for a person: a summary, the failures and
// the timeline.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	conn := "new connections"
	if r.KeepAlive {
		conn = "keep-alive"
	}
	fmt.Fprintf(&b, "drill %s on %s: %s, %s, concurrency %d", r.Scenario, r.Target, r.URL, conn, r.Concurrency)
	if r.Rate > 0 {
		fmt.Fprintf(&b, ", %.0f req/s", r.Rate)
	}
	if r.HeartbeatPeriod != "" {
		fmt.Fprintf(&b, ", heartbeat %s x %d", r.HeartbeatPeriod, r.HeartbeatTolerance)
	}
	fmt.Fprintf(&b, "\n%s at %.2f s\n", r.EventLabel(), r.EventAtMS/1000)
	if r.SettledMS >= 0 {
		fmt.Fprintf(&b, "%s %.0f ms after the event\n", r.Settled, r.SettledMS)
	} else {
		fmt.Fprintf(&b, "NOT SETTLED: %s did not happen in time\n", r.Settled)
	}
	fmt.Fprintf(&b, "requests %d, succeeded %d, failed %d; %.0f req/s; p50 %.2f ms, p99 %.2f ms\n",
		r.Requests, r.Successes, r.Failures, r.RatePerSec, r.P50MS, r.P99MS)
	fmt.Fprintf(&b, "delayed by a SYN retransmission (connect >= %v): %d of %d requests; %d connects, p99 %.2f ms\n",
		load.SYNRetransmit, r.Delayed, r.Requests, r.Connects, r.ConnectP99MS)
	if r.Retransmits != nil {
		fmt.Fprintf(&b, "segments the client retransmitted after a loss: %d\n", *r.Retransmits)
	}
	if h := r.Held; h != nil {
		fmt.Fprintf(&b, "held keep-alive connections: %d (%d requests), broken %d\n", h.Connections, h.Requests, h.Broken)
		for _, e := range h.BrokenList {
			fmt.Fprintf(&b, "  %s\n", e)
		}
	}
	if first, last, ok := r.FailureWindow(); ok {
		fmt.Fprintf(&b, "failures started between %+.2f s and %+.2f s of the event:", first/1000, last/1000)
		for _, c := range slices.Sorted(maps.Keys(r.Errors)) {
			fmt.Fprintf(&b, " %s %d", c, r.Errors[c])
		}
		b.WriteString("\n")
	}
	if r.SettledMS >= 0 {
		if frac, n := r.SuccessAfter(r.SettledMS); n > 0 {
			fmt.Fprintf(&b, "after it settled: %.2f%% of %d requests succeeded\n", 100*frac, n)
		}
	}
	if len(r.FailureList) > 0 {
		b.WriteString("failed requests (start from the event, latency, error):\n")
		for i, f := range r.FailureList {
			if i == maxTextFailures {
				fmt.Fprintf(&b, "  ... and %d more (see the JSON)\n", len(r.FailureList)-i+r.FailuresDropped)
				break
			}
			fmt.Fprintf(&b, "  %+8.0f ms  %7.1f ms  %-8s %s\n", f.AtMS-r.EventAtMS, f.LatencyMS, f.Class, f.Error)
		}
	}
	if len(r.DelayedList) > 0 {
		b.WriteString("delayed requests (start from the event, connect, latency):\n")
		for i, d := range r.DelayedList {
			if i == maxTextFailures {
				fmt.Fprintf(&b, "  ... and %d more (see the JSON)\n", r.Delayed-i)
				break
			}
			fmt.Fprintf(&b, "  %+8.0f ms  %7.1f ms  %7.1f ms\n", d.AtMS-r.EventAtMS, d.ConnectMS, d.LatencyMS)
		}
	}
	nodes := r.NodeNames()
	b.WriteString("timeline per 100 ms (syn1s: delayed by a SYN retransmission; responses per node; share of accepted packets from the agents' counters):\n")
	fmt.Fprintf(&b, "  %7s %6s %5s %5s %7s %7s", "t(s)", "ok", "fail", "syn1s", "p50ms", "p99ms")
	for _, n := range nodes {
		fmt.Fprintf(&b, " %7s", n)
	}
	b.WriteString("  |")
	for _, n := range nodes {
		fmt.Fprintf(&b, " %6s", n)
	}
	b.WriteString("\n")
	for _, s := range r.Timeline {
		mark := " "
		if s.AtMS <= r.EventAtMS && r.EventAtMS < s.AtMS+100 {
			mark = ">"
		}
		fmt.Fprintf(&b, "%s %7.1f %6d %5d %5d %7.2f %7.2f", mark, s.AtMS/1000, s.Successes, s.Failures, s.Delayed, s.P50MS, s.P99MS)
		for _, n := range nodes {
			fmt.Fprintf(&b, " %7d", s.Responses[n])
		}
		b.WriteString("  |")
		for _, n := range nodes {
			if sh, ok := s.Share[n]; ok {
				fmt.Fprintf(&b, " %5.1f%%", 100*sh)
			} else {
				fmt.Fprintf(&b, " %6s", "-")
			}
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
