package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"github.com/shoalnet/shoal/agent/announce"
	"github.com/shoalnet/shoal/agent/config"
	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/agent/doctor"
	"github.com/shoalnet/shoal/agent/health"
	"github.com/shoalnet/shoal/agent/host"
	"github.com/shoalnet/shoal/agent/metrics"
	"github.com/shoalnet/shoal/agent/node"
	"github.com/shoalnet/shoal/agent/statuspage"
	"github.com/shoalnet/shoal/agent/track"
	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
	"github.com/shoalnet/shoal/peer"
	"github.com/shoalnet/shoal/rules"
)

// Agent is one running node: the host around a node (membership, data
// plane, tracking), the control and peer APIs, metrics and the status page.
type Agent struct {
	cfg   *config.Config
	key   []byte
	log   *slog.Logger
	store *rules.Store
	cmd   *control.Commander
	host  *host.Host
	hc    *health.Checker
	sec   *security           // TLS identity, refusal counts, plug restore
	hist  *statuspage.History // view changes and failovers, for the status page
	self  filter.NodeID       // set once registered, before anything reads it
	node  *node.Node
	// running is the node once it runs: probes of this node are answered
	// alive from then on, unless its plug is pulled.
	running atomic.Pointer[node.Node]
	link    *heartbeat.Transport // the node's; kept for key reloads
	xdp     *filter.XDP
	bgp     *announce.BGP // the routed mode's speaker; nil without a bgp section
	// restartArm is set by `shoal restart`; restarting once the node
	// stopped for a restart (teardown then leaves the host as it is).
	restartArm restartArm
	restarting bool
	probe      *doctor.FrameProbe // the doctor's probe frames; set before running
	// flowOwners caches assignments for `shoal query --flow`.
	flowOwners control.OwnersCache
}

