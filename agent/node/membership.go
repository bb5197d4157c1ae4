package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalnet/shoal/agent/internal/mailbox"
	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
	"github.com/shoalnet/shoal/rules"
)

// membership owns the heartbeat machine: it receives heartbeats, ticks,
// applies rules and local changes, and sends heartbeats on time. It never
// waits for a socket scan, a table push, Raft or an API caller: it hands a
// Snap to the data plane and learns from a pushReport what the kernel
// holds. It reads the heartbeat socket itself, with its next deadline as
// the read deadline; whoever hands it anything else interrupts the read
// (an idle agent then wakes once per heartbeat, not twice).
//
// The safety rule it keeps (DESIGN.md, "release at once"): a heartbeat never
// advertises a state whose tables are not in the kernel. When the machine
// adopts a new view, membership keeps advertising the last state the data
// plane confirmed, on schedule, until the data plane reports the new view's
// tables pushed; then it sends at once. See docs/AGENT.md, "The
// agent's goroutines".
type membership struct {
	self        filter.NodeID
	incarnation func() (uint64, error) // a new one for every machine: persisted, growing
	log         *slog.Logger
	link        hbLink
	rules       rulesSource
	health      func() bool           // the node's health (application and host)
	onRules     func(st *rules.State) // told of every rules state applied; must not block
	renew       func(d time.Duration) error
	now         func() time.Time

	in      receiver                 // heartbeats; nil until run (tests of the core)
	reports *mailbox.Box[pushReport] // from the data plane
	ctl     chan func()              // requests from APIs, run on this goroutine
	wake    chan struct{}            // health changed
	stopped chan struct{}            // closed when run returns

	// Owned by the goroutine (or by the caller before run starts).
	machine      *heartbeat.Machine[*lazySet]
	rs           *rules.State
	compact      bool                      // every registered node decodes compact acknowledgements (heartbeat protocol 3)
	cfgs         map[uint64]*filter.Config // by rules index: owned(v) uses v's rules
	inheritDirty filter.Set                // see Snap.inheritedDirty
	assigner     *sharedAssigner
	plugged      bool
	leaving      bool             // a graceful stop: advertise stopped, hand off
	handoffs     []chan struct{}  // closed once every live peer's view leaves this node out
	inherit      *Inheritance     // what the previous agent left, for the first machine; then nil
	restartW     time.Duration    // a restart window announced (0: none)
	restarts     []chan struct{}  // closed once every live peer acknowledged the window
	inKernel     pushReport       // the last successful push
	dpHealthy    bool             // the data plane accepts our tables
	leaseErr     bool             // the last lease renewal failed (logged once)
	lastSent     time.Time        // when any heartbeat last went out
	heard        bool             // a valid heartbeat arrived since the last step
	lastView     heartbeat.View   // the view the last heartbeat advertised
	sentKeeping  bool             // the last heartbeat said Keeping
	peers        []netip.AddrPort // heartbeat addresses of the other registered nodes
	gen          uint64           // of the last published Snap
	published    uint64           // machine version last published
	snap         atomic.Pointer[Snap]
	toDP         *mailbox.Box[*Snap] // to the data plane
	probes       *prober             // probes suspects; nil: none (tests)
	timing       heartbeat.Config    // the machine's timing last seen (logged when it changes)
}

// hbLink is what membership needs of the heartbeat transport.
type hbLink interface {
	Send(msg *heartbeat.Message, to []netip.AddrPort) error
	Reject(r heartbeat.Reason)
	Stats() heartbeat.Stats
}

// receiver is what membership's loop reads heartbeats from: the
// transport's Receive, whose deadline is the loop's next wake-up, and
// Interrupt, which every other source of work calls after handing it over.
type receiver interface {
	Receive() (*heartbeat.Message, netip.AddrPort, error)
	ReceiveQueued() (*heartbeat.Message, netip.AddrPort, bool)
	SetReceiveDeadline(t time.Time) error
	Interrupt()
}

