package drill

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/shoalnet/shoal/deploy/lab/load"
	"github.com/shoalnet/shoal/heartbeat"
	"github.com/shoalnet/shoal/peer"
)

// Traffic is the load a drill sends while it runs.
type Traffic struct {
	Duration    time.Duration // the whole run; 8 s if zero
	Lead        time.Duration // traffic before the event; 2 s if zero
	Concurrency int           // parallel workers; 8 if zero
	Rate        float64       // requests/s over all workers; 0 = as fast as possible
	KeepAlive   bool          // reuse connections; otherwise one per request
	Timeout     time.Duration // per request; 2 s if zero
	// Held opens this many long-lived keep-alive connections before the
	// event, a request on each every 100 ms, beside the requests; the
	// report counts those that break (lab only).
	Held int
}

func (t *Traffic) defaults() error {
	if t.Duration == 0 {
		t.Duration = 8 * time.Second
	}
	if t.Lead == 0 {
		t.Lead = 2 * time.Second
	}
	if t.Concurrency == 0 {
		t.Concurrency = 8
	}
	if t.Timeout == 0 {
		t.Timeout = 2 * time.Second
	}
	if t.Lead >= t.Duration {
		return fmt.Errorf("drill: the traffic (%v) must last longer than the lead before the event (%v)", t.Duration, t.Lead)
	}
	return nil
}

// ErrLabOnly is returned for a scenario a real cluster cannot run.
var ErrLabOnly = errors.New("drill: kill, sigterm, restart, rule and rehash need --lab (on a real cluster, signal or restart the agent yourself, change the rule with shoal rules set, or take a next hop out at your router)")

// DefaultSettleTimeout bounds the wait for the cluster to settle after the
// event.
const DefaultSettleTimeout = 15 * time.Second

// ClusterOptions configure a drill against a real cluster. The load runs in
// this process; the local agent's control socket drives the scenario and
// tells when the cluster settled.
type ClusterOptions struct {
	Scenario Scenario
	Traffic  Traffic
	URL      string // http://VIP:port/
	Socket   string // the local agent's control socket
	Node     string // the node the scenario acts on
	// Peer is the node's peer API address (its peer_addr) and Key the
	// cluster key, for plug: the node is told over the authenticated peer
	// API to stop heartbeating and drop every VIP packet.
	Peer string
	Key  []byte
	// Weight is the weight the weight scenario sets (0-100 or "equal"); 0
	// if empty. Rule is the rule it sets it on; the URL's host:port if
	// empty.
	Weight        string
	Rule          string
	SettleTimeout time.Duration // DefaultSettleTimeout if zero
	Progress      io.Writer     // live progress lines; none if nil
}