// Run runs the agent until ctx ends, then removes everything it set up.
func Run(ctx context.Context, cfg *config.Config) (err error) {
	log := slog.Default().With("node", cfg.NodeName)
	key, err := config.ReadKey(cfg.KeyFile)
	if err != nil {
		return err
	}
	a := &Agent{cfg: cfg, key: key, log: log}
	if a.sec, err = newSecurity(cfg, key, a); err != nil {
		return err
	}
	var cleanups []func() error
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			if cerr := cleanups[i](); cerr != nil {
				log.Error("teardown", "err", cerr)
				err = errors.Join(err, cerr)
			}
		}
		log.Info("agent stopped")
	}()
	cleanup := func(f func() error) { cleanups = append(cleanups, f) }

	// Rules first: nothing else can be configured without them.
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	period, tolerance := cfg.BootstrapHeartbeat()
	a.store, err = rules.Open(rules.StoreConfig{
		NodeName: cfg.NodeName, Zone: cfg.Zone, DataDir: cfg.DataDir, RaftBind: cfg.RaftAddr,
		HeartbeatAddr: cfg.HeartbeatAddr, APIAddr: cfg.PeerAddr, Key: key,
		TLS: a.sec.certs, Refusals: a.sec.refusals,
		Bootstrap: cfg.Bootstrap, Logger: log,
		HeartbeatPeriod:    period,
		HeartbeatTolerance: tolerance,
	})
	if err != nil {
		return err
	}
	cleanup(a.store.Close)
	a.cmd = control.NewCommander(a.store, func() filter.NodeID { return a.self })

	stopPeer, err := a.servePeerAPI()
	if err != nil {
		return err
	}
	cleanup(stopPeer)

	if err := a.joinCluster(ctx); err != nil {
		return err
	}
	if err := a.awaitRegistration(ctx); err != nil {
		return err
	}
	a.reportCommandLevel(ctx)
	a.hist = statuspage.NewHistory(a.self)
	if err := a.ensureVIPs(ctx); err != nil {
		return err
	}

	// The host: VIPs, sysctls, ARP and cluster MAC membership, XDP; it
	// follows the replicated VIPs and the link from here on.
	h, err := host.Setup(host.Config{Interface: cfg.Interface, DataDir: cfg.DataDir, VIPs: a.store.State().VIPs, MACMode: a.store.State().Settings.MACMode, Log: log,
		Announcer: func(ifindex int, mac func() net.HardwareAddr) (host.Announcer, error) {
			return a.openAnnouncer(ifindex, mac)
		}})
	if err != nil {
		return err
	}
	cleanup(func() error {
		if a.restarting {
			return h.Leave()
		}
		return h.Teardown()
	})
	a.host = h
	xdp, dp, inherit, err := a.startFromRestart(h)
	if err != nil {
		return err
	}
	a.xdp = xdp
	cleanup(func() error {
		if a.restarting {
			return xdp.Release()
		}
		return xdp.Close()
	})
	if err := h.AttachXDP(xdp); err != nil {
		return fmt.Errorf("attach xdp to %s: %w", cfg.Interface, err)
	}
	// Membership, data plane, tracking. The host's services outlive ctx
	// until the handoff is done.
	life, endLife := context.WithCancel(context.WithoutCancel(ctx))
	cleanup(func() error { endLife(); return nil })
	keys, err := heartbeatKeyring(a.sec.keys)
	if err != nil {
		return err
	}
	link, err := heartbeat.Listen(cfg.HeartbeatAddr, a.store.State().Settings.ClusterID, keys)
	if err != nil {
		return fmt.Errorf("heartbeat socket: %w", err)
	}
	a.hc = health.NewChecker(cfg.Health)
	if inherit != nil && inherit.Healthy() {
		a.hc.AssumeHealthy()
	}
	eligible := false // as the host was last told, from OnPush's goroutine
	// The neighbour table, for hand-overs' and forwarding's MACs.
	neigh := host.NewNeighbors(func() map[netip.Addr]net.HardwareAddr { return host.NeighborMACs(cfg.Interface, log) })
	a.node, err = node.New(node.Config{
		Inherit: inherit,
		Self:    a.self, Log: log, Link: link, Rules: a.store,
		Incarnation: func() (uint64, error) { return heartbeat.LoadIncarnation(cfg.DataDir) },
		Dataplane:   dp, MAC: h.MAC, Scan: track.Scan, Health: a.healthy, RenewLease: xdp.RenewLease,
		Neighbors: neigh.MAC,
		Forward:   forwarding(cfg, neigh),
		OnRules: func(st *rules.State) {
			h.SetVIPs(st.VIPs, st.Settings.MACMode)
			self, peers := a.heartbeatAllow(st)
			if err := xdp.SetHeartbeatPeers(self, peers); err != nil {
				log.Warn("xdp heartbeat filter; heartbeats from anyone reach the socket", "err", err)
			}
			if err := xdp.SetMembers(node.MemberAddrs(st)); err != nil {
				log.Warn("xdp forwarding: members; packets forwarded here are dropped", "err", err)
			}
		},
		OnPush: func(s *node.Snap) {
			if el := announces(s, a.self, a.node); el != eligible {
				eligible = el
				h.SetEligible(el)
			}
			if vc, ok := a.hist.Observe(time.Now(), statuspage.ViewState{View: s.Heartbeat().View, Converged: s.Heartbeat().Converged, Peers: s.Heartbeat().Peers}, nodeNamer(s.Rules())); ok {
				log.Info("view changed", "cause", vc.Cause, "from", vc.From, "to", vc.To, "rules_index", vc.RulesIndex)
			}
		},
		Announce: h.Announce,
		Probe:    control.PeerAPICheck(control.NewProbeClient(a.sec.certs)),
		Finish: func(ctx context.Context) error {
			_, err := a.store.Apply(ctx, &rules.SetAdminState{Node: a.self, State: rules.AdminStopped})
			return err
		},
	})
	if err == nil {
		a.store.SetPeerHealth(func() map[filter.NodeID]rules.PeerHealth { return peerHealth(a.node.Snap(), time.Now()) })
	}
	if err != nil {
		link.Close()
		return err
	}
	a.link = link
	h.Start(life, a.node.Poke)
	cleanup(h.Stop)
	a.probe = doctor.NewFrameProbe(cfg.Interface, a.store.State().Settings.ClusterID, h.MAC)
	probeCtx, endProbe := context.WithCancel(life)
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		a.probe.Run(probeCtx)
	}()
	cleanup(func() error { endProbe(); <-probeDone; return nil })
	a.reloadOnSIGHUP(ctx)
	go a.hc.Run(life, func(ok bool) {
		log.Warn("health changed", "healthy", ok)
		a.node.Poke()
	})

	ctlLn, err := control.ListenUnix(cfg.Socket)
	if err != nil {
		return err
	}
	ctlSrv := &http.Server{Handler: a.once(control.Handler(a)), ReadHeaderTimeout: 5 * time.Second}
	go ctlSrv.Serve(ctlLn)
	cleanup(func() error { ctlSrv.Close(); os.Remove(cfg.Socket); return nil })

	if cfg.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", metrics.Handler(a, metrics.SecurityCollector{Refusals: a.sec.refusals, Rules: a.store}))
		mux.Handle("/", statuspage.Handler(a, statuspage.PeerSamplerFor(peer.NewClient(a.sec.certs))))
		stopMetrics, err := a.serveMetrics(cfg.MetricsAddr, mux)
		if err != nil {
			return err
		}
		cleanup(stopMetrics)
	}

	h.Announce()
	log.Info("agent running", "id", a.self, "interface", cfg.Interface, "xdp", xdp.Mode(), "vips", cfg.VIPs)
	return a.runNode(ctx)
}