// rulesSource is what the agent needs of the replicated rules.
type rulesSource interface {
	State() *rules.State
	Subscribe() (<-chan struct{}, func())
}

// Snap is what membership publishes after every change, for the data
// plane and the APIs. It is immutable once published.
type Snap struct {
	gen        uint64
	rs         *rules.State   // rs.Index == hb.View.RulesIndex: the view's own rules
	fcfg       *filter.Config // rs.FilterConfig()
	hb         heartbeat.Status[*lazySet]
	admin      rules.AdminState // what the tables follow: draining while leaving
	replicated rules.AdminState // what the rules say
	healthy    bool             // what the machine was told
	plugged    bool
	leaving    bool
	// inheritedDirty: while the machine inherits (hb.Inheriting), the
	// buckets other nodes held connections in when the previous agent
	// stopped; its peers are not all heard yet.
	inheritedDirty filter.Set
}

// Rules is the rules state of the snapshot's view.
func (s *Snap) Rules() *rules.State { return s.rs }

// Filter is the ownership function's configuration under those rules.
func (s *Snap) Filter() *filter.Config { return s.fcfg }

// Heartbeat is the machine's status: the view, the peers, convergence.
func (s *Snap) Heartbeat() heartbeat.Status[*lazySet] { return s.hb }

// Plugged reports whether the node's virtual plug is pulled.
func (s *Snap) Plugged() bool { return s.plugged }

// pushReport is the data plane's answer to a Snap.
type pushReport struct {
	snap     *Snap // what the tables were computed from
	ok       bool  // the tables are in the kernel
	healthy  bool  // the data plane took every push lately (hold-down after a failure)
	draining heartbeat.Buckets
	conns    int
	keeping  bool // the tables keep taking SYNs in buckets the view gave peers not ready yet
}

func newMembership(self filter.NodeID, incarnation func() (uint64, error), log *slog.Logger, link hbLink, rs rulesSource, health func() bool) *membership {
	m := &membership{
		self: self, incarnation: incarnation, log: log, link: link, rules: rs, health: health, now: time.Now,
		onRules: func(*rules.State) {}, renew: func(time.Duration) error { return nil },
		reports: mailbox.New[pushReport](), ctl: make(chan func(), 16), wake: make(chan struct{}, 1), stopped: make(chan struct{}),
		cfgs: map[uint64]*filter.Config{}, assigner: &sharedAssigner{}, dpHealthy: true, toDP: mailbox.New[*Snap](),
	}
	m.reports.Notify = m.interrupt
	return m
}

// interrupt ends the loop's wait for a heartbeat, so that it looks at what
// was just handed to it.
func (m *membership) interrupt() {
	if m.in != nil {
		m.in.Interrupt()
	}
}

// start builds the first machine from the current rules; call it before run.
func (m *membership) start(now time.Time) error {
	m.rs = m.rules.State()
	return m.newMachine(now)
}

// newMachine starts a fresh membership state machine (a new incarnation):
// at start, and when a pulled plug is put back, the node must listen before
// it takes anything.
func (m *membership) newMachine(now time.Time) error {
	st := m.rs
	inc, err := m.incarnation()
	if err != nil {
		return fmt.Errorf("heartbeat incarnation: %w", err)
	}
	period, tolerance, hold := timingOf(st)
	mc, err := heartbeat.NewMachine(heartbeat.Config{
		ClusterID: st.Settings.ClusterID, Self: uint32(m.self), Incarnation: inc,
		Period: period, Tolerance: tolerance, HoldPeriod: hold,
	}.WithDefaults(), now, m.owned, lazyIntersect)
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	// The loop takes heartbeats in batches and then steps (Tick): the view
	// is derived once a batch.
	mc.DeferRecompute(true)
	m.machine = mc
	m.timing = mc.Config()
	m.applyRules(now, st)
	if in := m.inherit; in != nil {
		m.inherit = nil
		g := in.accept
		mc.Inherit(now, &lazySet{f: func() filter.Grant { return g }}, in.until)
		m.inheritDirty = in.peersDraining
		m.log.Info("inherited the accepting set of the agent before this restart", "buckets", g.Buckets.Count(), "until", in.until.Format(time.RFC3339Nano))
	}
	return nil
}

