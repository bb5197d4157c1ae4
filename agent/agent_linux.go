package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
	"github.com/shoalnet/shoal/rules"
)

// dataplane is what the agent needs of the XDP program.
type dataplane interface {
	Update(t *filter.Tables, ifMAC net.HardwareAddr) error
	Counters() (filter.Counters, error)
	RenewLease(d time.Duration) error
	SetHeartbeatPeers(self netip.AddrPort, peers []netip.AddrPort) error
}

// Agent is one running node.
type Agent struct {
	cfg   *Config
	key   []byte
	log   *slog.Logger
	store *rules.Store
	cmd   *commander
	host  *host
	dp    dataplane
	hc    *healthChecker
	link  *heartbeat.Transport
	sec   *security    // TLS identity, refusal counts, plug restore
	hist  *viewHistory // view changes and failovers, for the status page
	// flowOwners caches assignments for `shoal query --flow`.
	flowOwners ownersCache

	wake chan struct{} // a reconcile is due

	mu           sync.Mutex // guards everything below
	self         filter.NodeID
	rstate       *rules.State
	fcfg         *filter.Config
	assigner     filter.Assigner // remembers each rule's table between views
	machine      *heartbeat.Machine[filter.Grant]
	hbStatus     heartbeat.Status[filter.Grant]
	held         filter.Set
	heldKey      string            // setKey(held), for cheap comparison
	drainingHB   heartbeat.Buckets // last.draining as heartbeats carry it
	conns        int
	last         plan
	lastKey      reconcileKey
	plugged      bool
	tablesIndex  uint64 // rules index the data plane's tables come from
	stopAsked    bool   // a drain finished and the stop was proposed
	leaseFailing bool   // the last lease renewal failed (logged once)
}

// reconcileKey is what the data plane was last computed from; an unchanged
// key means there is nothing to push.
type reconcileKey struct {
	hbVersion  uint64
	rulesIndex uint64
	plugged    bool
	held       string
	mac        string // the interface's MAC, which accepted frames get
}

// Run runs the agent until ctx ends, then removes everything it set up.
func Run(ctx context.Context, cfg *Config) (err error) {
	log := slog.Default().With("node", cfg.NodeName)
	key, err := ReadKey(cfg.KeyFile)
	if err != nil {
		return err
	}
	a := &Agent{cfg: cfg, key: key, log: log, wake: make(chan struct{}, 1), held: filter.Set{}}
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
		NodeName: cfg.NodeName, DataDir: cfg.DataDir, RaftBind: cfg.RaftAddr,
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
	a.cmd = &commander{store: a.store, self: func() filter.NodeID { a.mu.Lock(); defer a.mu.Unlock(); return a.self }}

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
	a.hist = newViewHistory(a.self)
	if err := a.ensureVIPs(ctx); err != nil {
		return err
	}

	// The host: VIPs, sysctls, ARP and cluster MAC membership, XDP; it
	// follows the replicated VIPs and the link from here on.
	h, err := setupHost(hostConfig{Interface: cfg.Interface, DataDir: cfg.DataDir, VIPs: a.store.State().VIPs, Log: log})
	if err != nil {
		return err
	}
	cleanup(h.teardown)
	a.host = h
	xdp, err := filter.LoadXDP()
	if err != nil {
		return fmt.Errorf("load xdp: %w", err)
	}
	cleanup(xdp.Close)
	a.dp = h.trackMAC(xdp)
	// Accept nothing until the cluster has converged.
	if err := a.dp.Update(filter.NewTables(a.fcfg, a.self, nil, nil, nil), h.MAC()); err != nil {
		return fmt.Errorf("xdp tables: %w", err)
	}
	if err := h.attachXDP(xdp); err != nil {
		return fmt.Errorf("attach xdp to %s: %w", cfg.Interface, err)
	}
	h.start(ctx, a.poke)
	cleanup(h.stop)

	// Membership.
	keys, err := heartbeatKeyring(a.sec.keys)
	if err != nil {
		return err
	}
	a.link, err = heartbeat.Listen(cfg.HeartbeatAddr, a.rstate.Settings.ClusterID, keys)
	if err != nil {
		return fmt.Errorf("heartbeat socket: %w", err)
	}
	cleanup(a.link.Close)
	a.reloadOnSIGHUP(ctx)
	if err := a.newMachine(time.Now()); err != nil {
		return err
	}

	a.hc = newHealthChecker(cfg.Health)
	go a.hc.run(ctx, func(ok bool) {
		log.Warn("health changed", "healthy", ok)
		a.poke()
	})

	ctlLn, err := listenUnix(cfg.Socket)
	if err != nil {
		return err
	}
	ctlSrv := &http.Server{Handler: controlHandler(a), ReadHeaderTimeout: 5 * time.Second}
	go ctlSrv.Serve(ctlLn)
	cleanup(func() error { ctlSrv.Close(); os.Remove(cfg.Socket); return nil })

	if cfg.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", metricsHandler(a, securityCollector{a.sec.refusals, a.store}))
		mux.Handle("/", statusPageHandler(a, peerSamplerFor(rules.NewPeerClient(a.sec.certs))))
		stopMetrics, err := a.serveMetrics(cfg.MetricsAddr, mux)
		if err != nil {
			return err
		}
		cleanup(stopMetrics)
	}

	h.announce()
	log.Info("agent running", "id", a.self, "interface", cfg.Interface, "xdp", xdp.Mode(), "vips", cfg.VIPs)
	return a.loop(ctx)
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
			a.self, a.rstate, a.fcfg = n.ID, st, st.FilterConfig()
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

