package metrics

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/shoalnet/shoal/agent/control"
)

// Source is what the metrics endpoint reads at scrape time.
type Source interface {
	Status() control.Status
	Params() control.Params
}

// collector exports the agent's state and counters as Prometheus metrics,
// read when scraped so that they never lag or cost anything in between.
type collector struct {
	src                                                Source
	accepted, dropped, handed, hb, arp, ndp            *prometheus.Desc
	converged, healthy, buckets, conns, rulesIndex, up *prometheus.Desc
	dpFailures, dpHealthy                              *prometheus.Desc
	bgpSession, bgpBFD, bgpAnnounced, bgpEvents        *prometheus.Desc
	forwarded, forwardDrops, ruleForward               *prometheus.Desc
	raftVoter, raftVoters, raftTolerance, raftChanges  *prometheus.Desc
	hbBytes                                            *prometheus.Desc
}

func newCollector(src Source) *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("shoal_"+name, help, labels, nil)
	}
	return &collector{
		src:        src,
		accepted:   d("packets_accepted_total", "VIP packets this node accepted, by rule.", "rule"),
		dropped:    d("packets_dropped_total", "VIP packets this node dropped, by rule and reason.", "rule", "reason"),
		handed:     d("syns_handed_total", "SYNs of buckets moving between nodes handed over, by rule and direction: out (to the new owner), in (taken here), refused (handed here, taken already).", "rule", "direction"),
		hb:         d("heartbeat_events_total", "Heartbeat messages by event (sent, received, rejected reasons).", "event"),
		hbBytes:    d("heartbeat_bytes_total", "Heartbeat payload bytes (UDP), by direction: sent, received.", "direction"),
		arp:        d("arp_events_total", "ARP frames by outcome.", "event"),
		ndp:        d("ndp_events_total", "Neighbor Solicitations for the IPv6 VIPs by outcome.", "event"),
		converged:  d("converged", "1 when this node's view has converged with every eligible peer."),
		healthy:    d("healthy", "1 when the application health check passes."),
		buckets:    d("buckets", "Buckets by state, per rule.", "rule", "state"),
		conns:      d("connections", "TCP connections this node holds on the VIPs."),
		rulesIndex: d("rules_index", "Raft index of the rules this node applies."),
		up:         d("eligible_nodes", "Nodes in this node's current view."),
		dpFailures: d("dataplane_update_failures_total", "Table pushes the data plane refused (the node then leaves the eligible set)."),
		dpHealthy:  d("dataplane_healthy", "1 when the data plane takes this node's tables."),

		bgpSession:   d("bgp_session_established", "1 while the BGP session to the neighbour is established (routed mode).", "neighbor"),
		bgpBFD:       d("bgp_bfd_up", "1 while the BFD session to the neighbour is up (routed mode, neighbours with BFD).", "neighbor"),
		bgpAnnounced: d("bgp_announced_vips", "VIPs this node announces over BGP now (routed mode)."),
		bgpEvents:    d("bgp_events_total", "BGP speaker events: session_failures, withdrawn (announcements withdrawn).", "event"),

		forwarded:    d("forwarded_packets_total", "Routed mode: VIP packets forwarded to a peer (direction out: to the bucket's owner; second_chance: to a previous owner that may hold the connection) or received from it (in).", "peer", "direction"),
		forwardDrops: d("forward_drops_total", "Routed mode: packets not forwarded or not taken: foreign (forwarded here by no member), no_route (no next hop's MAC), hop_limit, too_big (over the MTU once encapsulated).", "reason"),
		ruleForward:  d("packets_forwarded_total", "Routed mode: VIP packets this node did not take and forwarded, by rule.", "rule"),

		raftVoter:     d("raft_voter", "1 while this node votes in Raft (the leader included)."),
		raftVoters:    d("raft_members", "Raft members by suffrage (voter, nonvoter), as this node knows the configuration.", "suffrage"),
		raftTolerance: d("raft_failure_tolerance", "Leader only: voters that may fail with the rules still writable, as its autopilot sees their health."),
		raftChanges:   d("raft_voter_changes_total", "Leader only: promotions and demotions its autopilot made (a dead voter replaced, a surplus demoted)."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.accepted, c.dropped, c.handed, c.hb, c.arp, c.ndp, c.converged, c.healthy, c.buckets, c.conns, c.rulesIndex, c.up, c.dpFailures, c.dpHealthy,
		c.bgpSession, c.bgpBFD, c.bgpAnnounced, c.bgpEvents, c.forwarded, c.forwardDrops, c.ruleForward,
		c.raftVoter, c.raftVoters, c.raftTolerance, c.raftChanges, c.hbBytes} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st, p := c.src.Status(), c.src.Params()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for id, pc := range p.Packets {
		counter(c.accepted, pc.Accepted, fmt.Sprint(id))
		for reason, n := range pc.Dropped {
			counter(c.dropped, n, fmt.Sprint(id), reason)
		}
		for dir, n := range pc.Handed {
			counter(c.handed, n, fmt.Sprint(id), dir)
		}
		if p.Forwarding != nil {
			counter(c.ruleForward, pc.Forwarded, fmt.Sprint(id))
		}
	}
	if f := p.Forwarding; f != nil {
		for _, pr := range f.Peers {
			counter(c.forwarded, pr.Forwarded, pr.Node, "out")
			counter(c.forwarded, pr.SecondChance, pr.Node, "second_chance")
			counter(c.forwarded, pr.Received, pr.Node, "in")
		}
		for reason, n := range map[string]uint64{"foreign": f.Foreign, "no_route": f.NoRoute, "hop_limit": f.HopLimit, "too_big": f.TooBig} {
			counter(c.forwardDrops, n, reason)
		}
	}
	for ev, n := range p.Heartbeat {
		switch ev {
		case "sent_bytes":
			counter(c.hbBytes, n, "sent")
		case "received_bytes":
			counter(c.hbBytes, n, "received")
		default:
			counter(c.hb, n, ev)
		}
	}
	for ev, n := range p.ARP {
		counter(c.arp, n, ev)
	}
	for ev, n := range p.NDP {
		counter(c.ndp, n, ev)
	}
	gauge(c.raftVoter, b2f(st.Raft.Role == "leader" || st.Raft.Role == "voter"))
	gauge(c.raftVoters, float64(st.Raft.Voters), "voter")
	gauge(c.raftVoters, float64(st.Raft.NonVoters), "nonvoter")
	if st.Raft.Autopilot {
		gauge(c.raftTolerance, float64(st.Raft.FailureTolerance))
		counter(c.raftChanges, st.Raft.VoterChanges)
	}
	gauge(c.converged, b2f(st.Converged))
	gauge(c.healthy, b2f(st.Healthy))
	for id, n := range st.Accepting {
		gauge(c.buckets, float64(n-st.Dirty[id]), fmt.Sprint(id), "owned")
		gauge(c.buckets, float64(st.Dirty[id]), fmt.Sprint(id), "owned_dirty")
	}
	for id, n := range st.Draining {
		gauge(c.buckets, float64(n), fmt.Sprint(id), "draining")
	}
	gauge(c.conns, float64(st.Connections))
	gauge(c.rulesIndex, float64(st.RulesIndex))
	gauge(c.up, float64(len(st.View.Eligible)))
	counter(c.dpFailures, st.UpdateFailures)
	gauge(c.dpHealthy, b2f(st.DataplaneHealthy))
	if b := st.BGP; b != nil {
		for _, s := range b.Sessions {
			gauge(c.bgpSession, b2f(s.State == "established"), s.Neighbor.String())
			if s.BFD != "" {
				gauge(c.bgpBFD, b2f(s.BFD == "up"), s.Neighbor.String())
			}
		}
		gauge(c.bgpAnnounced, float64(len(b.Announced)))
		for _, ev := range []string{"session_failures", "withdrawn"} {
			counter(c.bgpEvents, p.BGP[ev], ev)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Handler serves the collector (and Go runtime metrics) for scraping.
// Scrapes that arrive together share one gathering (see cachedGatherer), so
// a burst of them costs about one.
func Handler(src Source, extra ...prometheus.Collector) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(src), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(extra...)
	return promhttp.HandlerFor(&cachedGatherer{g: reg, ttl: scrapeReuse}, promhttp.HandlerOpts{})
}

// scrapeReuse is how long one gathering answers further scrapes: far below
// any scrape interval, long enough to absorb a burst.
const scrapeReuse = 100 * time.Millisecond

// cachedGatherer answers Gather with the last result while it is younger
// than ttl; one gathering runs at a time.
type cachedGatherer struct {
	g   prometheus.Gatherer
	ttl time.Duration

	mu   sync.Mutex
	at   time.Time
	mfs  []*dto.MetricFamily
	err  error
	have bool
}

func (c *cachedGatherer) Gather() ([]*dto.MetricFamily, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.have || time.Since(c.at) >= c.ttl {
		c.mfs, c.err = c.g.Gather()
		c.at, c.have = time.Now(), true
	}
	return c.mfs, c.err
}