// owned is the machine's ownership function: the buckets this node owns in
// view v under the rules of v (never under newer ones: a node must not
// acquire for an old view with new rules). Unknown rules own nothing. The
// set is computed later, by whoever reads it first (see lazySet).
func (m *membership) owned(v heartbeat.View) *lazySet {
	cfg := m.cfgs[v.RulesIndex]
	if cfg == nil {
		return &lazySet{f: func() filter.Grant { return filter.Grant{Buckets: filter.Set{}} }}
	}
	asg, elig, self := m.assigner, nodeIDs(v.Eligible), m.self
	return &lazySet{f: func() filter.Grant { return asg.owned(cfg, elig, self) }}
}

// applyRules feeds a new rules state to the machine: the new rules index
// (and so a new view, released at once under the new rules) first, the
// registry after.
func (m *membership) applyRules(now time.Time, st *rules.State) {
	m.rs = st
	m.compact = st.Speaks(rules.CompactHeartbeatLevel)
	m.cfgs[st.Index] = st.FilterConfig()
	m.onRules(st)
	m.setLocal(now)
	peers := make(map[uint32]netip.AddrPort, len(st.Nodes))
	m.peers = m.peers[:0]
	for _, n := range st.Nodes {
		if n.ID == m.self {
			continue
		}
		// An unparsable address stays registered, and its heartbeats are
		// dropped as coming from the wrong address.
		ap, err := netip.ParseAddrPort(n.HeartbeatAddr)
		peers[uint32(n.ID)] = ap
		if err == nil {
			m.peers = append(m.peers, ap)
		}
	}
	m.machine.SetPeers(now, peers)
	// New heartbeat settings take effect at the machine's safe point, when
	// the cluster has converged on rules that carry them (SetTiming).
	period, tolerance, hold := timingOf(st)
	if err := m.machine.SetTiming(now, period, tolerance, hold, st.Index); err != nil {
		m.log.Error("heartbeat settings not applied; keeping the timing in use", "err", err, "period", m.timing.Period, "tolerance", m.timing.Tolerance)
	}
	// Keep only the rules a view can still refer to.
	for idx := range m.cfgs {
		if idx != st.Index && idx != m.machine.View().RulesIndex {
			delete(m.cfgs, idx)
		}
	}
}

// timingOf is the heartbeat timing the rules give: the settings' period
// and tolerance, scaled to the size of the registry (heartbeat.ScaledTiming:
// a period per 16 nodes, the same silence before a death), and the
// settings' own period, which the hold after a drop counts in
// (heartbeat.Config.HoldPeriod).
func timingOf(st *rules.State) (period time.Duration, tolerance int, hold time.Duration) {
	s := st.Settings
	hold = cmp.Or(s.HeartbeatPeriod, heartbeat.DefaultPeriod)
	period, tolerance = heartbeat.ScaledTiming(hold, cmp.Or(s.HeartbeatTolerance, heartbeat.DefaultTolerance), len(st.Nodes))
	return period, tolerance, hold
}

// replicatedAdmin is this node's admin state in the rules.
func (m *membership) replicatedAdmin() rules.AdminState {
	if n := m.rs.Node(m.self); n != nil {
		return n.Admin
	}
	return rules.AdminStopped
}

// admin is the admin state the tables follow: the replicated one, or
// draining during a graceful stop (a node about to exit takes nothing new,
// hands its buckets' SYNs over and serves its connections until it exits).
func (m *membership) admin() rules.AdminState {
	if m.leaving {
		return rules.AdminDraining
	}
	return m.replicatedAdmin()
}