// RunCluster runs a drill against a real cluster: traffic to o.URL, the
// scenario on o.Node after o.Traffic.Lead, and a report. A pulled plug is
// put back at the end; a drained, joined or reweighted node is left as the
// scenario left it. The cluster counts as settled when the local agent has
// converged on a view without (plug, drainstop) or with (join) the node, or
// at the new rules index (weight); only the local agent's counters are
// sampled.
func RunCluster(ctx context.Context, o ClusterOptions) (*Report, error) {
	if err := o.Traffic.defaults(); err != nil {
		return nil, err
	}
	if o.SettleTimeout == 0 {
		o.SettleTimeout = DefaultSettleTimeout
	}
	if o.Scenario.LabOnly() {
		return nil, ErrLabOnly
	}
	if o.Node == "" {
		return nil, errors.New("drill: name the node to act on (--node)")
	}
	if o.Scenario == Plug && (o.Peer == "" || len(o.Key) == 0) {
		return nil, errors.New("drill: plug on a real cluster needs the node's peer API address (--peer) and the cluster key (--key-file)")
	}
	u, err := url.Parse(o.URL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("drill: bad URL %q", o.URL)
	}
	if o.Rule == "" {
		o.Rule = u.Host
		if u.Port() == "" {
			o.Rule += ":80"
		}
	}
	if o.Weight == "" {
		o.Weight = "0"
	}
	local := newAgentAPI(o.Socket)
	q, err := local.query(ctx)
	if err != nil {
		return nil, err
	}
	var victim uint32
	var names []string
	for _, n := range q.Nodes {
		names = append(names, n.Name)
		if n.Name == o.Node {
			victim = n.ID
		}
	}
	if victim == 0 {
		return nil, fmt.Errorf("drill: no node %q in the cluster (nodes: %v)", o.Node, names)
	}
	self, err := local.status(ctx)
	if err != nil {
		return nil, err
	}
	if o.Scenario == Join {
		// A join needs a stopped node: stop it and let the cluster settle.
		progress(o.Progress, "stopping %s before the traffic, for the join", o.Node)
		if err := local.post(ctx, "/v1/admin", map[string]string{"node": o.Node, "state": "stopped"}); err != nil {
			return nil, err
		}
		if _, err := waitSettled(ctx, time.Now(), o.SettleTimeout, func() error { return clusterSettled(ctx, local, victim, true, 0) }); err != nil {
			return nil, fmt.Errorf("drill: cluster did not settle after stopping %s: %w", o.Node, err)
		}
	}

	var plugged bool
	defer func() {
		if plugged {
			if err := peerPlug(context.Background(), o.Peer, o.Key, false); err != nil {
				progress(o.Progress, "could not put %s's plug back: %v (run `shoal plug restore` on it)", o.Node, err)
			}
		}
	}()
	smp := startSampler(ctx, map[string]*agentAPI{self.NodeName: local}, 100*time.Millisecond)
	type loadOut struct {
		res load.Result
		err error
	}
	done := make(chan loadOut, 1)
	go func() {
		r, err := load.Run(ctx, load.Options{
			URL: o.URL, Concurrency: o.Traffic.Concurrency, Rate: o.Traffic.Rate, Duration: o.Traffic.Duration,
			KeepAlive: o.Traffic.KeepAlive, Timeout: o.Traffic.Timeout,
			Progress: func(p load.Progress) { progress(o.Progress, "%s", p) },
		})
		done <- loadOut{r, err}
	}()
	var settled time.Duration
	event, settleErr := func() (time.Time, error) {
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(o.Traffic.Lead):
		}
		event := time.Now()
		progress(o.Progress, "%s %s", o.Scenario.verb(), o.Node)
		var minIndex uint64
		switch o.Scenario {
		case Plug:
			if err := peerPlug(ctx, o.Peer, o.Key, true); err != nil {
				return event, err
			}
			plugged = true
		case Drainstop:
			if err := local.post(ctx, "/v1/admin", map[string]string{"node": o.Node, "state": "draining"}); err != nil {
				return event, err
			}
		case Join:
			if err := local.post(ctx, "/v1/admin", map[string]string{"node": o.Node, "state": "started"}); err != nil {
				return event, err
			}
		case Weight:
			if err := local.post(ctx, "/v1/weight", map[string]string{"rule": o.Rule, "node": o.Node, "weight": o.Weight}); err != nil {
				return event, err
			}
			st, err := local.status(ctx)
			if err != nil {
				return event, err
			}
			minIndex = st.RulesIndex
		}
		var err error
		settled, err = waitSettled(ctx, event, o.SettleTimeout, func() error {
			return clusterSettled(ctx, local, victim, o.Scenario.LosesNode(), minIndex)
		})
		if err == nil {
			progress(o.Progress, "settled %.0f ms after the event", ms(settled))
		}
		return event, err
	}()
	out := <-done
	rep, err := finish(out.res, out.err, smp.Stop(), q, o.Traffic, event, settled, settleErr)
	if rep != nil {
		rep.Scenario, rep.Target, rep.URL, rep.Node, rep.Nodes = o.Scenario, "cluster", o.URL, o.Node, names
		rep.Settled = settledWhat(o.Scenario, "the local agent converged on a view", false)
	}
	return rep, err
}