// newMachine starts a fresh membership state machine (a new incarnation):
// at start, and when a pulled plug is put back, the node must listen before
// it takes anything.
func (a *Agent) newMachine(now time.Time) error {
	st := a.rstate
	inc, err := heartbeat.LoadIncarnation(a.cfg.DataDir)
	if err != nil {
		return err
	}
	m, err := heartbeat.NewMachine(heartbeat.Config{
		ClusterID: st.Settings.ClusterID, Self: uint32(a.self), Incarnation: inc,
		Period: st.Settings.HeartbeatPeriod, Tolerance: st.Settings.HeartbeatTolerance,
	}.WithDefaults(), now, a.owned, filter.Grant.Intersect)
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	a.machine = m
	a.applyRules(now, st)
	return nil
}

// owned is the machine's ownership function: the buckets this node owns in
// view v under the current rules, with what they mean (the rules' mapping
// fingerprints), so that a view change releases every rule whose buckets
// now hold other flows. The machine calls it with a.mu held.
func (a *Agent) owned(v heartbeat.View) filter.Grant {
	elig := make([]filter.NodeID, len(v.Eligible))
	for i, id := range v.Eligible {
		elig[i] = filter.NodeID(id)
	}
	return a.assigner.Assign(a.fcfg, elig).Grant(a.self)
}

// applyRules feeds a new rules state to the machine. Call with a.mu held.
func (a *Agent) applyRules(now time.Time, st *rules.State) {
	a.rstate, a.fcfg = st, st.FilterConfig()
	peers := make(map[uint32]netip.AddrPort, len(st.Nodes))
	for _, n := range st.Nodes {
		// An unparsable address stays registered, and its heartbeats are
		// dropped as coming from the wrong address.
		ap, _ := netip.ParseAddrPort(n.HeartbeatAddr)
		peers[uint32(n.ID)] = ap
	}
	a.machine.SetPeers(now, peers)
	if a.host != nil {
		a.host.setVIPs(st.VIPs)
	}
	if a.dp != nil {
		self, peers := a.heartbeatAllow()
		if err := a.dp.SetHeartbeatPeers(self, peers); err != nil {
			a.log.Warn("xdp heartbeat filter; heartbeats from anyone reach the socket", "err", err)
		}
	}
	a.setLocal(now)
}