// setLocal tells the machine what this node is. Draining and Connections
// are the data plane's, as last pushed.
func (m *membership) setLocal(now time.Time) {
	m.machine.SetLocal(now, heartbeat.Local{
		Admin: adminToHeartbeat(m.replicatedAdmin()), Healthy: m.health() && m.dpHealthy, Leaving: m.leaving,
		RulesIndex: m.rs.Index, Seed: m.rs.Settings.HashSeed, RestartWindow: m.restartW,
		Draining: m.inKernel.draining,
		Counters: heartbeat.Counters{Connections: uint64(m.inKernel.conns)},
	})
}

// run is the membership goroutine. It returns when ctx ends (nil) or the
// heartbeat socket fails (closed: nil).
func (m *membership) run(ctx context.Context) error {
	defer close(m.stopped)
	rulesCh, stopSub := m.rules.Subscribe()
	defer stopSub()
	// The rules store's notices are handed on, with an interrupt.
	var wg sync.WaitGroup
	defer wg.Wait()
	fwd, endFwd := context.WithCancel(ctx)
	defer endFwd()
	rulesNote := make(chan struct{}, 1)
	wg.Go(func() {
		for {
			select {
			case <-fwd.Done():
				return
			case <-rulesCh:
				select {
				case rulesNote <- struct{}{}:
				default:
				}
				m.interrupt()
			}
		}
	})
	defer context.AfterFunc(ctx, m.interrupt)()
	// Changes applied before the subscription started sent no notice.
	m.applyRules(m.now(), m.rules.State())
	var probed <-chan probeResult // nil without a prober: never ready
	if m.probes != nil {
		probed = m.probes.results
		defer m.probes.wait() // ctx has ended: they answer nothing
	}
	next := m.now()
	for {
		// The deadline first, then a look for work: whatever is handed
		// over after the look interrupts the read.
		if err := m.in.SetReceiveDeadline(next); err != nil && !errors.Is(err, net.ErrClosed) {
			return fmt.Errorf("heartbeat socket: %w", err)
		}
		select {
		case <-ctx.Done():
			for _, h := range m.handoffs {
				close(h)
			}
			for _, h := range m.restarts {
				close(h)
			}
			return nil
		case <-rulesNote:
			m.applyRules(m.now(), m.rules.State())
		case <-m.reports.Ready:
			m.takeReport(m.reports.Take())
		case f := <-m.ctl:
			f()
		case r := <-probed:
			m.takeProbe(r)
		case <-m.wake:
		default:
			msg, from, err := m.in.Receive()
			switch {
			case err == nil:
				m.receive(msg, from)
				// Peers send in step: take what arrived meanwhile before
				// stepping once for all of it.
				m.receiveQueued()
			case errors.Is(err, os.ErrDeadlineExceeded):
				// Woken for a deadline, or interrupted: take what waits
				// first. A wake-up that came late (the machine busy) finds
				// heartbeats in the socket, and stepping before them would
				// judge their senders silent: false deaths, the view
				// changes that make the machine busier still (64-node lab).
				m.receiveQueued()
			case errors.Is(err, net.ErrClosed):
				if ctx.Err() != nil {
					continue // the select above returns
				}
				return nil
			default:
				return err
			}
		}
		next = m.step(m.now())
		m.probeSuspects(ctx)
	}
}

// maxBatch bounds the heartbeats taken before a step: a flood of them
// does not hold off the send and the deadlines.
const maxBatch = 256

// receiveQueued takes the heartbeats waiting in the socket, up to maxBatch.
func (m *membership) receiveQueued() {
	for range maxBatch {
		msg, from, ok := m.in.ReceiveQueued()
		if !ok {
			return
		}
		m.receive(msg, from)
	}
}

func (m *membership) receive(msg *heartbeat.Message, from netip.AddrPort) {
	if m.plugged {
		return
	}
	if err := m.machine.Receive(m.now(), msg, from); err != nil {
		m.link.Reject(heartbeat.ReasonOf(err))
		return
	}
	m.heard = true
}