// finish builds a drill's report from the load's result, the agents'
// samples and the event's outcome: the part every target shares.
func finish(res load.Result, loadErr error, samples []Sample, q query, tr Traffic,
	event time.Time, settled time.Duration, settleErr error) (*Report, error) {
	if loadErr != nil {
		return nil, errors.Join(loadErr, settleErr)
	}
	r := NewReport(res, samples)
	rep := &r
	if settleErr == nil {
		rep.SettledMS = ms(settled)
	}
	rep.HeartbeatPeriod, rep.HeartbeatTolerance = q.Settings.HeartbeatPeriod, q.Settings.HeartbeatTolerance
	if p, err := time.ParseDuration(q.Settings.HeartbeatPeriod); err == nil && q.Settings.HeartbeatTolerance > 0 {
		// The timing in use: the settings scaled to the registry's size.
		sp, st := heartbeat.ScaledTiming(p, q.Settings.HeartbeatTolerance, len(q.Nodes))
		rep.HeartbeatPeriod, rep.HeartbeatTolerance = sp.String(), st
	}
	rep.KeepAlive, rep.Concurrency, rep.Rate = tr.KeepAlive, tr.Concurrency, tr.Rate
	rep.Held = res.Held
	if !event.IsZero() {
		rep.EventAtMS = ms(event.Sub(res.Start))
	}
	if settleErr != nil {
		return rep, fmt.Errorf("drill: %w", settleErr)
	}
	return rep, nil
}

// settledWhat says what "settled" measured: in a lab every node's buckets
// are checked (all), on a real cluster only the local agent's view.
func settledWhat(s Scenario, how string, all bool) string {
	switch s {
	case Plug, Kill, Drainstop, SIGTERM:
		if all {
			return "failover: " + how + " without the node, every bucket owned again"
		}
		return "failover: " + how + " without the node"
	case Join:
		if all {
			return "joined: " + how + " with the node, every bucket owned"
		}
		return "joined: " + how + " with the node"
	case Rule:
		return "rule changed: " + how + " at the new rules index, every bucket owned"
	case Restart:
		return "restarted: " + how + " with the node back, every bucket owned"
	case Rehash:
		return "rehashed: the router's route lost the node's next hop and had it again"
	}
	return "rebalanced: " + how + " with the new weight"
}

// clusterSettled checks, from the local agent, that it has converged on a
// view with (or, if gone, without) node victim at rules index >= minIndex.
func clusterSettled(ctx context.Context, a *agentAPI, victim uint32, gone bool, minIndex uint64) error {
	st, err := a.status(ctx)
	if err != nil {
		return err
	}
	in := slices.Contains(st.View.Eligible, victim)
	switch {
	case !st.Converged:
		return errors.New("not converged")
	case gone && in:
		return fmt.Errorf("node %d still in the view", victim)
	case !gone && !in:
		return fmt.Errorf("node %d not in the view", victim)
	case st.RulesIndex < minIndex:
		return fmt.Errorf("rules index %d, want %d", st.RulesIndex, minIndex)
	}
	return nil
}

// peerPlug pulls or restores a node's plug over the authenticated peer API.
func peerPlug(ctx context.Context, addr string, key []byte, pulled bool) error {
	b, _ := json.Marshal(map[string]bool{"pulled": pulled})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, peer.URL(addr, "/v1/peer/plug"), bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	certs, err := peer.NewCerts(peer.TLSOptions{Name: "shoal-drill", Keys: [][]byte{key}})
	if err != nil {
		return err
	}
	c := peer.NewClient(certs)
	c.Timeout = 5 * time.Second
	return doJSON(c, req, "peer "+addr)
}

// waitSettled polls check every 20 ms until it passes and returns how long
// after from that was; on timeout the error carries check's last answer.
func waitSettled(ctx context.Context, from time.Time, timeout time.Duration, check func() error) (time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return time.Since(from), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("not settled after %v: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func progress(w io.Writer, format string, a ...any) {
	if w != nil {
		fmt.Fprintf(w, "drill: "+format+"\n", a...)
	}
}
