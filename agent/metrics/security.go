package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/peer"
)

var refusalDesc = prometheus.NewDesc("shoal_refused_total",
	"Connections, handshakes and requests the Raft, peer and metrics listeners refused, by listener and reason.",
	[]string{"listener", "reason"}, nil)

var stoppedDesc = prometheus.NewDesc("shoal_rules_stopped_index",
	"The raft index at which this node stopped applying the rules log (an entry its shoal cannot apply); 0 while applying.",
	nil, nil)

// SecurityCollector exports rules.Refusals as a Prometheus counter, and
// where the rules FSM stopped, if it did.
type SecurityCollector struct {
	Refusals *peer.Refusals
	Rules    control.Halter
}

func (c SecurityCollector) Describe(ch chan<- *prometheus.Desc) { ch <- refusalDesc; ch <- stoppedDesc }

func (c SecurityCollector) Collect(ch chan<- prometheus.Metric) {
	st, _ := c.Rules.Halted()
	ch <- prometheus.MustNewConstMetric(stoppedDesc, prometheus.GaugeValue, float64(st.Index))
	for _, n := range c.Refusals.Counts() {
		ch <- prometheus.MustNewConstMetric(refusalDesc, prometheus.CounterValue, float64(n.N), n.Listener, n.Reason)
	}
}