// takeReport learns what the kernel now holds.
func (m *membership) takeReport(r pushReport) {
	m.dpHealthy = r.healthy
	if r.ok && m.log.Enabled(context.Background(), slog.LevelDebug) && (!m.inKernel.ok || m.inKernel.snap.gen != r.snap.gen) {
		m.log.Debug("push reported", "at", stamp(m.now()), "gen", r.snap.gen, "current", r.snap.hb.View.Equal(m.machine.View()))
	}
	if r.ok {
		m.inKernel = r
	}
}

// pushed reports whether the kernel holds the tables of the machine's
// current view: only then may a heartbeat advertise it.
func (m *membership) pushed() bool {
	return m.inKernel.ok && m.inKernel.snap.hb.View.Equal(m.machine.View())
}

// step advances the machine, publishes what changed, and sends a heartbeat
// when due. It returns when it wants to run next.
func (m *membership) step(now time.Time) time.Time {
	m.setLocal(now)
	m.machine.Tick(now)
	if c := m.machine.Config(); c.Period != m.timing.Period || c.Tolerance != m.timing.Tolerance {
		m.log.Info("heartbeat timing changed", "period", c.Period, "tolerance", c.Tolerance,
			"was_period", m.timing.Period, "was_tolerance", m.timing.Tolerance)
		m.timing = c
	}
	m.publish()
	m.checkRestart()
	period := m.machine.Config().Period
	due := m.machine.NextSend()
	pushed := m.pushed()
	if pushed && !m.lastView.Equal(m.machine.View()) {
		// The tables of a view no heartbeat advertised yet are in: say so
		// now. The heartbeats sent while they were pushed (the previous
		// view, re-advertised) took the machine's send-at-once, so its
		// schedule may be a period away.
		due = now
	}
	if !pushed && m.lastSent.Add(period).After(due) {
		// A new view waits for its tables, but liveness does not: the
		// previous advertisement goes out on the usual schedule.
		due = m.lastSent.Add(period)
	}
	if m.heard && pushed && due.Sub(now) <= period/2 {
		// A peer's heartbeat woke this goroutine and ours is due within
		// half a period: send it now instead of waking again for it. Nodes
		// fall into step within a period, so an idle node wakes about once
		// a period instead of once per peer and once for itself, and its
		// peers still hear it at least every period (bench/idle.sh).
		due = now
	}
	m.heard = false
	if !m.plugged && !now.Before(due) {
		m.send(now, pushed)
	}
	m.checkHandoff()
	if pushed {
		return m.machine.Wake()
	}
	// The machine's own wake-up may be the send it cannot make yet: look
	// again soon (deaths and other deadlines are checked by Tick).
	next := now.Add(period / 8)
	if due.After(now) && due.Before(next) {
		next = due
	}
	return next
}

// send sends a heartbeat: the machine's, when the kernel holds its view's
// tables; otherwise one that advertises what the kernel holds, with a fresh
// sequence number.
func (m *membership) send(now time.Time, pushed bool) {
	if !m.inKernel.ok {
		return // nothing was ever pushed: there is nothing true to say yet
	}
	msg := m.machine.Outgoing(now)
	if !pushed {
		msg = readvertise(msg, m.inKernel)
	}
	if m.inKernel.keeping || m.compact {
		c := *msg
		c.Keeping = c.Keeping || m.inKernel.keeping
		c.CompactAcks = m.compact
		msg = &c
	}
	m.lastSent, m.sentKeeping = now, msg.Keeping
	if m.log.Enabled(context.Background(), slog.LevelDebug) && !msg.View.Equal(m.lastView) {
		m.log.Debug("view advertised", "at", stamp(now), "seq", msg.Seq, "view", msg.View.Eligible, "rules", msg.View.RulesIndex)
	}
	m.lastView = msg.View
	if err := m.link.Send(msg, m.peers); err != nil {
		m.log.Debug("heartbeat send", "err", err)
	}
	// Every heartbeat renews the data plane's lease: if this goroutine
	// stalls, the node stops taking new connections (after T-1 periods)
	// before its peers declare it dead (T periods) and take over.
	if m.machine.Inheriting() {
		// The tables hold what the previous agent left, which the peers
		// keep for it only until its restart window ends: the lease it
		// set ends first, and is not extended.
		return
	}
	// Only while the kernel's tables hold the machine's accepting set:
	// after a stall the machine releases everything (its peers may have
	// taken over), and the old tables must not be given a new lease.
	if m.inKernel.snap.hb.Accept != m.machine.Accept() {
		return
	}
	err := m.renew(m.leaseLength(now))
	if err != nil && !m.leaseErr {
		m.log.Error("renew xdp lease; owned buckets will drain when it ends", "err", err)
	}
	m.leaseErr = err != nil
}