// heartbeatAllow returns this node's heartbeat socket and the peers' for
// the data plane's heartbeat filter; a zero self (no filter) when an
// address cannot be matched against packets (unspecified or not IPv4).
func (a *Agent) heartbeatAllow() (netip.AddrPort, []netip.AddrPort) {
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
	peers := a.peerAddrs()
	for _, q := range peers {
		if !q.Addr().Unmap().Is4() || q.Addr().IsUnspecified() {
			return netip.AddrPort{}, nil
		}
	}
	return p, peers
}

// leaseLength is how long the data plane keeps accepting new connections
// without hearing from the agent: T-1 heartbeat periods, so that a stalled
// agent stops before its peers declare it dead (T periods) and take over.
func (a *Agent) leaseLength() time.Duration {
	p := cmp.Or(a.rstate.Settings.HeartbeatPeriod, heartbeat.DefaultPeriod)
	t := cmp.Or(a.rstate.Settings.HeartbeatTolerance, heartbeat.DefaultTolerance)
	return time.Duration(max(t-1, 1)) * p
}

// setLocal tells the machine what this node advertises. Call with a.mu held.
func (a *Agent) setLocal(now time.Time) {
	admin := rules.AdminStopped
	if n := a.rstate.Node(a.self); n != nil {
		admin = n.Admin
	}
	healthy := a.hc == nil || a.hc.healthy.Load()
	if a.host != nil {
		hostOK, _ := a.host.hostHealthy()
		healthy = healthy && hostOK
	}
	a.machine.SetLocal(now, heartbeat.Local{
		Admin: adminToHeartbeat(admin), Healthy: healthy,
		RulesIndex: a.rstate.Index, Seed: a.rstate.Settings.HashSeed,
		Draining: a.drainingHB,
		Counters: heartbeat.Counters{Connections: uint64(a.conns)},
	})
}

func (a *Agent) poke() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// loop is the agent's heart: every period it scans the node's connections,
// ticks and sends heartbeats, and pushes new tables to the data plane when
// the view, the rules or the held buckets changed.
func (a *Agent) loop(ctx context.Context) error {
	rulesCh, stopSub := a.store.Subscribe()
	defer stopSub()
	// Changes applied before the subscription started sent no notice.
	a.mu.Lock()
	a.applyRules(time.Now(), a.store.State())
	a.mu.Unlock()
	type received struct {
		msg  *heartbeat.Message
		from netip.AddrPort
	}
	msgs := make(chan received, 256)
	go a.link.Serve(func(m *heartbeat.Message, from netip.AddrPort) {
		select {
		case msgs <- received{m, from}:
		case <-ctx.Done():
		}
	})
	scan := time.NewTicker(scanInterval)
	defer scan.Stop()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case r := <-msgs:
			a.mu.Lock()
			if !a.plugged {
				if err := a.machine.Receive(time.Now(), r.msg, r.from); err != nil {
					a.link.Reject(heartbeat.ReasonOf(err))
				}
			}
			a.mu.Unlock()
		case <-rulesCh:
			a.mu.Lock()
			a.applyRules(time.Now(), a.store.State())
			a.mu.Unlock()
		case <-scan.C:
			a.scanConnections()
		case <-timer.C:
		case <-a.wake:
		}
		next := a.step(ctx, time.Now())
		timer.Reset(time.Until(next))
	}
}

// scanInterval is how often the agent lists its connections on the VIPs
// when nothing else asks it to (a view change scans at once).
const scanInterval = 100 * time.Millisecond

// scanConnections refreshes the buckets this node holds connections in.
func (a *Agent) scanConnections() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.scanLocked()
}

// scanLocked is scanConnections with a.mu held.
func (a *Agent) scanLocked() {
	conns, err := scanConns(a.rstate.VIPs)
	if err != nil {
		a.log.Warn("socket scan", "err", err)
		return
	}
	a.held = holdings(a.fcfg, conns)
	a.heldKey = setKey(a.held)
	a.conns = len(conns)
}