// openAnnouncer opens the ways this node claims the VIPs: L2 (ARP, NDP,
// IGMP) always, and the BGP speaker when the config has a bgp section;
// the cluster's mode says which one claims them.
func (a *Agent) openAnnouncer(ifindex int, mac func() net.HardwareAddr) (host.Announcer, error) {
	l2, err := announce.ListenL2(announce.L2Config{Interface: a.cfg.Interface, Index: ifindex, MAC: mac, Log: a.log})
	if err != nil {
		return nil, err
	}
	m := &announce.Modes{L2: l2}
	if b := a.cfg.BGP; b.Configured() {
		bc := announce.BGPConfig{ASN: b.ASN, RouterID: b.RouterID, NextHop: b.NextHop, NextHop6: b.NextHop6, Log: a.log}
		for _, c := range b.Communities {
			v, _ := config.ParseCommunity(c) // checked by Validate
			bc.Communities = append(bc.Communities, v)
		}
		for _, n := range b.Neighbors {
			bc.Neighbors = append(bc.Neighbors, announce.Neighbor{Address: n.Address, ASN: n.ASN, Password: n.Password,
				HoldTime: n.HoldTime, Keepalive: n.Keepalive, MultihopTTL: n.MultihopTTL,
				BFD: n.BFD.Enabled, BFDInterval: n.BFD.Interval, BFDReceive: n.BFD.ReceiveInterval, BFDMultiplier: n.BFD.Multiplier})
		}
		if a.bgp, err = announce.StartBGP(bc); err != nil {
			l2.Close()
			return nil, err
		}
		m.BGP = a.bgp
	}
	return m, nil
}

// bgpInfo is the BGP speaker's sessions and announcements; nil without one.
func (a *Agent) bgpInfo() *control.BGPInfo {
	if a.bgp == nil {
		return nil
	}
	return &control.BGPInfo{Sessions: a.bgp.Sessions(), Announced: a.bgp.Announced()}
}

// healthy is the health this node advertises: its application's, and its
// host's side of the data plane (program attached, ARP answering, tables
// rewriting to the interface's MAC).
func (a *Agent) healthy() bool {
	ok, _ := a.host.Healthy()
	return ok && a.hc.Healthy()
}

// handoffTimeout bounds how long a graceful stop waits for the peers to
// take over this node's buckets before it detaches anyway; connsTimeout
// how long it then waits for the connections it still serves to end.
const (
	handoffTimeout = 2 * time.Second
	connsTimeout   = 400 * time.Millisecond
)

// runNode runs the node until ctx ends, then hands off: the node advertises
// that it is leaving (its tables accept nothing first) and waits, at most
// handoffTimeout, until every live peer advertises a view without it, and
// then, at most connsTimeout, until the connections it still serves end
// (requests in flight: the peers take every new one by then). Only then
// does Run tear the host down, which cuts what is left.
func (a *Agent) runNode(ctx context.Context) error {
	nctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- a.node.Run(nctx) }()
	a.running.Store(a.node)
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	if window, ok := a.restartArm.take(time.Now()); ok {
		stopped, err := a.stopForRestart(window, func() error { stop(); return <-done })
		if stopped {
			return err
		}
	}
	hctx, cancel := context.WithTimeout(context.Background(), handoffTimeout)
	start := time.Now()
	ok := a.node.Handoff(hctx)
	cancel()
	took := time.Since(start)
	cctx, cancel := context.WithTimeout(context.Background(), connsTimeout)
	left := a.node.Drained(cctx)
	cancel()
	// The peers acquire once they hear this node's last heartbeat (it
	// keeps nothing for them any more); its hand-overs bridge that, for a
	// heartbeat period at least.
	if rest := a.store.State().Settings.HeartbeatPeriod - (time.Since(start) - took); ok && rest > 0 {
		time.Sleep(rest)
	}
	a.log.Info("handed off", "complete", ok, "took", took.Round(time.Millisecond),
		"connections_cut", left, "waited_for_connections", (time.Since(start) - took).Round(time.Millisecond))
	stop()
	return <-done
}