// leaseLength is the machine's lease (T-1 periods, see
// heartbeat.Machine.LeaseLength) or, while a restart window is announced, a
// period less than the window, so that the data plane stops taking new
// connections before any peer's window ends (each peer counts it from a
// heartbeat sent after the renewal before it).
func (m *membership) leaseLength(now time.Time) time.Duration {
	if m.restartW > 0 {
		p := m.machine.Config().Period
		return max(m.restartW-p, p)
	}
	return m.machine.LeaseLength(now)
}

// readvertise returns fresh with every field that peers act on when they
// decide ownership (view, draining buckets, eligibility) taken from the
// state whose tables the kernel holds, which may be a view or two behind
// the machine's. Fresh keeps its sequence number and counters, so peers
// still hear a live node.
func readvertise(fresh *heartbeat.Message, k pushReport) *heartbeat.Message {
	out := *fresh
	s := k.snap
	out.View, out.Draining = s.hb.View, k.draining
	out.Admin, out.Healthy, out.RulesIndex = adminToHeartbeat(s.replicated), s.healthy, s.rs.Index
	out.Settled, out.Deaf, out.Leaving = s.hb.Settled, s.hb.Deaf, s.leaving
	return &out
}

// publish hands a new snapshot to the data plane and the APIs when
// anything in it changed.
func (m *membership) publish() {
	v := m.machine.Version()
	old := m.snap.Load()
	healthy := m.health() && m.dpHealthy
	if old != nil && v == m.published && old.rs == m.rs && old.plugged == m.plugged &&
		old.leaving == m.leaving && old.healthy == healthy {
		return
	}
	m.published = v
	m.gen++
	s := &Snap{gen: m.gen, rs: m.rs, fcfg: m.cfgs[m.rs.Index], hb: m.machine.Status(),
		admin: m.admin(), replicated: m.replicatedAdmin(), healthy: healthy, plugged: m.plugged, leaving: m.leaving}
	if s.hb.Inheriting {
		s.inheritedDirty = m.inheritDirty
	} else {
		m.inheritDirty = nil
	}
	if s.fcfg == nil || s.hb.View.RulesIndex != m.rs.Index {
		// Not reachable: setLocal gave the machine rs.Index, so its view
		// carries it. Never hand the data plane a view with other rules.
		panic(fmt.Sprintf("agent: view of rules index %d published with rules %d", s.hb.View.RulesIndex, m.rs.Index))
	}
	m.snap.Store(s)
	m.toDP.Put(s)
	if m.log.Enabled(context.Background(), slog.LevelDebug) {
		m.logStep(old, s)
	}
}

// logStep logs, at debug, the steps of a handoff: a view adopted, the
// view converged (the accepting set acquired). Wall times, to the
// microsecond, so that the nodes' logs line up.
func (m *membership) logStep(old, s *Snap) {
	now := m.now()
	if old == nil || !old.hb.View.Equal(s.hb.View) {
		m.log.Debug("view adopted", "at", stamp(now), "gen", s.gen, "view", s.hb.View.Eligible, "rules", s.hb.View.RulesIndex)
	}
	if s.hb.Converged && (old == nil || !old.hb.Converged || !old.hb.View.Equal(s.hb.View)) {
		m.log.Debug("view converged", "at", stamp(now), "gen", s.gen, "view", s.hb.View.Eligible,
			"since_adopted", now.Sub(s.hb.AdoptedAt))
	}
}