// step advances the machine, reconciles, and sends a heartbeat when due. It
// returns when it wants to run next.
func (a *Agent) step(ctx context.Context, now time.Time) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.setLocal(now)
	a.machine.Tick(now)
	// Every step (at least one a period) renews the data-plane lease.
	err := a.dp.RenewLease(a.leaseLength())
	if err != nil && !a.leaseFailing {
		a.log.Error("renew xdp lease; owned buckets will drain when it ends", "err", err)
	}
	a.leaseFailing = err != nil
	if !a.machine.View().Equal(a.hbStatus.View) {
		// A new view releases buckets at once. Learn which of them still
		// hold connections before the heartbeat that advertises the view
		// goes out, so that no peer can take one of them clean.
		a.scanLocked()
	}
	a.reconcile()
	a.setLocal(now) // the draining buckets reconcile just computed
	if !a.plugged && !now.Before(a.machine.NextSend()) {
		msg := a.machine.Outgoing(now)
		if err := a.link.Send(msg, a.peerAddrs()); err != nil {
			a.log.Debug("heartbeat send", "err", err)
		}
	}
	a.finishDrain(ctx)
	return a.machine.Wake()
}

// peerAddrs returns the heartbeat addresses of every other registered node.
func (a *Agent) peerAddrs() []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(a.rstate.Nodes))
	for _, n := range a.rstate.Nodes {
		if n.ID == a.self {
			continue
		}
		if ap, err := netip.ParseAddrPort(n.HeartbeatAddr); err == nil {
			out = append(out, ap)
		}
	}
	return out
}

// reconcile pushes new tables when anything they depend on changed. Call
// with a.mu held.
func (a *Agent) reconcile() {
	st := a.machine.Status()
	mac := a.host.MAC()
	key := reconcileKey{hbVersion: st.Version, rulesIndex: a.rstate.Index, plugged: a.plugged, held: a.heldKey, mac: string(mac)}
	if key == a.lastKey && a.last.tables != nil {
		return
	}
	prevView := a.hbStatus.View
	a.hbStatus = st
	a.hist.observe(time.Now(), viewState{st.View, st.Converged, st.Peers}, a.nodeName)
	admin := rules.AdminStopped
	if n := a.rstate.Node(a.self); n != nil {
		admin = n.Admin
	}
	p := planTables(a.fcfg, a.self, admin, a.plugged, st.Accept.Buckets,
		peersDraining(a.fcfg, a.rstate.Index, st.Peers, st.PeersDraining), a.held)
	if err := a.dp.Update(p.tables, mac); err != nil {
		a.log.Error("update xdp tables; keeping the previous ones", "err", err)
		return
	}
	a.last, a.lastKey, a.tablesIndex = p, key, a.rstate.Index
	a.drainingHB = toHeartbeat(p.draining)
	if !st.View.Equal(prevView) {
		a.log.Info("view changed", "eligible", st.View.Eligible, "rules_index", st.View.RulesIndex, "converged", st.Converged)
		if !a.plugged {
			a.host.announce()
		}
	}
}

// finishDrain stops a draining node once it holds no connections. Call with
// a.mu held.
func (a *Agent) finishDrain(ctx context.Context) {
	n := a.rstate.Node(a.self)
	if n == nil || n.Admin != rules.AdminDraining {
		a.stopAsked = false
		return
	}
	if a.conns > 0 || a.stopAsked {
		return
	}
	a.stopAsked = true
	id := a.self
	go func() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := a.store.Apply(cctx, &rules.SetAdminState{Node: id, State: rules.AdminStopped})
		if err != nil {
			a.log.Warn("drain finished but stop failed; will retry", "err", err)
			a.mu.Lock()
			a.stopAsked = false
			a.mu.Unlock()
			return
		}
		a.log.Info("drain finished: node stopped")
	}()
}

// setKey is a cheap fingerprint of a bucket set.
func setKey(s filter.Set) string {
	ids := make([]filter.RuleID, 0, len(s))
	for id := range s {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	b := make([]byte, 0, len(ids)*(4+filter.NumBuckets/8))
	for _, id := range ids {
		b = append(b, byte(id>>24), byte(id>>16), byte(id>>8), byte(id))
		for _, w := range s[id] {
			for i := 0; i < 8; i++ {
				b = append(b, byte(w>>(8*i)))
			}
		}
	}
	return string(b)
}