// joinCluster joins through the configured members unless this node is
// already a member (a restart) or bootstraps.
func (a *Agent) joinCluster(ctx context.Context) error {
	if a.cfg.Bootstrap || a.store.State().NodeByName(a.cfg.NodeName) != nil {
		return nil
	}
	me := rules.NodeInfo{Name: a.cfg.NodeName, HeartbeatAddr: a.cfg.HeartbeatAddr, RaftAddr: a.cfg.RaftAddr, APIAddr: a.cfg.PeerAddr}
	backoff := 200 * time.Millisecond
	for {
		var errs []error
		for _, member := range a.cfg.Join {
			id, err := a.store.Join(ctx, member, me)
			if err == nil {
				a.log.Info("joined the cluster", "via", member, "id", id)
				return nil
			}
			errs = append(errs, fmt.Errorf("%s: %w", member, err))
		}
		a.log.Warn("join failed; retrying", "err", errors.Join(errs...))
		select {
		case <-ctx.Done():
			return fmt.Errorf("join: %w", errors.Join(errs...))
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// ensureVIPs makes the VIPs this node is configured with cluster VIPs, so
// rules can name them. Adding an existing VIP changes nothing.
func (a *Agent) ensureVIPs(ctx context.Context) error {
	for _, vip := range a.cfg.VIPs {
		if a.store.State().HasVIP(vip) {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, err := a.store.Apply(cctx, &rules.PutVIP{VIP: vip})
		cancel()
		if err != nil {
			return fmt.Errorf("add vip %s to the cluster: %w", vip, err)
		}
	}
	return nil
}

// awaitRegistration waits until the local replica knows this node.
func (a *Agent) awaitRegistration(ctx context.Context) error {
	ch, stop := a.store.Subscribe()
	defer stop()
	for {
		st := a.store.State()
		if n := st.NodeByName(a.cfg.NodeName); n != nil {
			a.self = n.ID
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		case <-time.After(time.Second):
		}
	}
}

// heartbeatAllow returns this node's heartbeat socket and the peers' for
// the data plane's heartbeat filter; a zero self (no filter) when an
// address cannot be matched against packets (unspecified or not IPv4).
func (a *Agent) heartbeatAllow(st *rules.State) (netip.AddrPort, []netip.AddrPort) {
	host, port, err := net.SplitHostPort(a.cfg.HeartbeatAddr)
	if err != nil {
		return netip.AddrPort{}, nil
	}
	addr := netip.IPv4Unspecified()
	if host != "" {
		if addr, err = netip.ParseAddr(host); err != nil {
			return netip.AddrPort{}, nil
		}
	}
	p, err := netip.ParseAddrPort(net.JoinHostPort(addr.String(), port))
	if err != nil || !p.Addr().Unmap().Is4() {
		return netip.AddrPort{}, nil
	}
	var peers []netip.AddrPort
	for _, n := range st.Nodes {
		if n.ID == a.self {
			continue
		}
		if ap, err := netip.ParseAddrPort(n.HeartbeatAddr); err == nil {
			peers = append(peers, ap)
		}
	}
	for _, q := range peers {
		if !q.Addr().Unmap().Is4() || q.Addr().IsUnspecified() {
			return netip.AddrPort{}, nil
		}
	}
	return p, peers
}

// forwarding is what routed mode's forwarding needs of the host, nil when
// the configuration turns it off.
func forwarding(cfg *config.Config, neigh *host.Neighbors) *node.Forwarding {
	if cfg.BGP.NoForward {
		return nil
	}
	return &node.Forwarding{
		MTU: func() int { return host.LinkMTU(cfg.Interface) },
		NextHops: func(addrs []netip.Addr) map[netip.Addr]net.HardwareAddr {
			return host.NextHopMACs(addrs, neigh.MAC)
		},
	}
}

// announces reports whether the node claims the VIPs: while it is in the
// view; in routed mode with forwarding also while it drains, forwarding
// the new flows the routers still send it to their owners, until the
// drain ends (a router that moves a held flow elsewhere meanwhile is
// covered by the second chance).
func announces(s *node.Snap, self filter.NodeID, n *node.Node) bool {
	if s.Heartbeat().View.Has(uint32(self)) {
		return true
	}
	me := s.Rules().Node(self)
	t := n.Tables()
	return me != nil && me.Admin == rules.AdminDraining && t != nil && t.Forwarding()
}

// peerHealth is what the heartbeats say of the peers, for the Raft
// autopilot (rules.PeerHealth): nil before the first snapshot.
func peerHealth(s *node.Snap, now time.Time) map[filter.NodeID]rules.PeerHealth {
	if s == nil {
		return nil
	}
	peers := s.Heartbeat().Peers
	out := make(map[filter.NodeID]rules.PeerHealth, len(peers))
	for _, p := range peers {
		h := rules.PeerHealth{Live: p.Live, RulesIndex: p.RulesIndex, LastHeard: time.Duration(1 << 62)}
		if !p.LastHeard.IsZero() {
			h.LastHeard = now.Sub(p.LastHeard)
		}
		out[filter.NodeID(p.ID)] = h
	}
	return out
}