// stamp formats a wall time for the step logs.
func stamp(t time.Time) string { return t.Format("15:04:05.000000") }

// handoff starts a graceful stop: the node advertises it is leaving, and
// the returned channel is closed once every live peer advertises a view
// without it (or membership stops).
func (m *membership) handoff(ctx context.Context) (<-chan struct{}, error) {
	done := make(chan struct{})
	err := m.do(ctx, func() {
		m.leaving, m.restartW = true, 0
		m.handoffs = append(m.handoffs, done)
	})
	return done, err
}

// announceRestart starts a stop for a restart: the node announces a
// restart window in its heartbeats (and its lease covers it, see
// leaseLength), and the returned channel is closed once every live peer
// acknowledges a heartbeat that carried it.
func (m *membership) announceRestart(ctx context.Context, window time.Duration) (<-chan struct{}, error) {
	done := make(chan struct{})
	err := m.do(ctx, func() {
		m.restartW = min(window, heartbeat.MaxRestartWindow)
		m.restarts = append(m.restarts, done)
	})
	return done, err
}

func (m *membership) checkRestart() {
	if len(m.restarts) == 0 || !m.machine.RestartAcked() {
		return
	}
	for _, h := range m.restarts {
		close(h)
	}
	m.restarts = nil
}

// machinePeriod is the heartbeat period in use; call it only once run has
// returned.
func (m *membership) machinePeriod() time.Duration { return m.machine.Config().Period }

func (m *membership) checkHandoff() {
	if len(m.handoffs) == 0 || !m.pushed() {
		return
	}
	// Released, and the tables keep nothing for the peers any more, and
	// a heartbeat has said so: they wait for that to acquire.
	if !m.machine.Status().Released || m.inKernel.keeping || m.sentKeeping {
		return
	}
	for _, h := range m.handoffs {
		close(h)
	}
	m.handoffs = nil
}

// setPlug pulls or restores the virtual plug. Putting it back starts a
// fresh incarnation, so the node listens before it takes anything, as a
// node whose cable comes back after a restart.
func (m *membership) setPlug(ctx context.Context, pulled bool) error {
	var err error
	if derr := m.do(ctx, func() {
		if m.plugged == pulled {
			return
		}
		m.plugged = pulled
		m.log.Warn("virtual plug", "pulled", pulled)
		if !pulled {
			err = m.newMachine(m.now())
		}
	}); derr != nil {
		return derr
	}
	return err
}

// errStopped: membership no longer runs.
var errStopped = errors.New("membership stopped")

// do runs f on the membership goroutine.
func (m *membership) do(ctx context.Context, f func()) error {
	done := make(chan struct{})
	select {
	case m.ctl <- func() { f(); close(done) }:
	case <-ctx.Done():
		return ctx.Err()
	case <-m.stopped:
		return errStopped
	}
	m.interrupt()
	select {
	case <-done:
		return nil
	case <-m.stopped:
		return errStopped
	}
}

func (m *membership) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
	m.interrupt()
}

// NodeIDs converts the heartbeat's node ids to the filter's.
func NodeIDs(ids []uint32) []filter.NodeID { return nodeIDs(ids) }

func nodeIDs(ids []uint32) []filter.NodeID {
	out := make([]filter.NodeID, len(ids))
	for i, id := range ids {
		out[i] = filter.NodeID(id)
	}
	return out
}

// sortedLive returns self and the live peers of st, sorted.
func sortedLive(self filter.NodeID, st heartbeat.Status[*lazySet]) []filter.NodeID {
	out := []filter.NodeID{self}
	for _, p := range st.Peers {
		if p.Live {
			out = append(out, filter.NodeID(p.ID))
		}
	}
	slices.Sort(out)
	return out
}
