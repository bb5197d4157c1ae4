package heartbeat

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"time"
)

// Local is what this node advertises about itself; the agent sets it.
type Local struct {
	Admin      AdminState
	Healthy    bool
	RulesIndex uint64  // Raft index of the rules applied to the data plane
	Seed       uint32  // hash seed of those rules
	Draining   Buckets // buckets this node holds connections in but does not accept
	Counters   Counters
	// Leaving: this node is stopping and hands its buckets over. It leaves
	// its own view at once and peers drop it from theirs on its next
	// heartbeat; Status.Released tells when every live peer has.
	Leaving bool
	// RestartWindow, when not 0, announces a restart of at most this long
	// (capped at MaxRestartWindow): peers keep this node in their views,
	// with its buckets, until that long after its last heartbeat.
	RestartWindow time.Duration
}

// PeerStatus is what this node knows of one registered peer.
type PeerStatus struct {
	ID       uint32
	Live     bool // a valid heartbeat arrived within the last T periods
	Eligible bool // in this node's view
	Lagging  bool // rules index behind the newest seen for longer than the grace
	Hears    bool // its last heartbeat acknowledges this node's incarnation
	Suspect  bool // silent for T/2 periods or more: probe it (Machine.Probe)
	// MayHold: it died (or came back and has not settled) within HeldGrace
	// (for a peer that announced a restart: of the end of its window),
	// and no probe found it gone since it was last heard: its data plane
	// may still serve the connections it holds (a stalled agent's XDP
	// program runs on, draining once its lease ends), so buckets taken from
	// it must stay dirty meanwhile.
	MayHold      bool
	Restarting   bool // it announced a restart and is kept until RestartUntil
	LastHeard    time.Time
	RestartUntil time.Time
	Incarnation  uint64
	Settled      bool
	Leaving      bool
	Admin        AdminState
	Healthy      bool
	RulesIndex   uint64
	View         View // the view the peer advertises
	Draining     Buckets
	Counters     Counters
}

// Status is the Machine's output: everything the agent acts on.
type Status[S any] struct {
	// Version grows whenever anything below that the agent acts on changes
	// (view, convergence, accepting set, peers' liveness, admin state,
	// health, rules index, draining buckets or suspects); comparing it is
	// enough to know whether to reconcile.
	Version     uint64
	Incarnation uint64
	View        View
	AdoptedAt   time.Time // when this node adopted View
	// Converged: every other member of View advertises it in a heartbeat
	// that acknowledges one this node sent after adopting it.
	Converged bool
	Excluded  bool // a live peer that hears this node leaves it out of its view: Accept is empty
	Settled   bool // done listening after start, and not deaf
	// Deaf: no peer this node hears hears it, while a probe found alive a
	// peer it does not hear (it hears nobody, or only nodes cut off like
	// itself). A deaf node is not eligible.
	Deaf        bool
	Lagging     bool   // this node's rules index lags the newest seen past the grace
	NewestRules uint64 // the newest rules index seen, here or at a live peer
	// Released: every live peer that is not leaving itself advertises a
	// view without this node (for a leaving node: its buckets are handed
	// over, it may stop).
	Released bool
	// Inheriting: the accepting set is the one the previous incarnation
	// left (Inherit), kept until this node settles or the inheritance ends.
	Inheriting bool
	// RestartAcked: this node announces a restart window and every live
	// peer acknowledges a heartbeat that carried it.
	RestartAcked bool
	// Accept is the accepting set: the buckets where this node takes new
	// connections. It is shared with the Machine and must not be modified.
	Accept S
	Peers  []PeerStatus // every registered peer, sorted by id (their draining buckets: Draining of the live ones)
	// Suspects are the peers to probe through a second channel (a TCP
	// connection to the peer API) and report with Machine.Probe.
	Suspects []uint32
	Deaths   uint64 // times a live peer was declared dead, since start
	Stalls   uint64 // times this node found it had stalled past its lease (see checkStall)
	// Period and Tolerance are the heartbeat timing in use (SetTiming
	// changes it at a safe point).
	Period    time.Duration
	Tolerance int
}

type peer struct {
	addr      netip.AddrPort // registered heartbeat address
	msg       *Message       // the last accepted heartbeat; nil until one arrives
	lastHeard time.Time
	live      bool
	behind    time.Time // since when its rules index lags the newest; zero if not
	// acked: its last heartbeat acknowledges one we sent after adopting our
	// view; agrees: and it advertises that view.
	acked, agrees bool
	// restartUntil: it announced a restart; until then it is kept as
	// restartMsg said (eligible or not), even silent.
	restartUntil time.Time
	restartMsg   *Message
	// claimSince: since when it is settled, includes itself in its view
	// and does not hear this node (so cannot acknowledge it); zero if not.
	claimSince time.Time
	probeAt    time.Time // when the last probe result came; zero if none
	probeAlive bool
	probeGone  bool // the last probe found nothing listening (ProbeGone)
	suspect    bool
	diedAt     time.Time // when it was last declared dead; zero if never
	liveSince  time.Time // when it last became live (first heard, back, or a new incarnation)
	mayHold    bool      // see PeerStatus.MayHold
}

// seen is the newest heartbeat accepted from a node, kept for ever (also
// after its death or removal): older incarnations and repeated sequence
// numbers stay rejected.
type seen struct{ inc, seq uint64 }

// Machine is the membership state machine of one node: the failure
// detector, the view and the accepting set. It is pure (time comes in as
// arguments, nothing blocks) and not safe for concurrent use.
//
// S is the bucket-set type; owned(v) returns the buckets this node owns in
// view v and intersect(a, b) their intersection. Both must return a new value
// and leave their arguments alone; the zero S is the empty set. owned is
// called at most once per view, and only when this node is in the view and
// has buckets to release or reaches convergence; never per tick.
type Machine[S any] struct {
	cfg       Config
	owned     func(View) S
	intersect func(a, b S) S

	start      time.Time
	listenFrom time.Time // start, or when it last stopped being deaf: settling listens from here
	local      Local
	registry   map[uint32]netip.AddrPort
	ids        []uint32 // registry ids, sorted
	peersKnown bool     // SetPeers was called
	peers      map[uint32]*peer
	seen       map[uint32]seen
	settled    bool
	deaf       bool
	selfBehind time.Time
	newest     uint64

	hasView bool
	view    View
	adopted time.Time
	viewSeq uint64 // the sequence number of the first heartbeat sent in view
	// dropped: nodes that left the view since it was last acted on, and
	// when; acquisition waits until holdFor says each knows.
	dropped     map[uint32]time.Time
	cur         S    // owned(view), once curValid
	curValid    bool // cur has been computed for view
	accept      S
	acceptEmpty bool // accept is the zero S
	acquired    bool // accept = cur, taken on convergence
	converged   bool
	excluded    bool
	released    bool
	sentInView  int
	// inheriting: accept is the previous incarnation's (Inherit), until
	// this node settles or inheritUntil passes.
	inheriting   bool
	inheritUntil time.Time
	restartSeq   uint64 // the first heartbeat that announced the restart window; 0 if none

	seq      uint64
	stalled  time.Time // lastSent when a stall was last acted on (checkStall)
	stalls   uint64
	tat      time.Time // the send budget, as a GCRA: see sendSoon
	lastSent time.Time
	nextSend time.Time

	reach reachCache

	// timing: a new period and tolerance waiting for their safe point
	// (SetTiming); hasTiming says there is one.
	timing    pendingTiming
	hasTiming bool
	change    timingChange // the last switch

	now      time.Time // the latest time given
	deferred bool      // see DeferRecompute
	pending  bool      // a deferred Receive changed what recompute reads
	version  uint64
	// derived is the version the last recompute left, and due the
	// earliest of its deadlines (see deadline): until either moves, Tick
	// has nothing to do. A heartbeat only makes deadlines later, except a
	// restart window's end, which lowers due itself.
	derived uint64
	due     time.Time
	deaths  uint64
}

// sendBudget is how many heartbeats a node sends a period at most,
// whatever the cluster's size (a period's worth may go at once): view
// changes, and replies to peers' views, go out at once within the budget,
// and later ones wait their turn. Each goes to every peer. The budget once
// grew with the peers (4 + N), from when each peer's adoption of a view
// had its own answer: in a storm of view changes a node of 64 could send
// 67 a period, 4,200 datagrams (docs/BENCHMARKS-LOG.md, "Scaling, fifth
// step"). A view change takes two or three.
const sendBudget = 6

// NewMachine returns the Machine of a node that starts at now, with an empty
// accepting set. Call SetPeers and SetLocal next: until SetPeers the node
// cannot settle early, and the zero Local is unhealthy, so not eligible.
// Zero fields of cfg take their defaults.
func NewMachine[S any](cfg Config, now time.Time, owned func(View) S, intersect func(a, b S) S) (*Machine[S], error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("heartbeat config: %w", err)
	}
	m := &Machine[S]{
		cfg: cfg, owned: owned, intersect: intersect,
		start: now, listenFrom: now, registry: map[uint32]netip.AddrPort{}, peers: map[uint32]*peer{}, seen: map[uint32]seen{}, dropped: map[uint32]time.Time{},
		acceptEmpty: true, nextSend: now,
	}
	m.recompute(now)
	return m, nil
}

// Config returns the settings in use, defaults filled in.
func (m *Machine[S]) Config() Config { return m.cfg }

func (m *Machine[S]) period(n int) time.Duration { return time.Duration(n) * m.cfg.Period }

// suspectAfter is how long a silent peer goes before it is probed: half the
// tolerance, so that the probe's answer is in before the peer would die.
func (m *Machine[S]) suspectAfter() time.Duration { return m.period(m.cfg.Tolerance) / 2 }

// Receive takes one decoded, authenticated heartbeat and the address it came
// from. It returns an error wrapping ErrSelf, ErrUnknownNode,
// ErrForeignCluster, ErrWrongAddress, ErrOldIncarnation or ErrStale when the
// heartbeat is dropped; a dropped heartbeat changes nothing.
func (m *Machine[S]) Receive(now time.Time, msg *Message, from netip.AddrPort) error {
	m.checkStall(now) // before a steady-state heartbeat skips recompute
	reg, registered := m.registry[msg.Node]
	switch {
	case msg.ClusterID != m.cfg.ClusterID:
		return fmt.Errorf("%w: cluster id %d", ErrForeignCluster, msg.ClusterID)
	case msg.Node == m.cfg.Self:
		// Our own heartbeat looped back, or another node uses our id.
		return fmt.Errorf("%w: node %d incarnation %d", ErrSelf, msg.Node, msg.Incarnation)
	case !registered:
		return fmt.Errorf("%w: node %d", ErrUnknownNode, msg.Node)
	case !reg.IsValid() || from.Addr().Unmap() != reg.Addr().Unmap() || from.Port() != reg.Port():
		return fmt.Errorf("%w: node %d from %v, registered at %v", ErrWrongAddress, msg.Node, from, reg)
	}
	last := m.seen[msg.Node]
	switch {
	case msg.Incarnation < last.inc:
		return fmt.Errorf("%w: node %d incarnation %d, seen %d", ErrOldIncarnation, msg.Node, msg.Incarnation, last.inc)
	case msg.Incarnation == last.inc && msg.Seq <= last.seq:
		return fmt.Errorf("%w: node %d sequence %d, last %d", ErrStale, msg.Node, msg.Seq, last.seq)
	}
	if msg.CompactAcks {
		m.widen(msg.Acks)
	}
	m.seen[msg.Node] = seen{msg.Incarnation, msg.Seq}
	p := m.peers[msg.Node]
	changed := p.msg == nil || !p.live
	reply, newView := changed, false
	if old := p.msg; old != nil {
		switch {
		case msg.Incarnation != old.Incarnation:
			// A restarted peer is a fresh member: nothing it said before counts.
			p.behind, changed, reply = time.Time{}, true, true
		case !msg.View.Equal(old.View):
			changed, newView = true, true
		case msg.Admin != old.Admin || msg.Healthy != old.Healthy || msg.Settled != old.Settled ||
			msg.Leaving != old.Leaving || msg.Deaf != old.Deaf || msg.Keeping != old.Keeping || (msg.RestartWindow > 0) != (old.RestartWindow > 0) ||
			msg.RulesIndex != old.RulesIndex || !msg.Draining.Equal(old.Draining) || !m.sameHearing(msg.Acks, old.Acks):
			changed = true
		}
	}
	if msg.RestartWindow > 0 {
		p.restartUntil, p.restartMsg = now.Add(min(msg.RestartWindow, MaxRestartWindow)), msg
		if p.restartUntil.Before(m.due) {
			m.due = p.restartUntil
		}
	} else if p.restartMsg != nil && (msg.Incarnation == p.restartMsg.Incarnation || msg.Settled) {
		// The restart was called off, or the new incarnation has settled.
		p.restartUntil, p.restartMsg, changed = time.Time{}, nil, true
	}
	if p.msg == nil || !p.live || p.msg.Incarnation != msg.Incarnation {
		p.liveSince = now
	}
	p.msg, p.lastHeard, p.live = msg, now, true
	if m.claims(p) {
		if p.claimSince.IsZero() {
			p.claimSince, changed = now, true
		}
	} else if !p.claimSince.IsZero() {
		p.claimSince, changed = time.Time{}, true
	}
	if p.suspect {
		p.suspect, changed = false, true
	}
	acked := m.acks(msg)
	agrees := acked && m.hasView && msg.View.Equal(m.view)
	if acked != p.acked || agrees != p.agrees {
		p.acked, p.agrees, changed = acked, agrees, true
	}
	if reply || newView && m.answers(msg) {
		// The peer came back, or adopted a view: it needs our
		// acknowledgement to converge, so answer now.
		m.sendSoon(now)
	}
	if changed {
		m.version++
	} else if m.converged && now.Before(m.due) {
		// The steady state: a live peer repeats itself, nothing that
		// recompute derives can change, and none of its deadlines passed
		// (moving m.now past one would hide it from Tick).
		m.now = now
		return nil
	}
	if m.deferred {
		m.now, m.pending = now, true
		return nil
	}
	m.recompute(now)
	return nil
}

// widen gives acknowledgements that carry the low 32 bits of incarnation
// and sequence (protocol version 3) their full values from what this node
// knows: its own incarnation and the last sequence it sent, and of each
// peer the incarnation and highest sequence it received (seen); the
// sequence is the one nearest to what it knows. An incarnation it does not
// know stays as it came, and compares unequal to every one it knows, as
// it would in full (and an incarnation below 2^32, as they all are, is
// its own low 32 bits).
func (m *Machine[S]) widen(acks []Ack) {
	for i := range acks {
		a := &acks[i]
		inc, seq := m.cfg.Incarnation, m.seq
		if a.Node != m.cfg.Self {
			inc, seq = m.seen[a.Node].inc, m.seen[a.Node].seq
		}
		if uint32(inc) == uint32(a.Incarnation) {
			a.Incarnation = inc
		}
		a.Seq = nearest(seq, uint32(a.Seq))
	}
}

// nearest is the value whose low 32 bits are low nearest to ref.
func nearest(ref uint64, low uint32) uint64 {
	v := ref&^0xffffffff | uint64(low)
	switch {
	case v > ref && v-ref > 1<<31 && v >= 1<<32:
		v -= 1 << 32
	case v < ref && ref-v > 1<<31 && v < math.MaxUint64-1<<32:
		v += 1 << 32
	}
	return v
}

// DeferRecompute, on, makes Receive only record what a heartbeat says:
// the view, convergence and the accepting set are derived at the next
// Tick (or any other call that recomputes), once for every heartbeat
// received since. A caller that takes heartbeats in batches and then
// ticks (the agent) gets the same outputs for a fraction of the work:
// deriving the view checks every pair of nodes for hearing each other,
// and during a storm of changes in a 45-node lab that check after every
// heartbeat was a sixth of the machine's CPU (docs/BENCHMARKS-LOG.md).
// Replies a heartbeat asks for are still scheduled at once (NextSend), and
// Wake says to tick now while a recompute waits.
func (m *Machine[S]) DeferRecompute(on bool) { m.deferred = on }

// answers reports whether a peer's newly adopted view (msg.View) calls for
// a heartbeat now rather than at the next period. A view built on rules
// this node has not applied yet needs none: applying them changes this
// node's view, which it announces at once, acknowledging the peer. This
// node's own view needs one once every member advertises it: one
// heartbeat then acknowledges them all, the last step of converging;
// before that, an answer to each member as it adopts the view is a
// heartbeat to every peer per member (a 32-node lab sent 13 heartbeats a
// node for each rule change, docs/BENCHMARKS-LOG.md), and whoever adopts
// it last completes every node's count. Any other view is answered at once:
// the peer may be judging who hears whom, and this node's heartbeat says.
func (m *Machine[S]) answers(msg *Message) bool {
	switch {
	case msg.View.RulesIndex > m.local.RulesIndex:
		return false
	case m.hasView && msg.View.Equal(m.view):
		for _, id := range m.view.Eligible {
			if p := m.peers[id]; id != m.cfg.Self && (p == nil || !p.live || p.msg == nil || !p.msg.View.Equal(m.view)) {
				return false
			}
		}
	}
	return true
}

// claims reports whether live peer p may be accepting without hearing this
// node: settled, in its own view, and acknowledging nothing of this
// incarnation.
func (m *Machine[S]) claims(p *peer) bool {
	if !p.msg.Settled || !p.msg.View.Has(p.msg.Node) {
		return false
	}
	a, ok := ackOf(p.msg.Acks, m.cfg.Self)
	return !ok || a.Incarnation != m.cfg.Incarnation
}

// acks reports whether msg acknowledges a heartbeat this incarnation sent
// after adopting its view.
func (m *Machine[S]) acks(msg *Message) bool {
	a, ok := ackOf(msg.Acks, m.cfg.Self)
	return ok && a.Incarnation == m.cfg.Incarnation && a.Seq >= m.viewSeq
}

func ackOf(acks []Ack, id uint32) (Ack, bool) {
	i, ok := slices.BinarySearchFunc(acks, id, func(a Ack, id uint32) int {
		switch {
		case a.Node < id:
			return -1
		case a.Node > id:
			return 1
		}
		return 0
	})
	if !ok {
		return Ack{}, false
	}
	return acks[i], true
}

// sameHearing reports whether two ack lists name the same incarnations
// with ages on the same side of every threshold recompute reads: heard
// within a period or not (holdFor), within T/2 periods or not
// (silentEverywhere).
func (m *Machine[S]) sameHearing(a, b []Ack) bool {
	if len(a) != len(b) {
		return false
	}
	half := uint8(min(max(m.cfg.Tolerance/2, 1), 255))
	class := func(age uint8) int {
		switch {
		case age <= 1:
			return 0
		case age < half:
			return 1
		}
		return 2
	}
	for i := range a {
		if a[i].Node != b[i].Node || a[i].Incarnation != b[i].Incarnation || class(a[i].Age) != class(b[i].Age) {
			return false
		}
	}
	return true
}

// Probe takes the result of a probe of peer id through a second channel
// (its peer API). A live result keeps a deaf node from taking buckets; any
// other lets a view that dropped the peer be acted on without the wait for
// a node that may still be alive, and ProbeGone also ends PeerStatus.MayHold.
// Results count for T periods.
func (m *Machine[S]) Probe(now time.Time, id uint32, r ProbeResult) {
	p := m.peers[id]
	if p == nil {
		return
	}
	p.probeAt, p.probeAlive, p.probeGone = now, r == ProbeAlive, r == ProbeGone
	if p.suspect {
		p.suspect = false
	}
	m.version++
	m.recompute(now)
}

// Tick lets time pass: peers silent for more than T periods die (or at the
// end of their restart window), and deadlines (settling, rules lag, holds,
// suspicion) are checked. Call it at Wake() at the latest.
func (m *Machine[S]) Tick(now time.Time) {
	m.checkStall(now)
	if m.version != m.derived || m.pending || !now.Before(m.due) {
		m.tick(now)
		return
	}
	// Nothing recompute reads changed since it last ran and none of its
	// deadlines (a death among them) passed: it would derive the same. The
	// agent ticks at every wake-up, and at 64 nodes at rest a recompute
	// each time was a seventh of its CPU (docs/BENCHMARKS-LOG.md).
	if verifySkips {
		v := m.version
		m.tick(now)
		if m.version != v {
			panic(fmt.Sprintf("heartbeat: a skipped tick at %v would have changed the state", now))
		}
		return
	}
	m.now = now
}

// tick declares the deaths, ends the restart windows and the inheriting
// that are due, and recomputes.
func (m *Machine[S]) tick(now time.Time) {
	for _, p := range m.peers {
		if p.live && now.Sub(p.lastHeard) > m.deathWindow(now) {
			p.live, p.acked, p.agrees, p.behind, p.claimSince = false, false, false, time.Time{}, time.Time{}
			p.diedAt = now
			if !m.kept(p, now) {
				m.deaths++
			}
			m.version++
		}
		if p.restartMsg != nil && !now.Before(p.restartUntil) {
			p.restartUntil, p.restartMsg = time.Time{}, nil
			if !p.live {
				m.deaths++ // it did not come back in time: a failure
				p.diedAt = now
			}
			m.version++
		}
	}
	if m.inheriting && !now.Before(m.inheritUntil) {
		// The peers' restart window ends: what they kept for this node is
		// theirs to take again.
		var zero S
		m.inheriting, m.accept, m.acceptEmpty, m.acquired = false, zero, true, false
		m.version++
	}
	m.recompute(now)
}

// verifySkips makes Tick run every tick it skips (deaths, windows and the
// recompute) and panic if that changed anything: the package's tests set
// it, so that every simulator run checks the skip.
var verifySkips = false

// Inherit gives this node, freshly started, the accepting set its previous
// incarnation held when it stopped for a restart, having announced a
// restart window: its peers keep that incarnation in their views, with its
// buckets, until this one settles or the window ends, so this one keeps
// accepting there meanwhile instead of starting empty. The set is kept
// through every view adopted before settling (they cannot include this
// node); once settled the usual rules apply to it (released at once to what
// the view gives this node, yielded when excluded); at until, if not
// settled by then, it is dropped. until must not be later than the end of
// the window the peers were told (the agent uses the data-plane lease the
// previous incarnation set, which ends a period before).
func (m *Machine[S]) Inherit(now time.Time, accept S, until time.Time) {
	if m.settled || !now.Before(until) {
		return
	}
	m.accept, m.acceptEmpty, m.acquired = accept, false, false
	m.inheriting, m.inheritUntil = true, until
	m.version++
	m.recompute(now)
}

func (m *Machine[S]) kept(p *peer, now time.Time) bool {
	return p.restartMsg != nil && now.Before(p.restartUntil)
}

// SetLocal sets what this node advertises about itself. l.Draining is kept,
// not copied. Only a change of what recompute reads (admin state, health,
// rules, seed, leaving, restart window) recomputes: the agent sets its
// local state before every step, and at 64 nodes a recompute after each of
// the 840 heartbeats a second was most of an idle node's machine time
// (bench/scale.sh).
func (m *Machine[S]) SetLocal(now time.Time, l Local) {
	old := m.local
	m.local = l
	if old.Admin != l.Admin || old.Healthy != l.Healthy || old.RulesIndex != l.RulesIndex || old.Seed != l.Seed ||
		old.Leaving != l.Leaving || old.RestartWindow != l.RestartWindow {
		m.version++
		if old.Leaving != l.Leaving || old.RestartWindow != l.RestartWindow {
			m.sendSoon(now)
		}
		if l.RestartWindow <= 0 {
			m.restartSeq = 0
		}
		m.recompute(now)
	}
}

// SetPeers sets the node registry: each peer's id and the address its
// heartbeats come from (and go to). Only these nodes' heartbeats count, only
// from these addresses, and these are the nodes this one must hear before it
// settles. Self and 0 are ignored; the map is not kept.
func (m *Machine[S]) SetPeers(now time.Time, peers map[uint32]netip.AddrPort) {
	reg := make(map[uint32]netip.AddrPort, len(peers))
	for id, ap := range peers {
		if id != 0 && id != m.cfg.Self {
			reg[id] = ap
		}
	}
	for id := range m.peers {
		if _, ok := reg[id]; !ok {
			delete(m.peers, id)
			m.version++
		}
	}
	m.ids = m.ids[:0]
	for id, ap := range reg {
		m.ids = append(m.ids, id)
		p := m.peers[id]
		if p == nil {
			p = &peer{}
			m.peers[id] = p
			m.version++
		}
		if p.addr != ap {
			p.addr = ap
			m.version++
		}
	}
	slices.Sort(m.ids)
	m.registry, m.peersKnown = reg, true
	m.recompute(now)
}

// Outgoing returns the heartbeat to send now, to every registered peer, and
// schedules the next one a period later. Call it at NextSend().
func (m *Machine[S]) Outgoing(now time.Time) *Message {
	m.seq++
	msg := &Message{
		ClusterID: m.cfg.ClusterID, Node: m.cfg.Self, Incarnation: m.cfg.Incarnation, Seq: m.seq,
		Admin: m.local.Admin, Healthy: m.local.Healthy, Settled: m.settled && !m.deaf,
		Deaf: m.deaf, Leaving: m.local.Leaving, RestartWindow: min(max(m.local.RestartWindow, 0), MaxRestartWindow),
		RulesIndex: m.local.RulesIndex, View: m.view, Draining: m.local.Draining, Counters: m.local.Counters,
	}
	for _, id := range m.ids {
		if p := m.peers[id]; p.live {
			age := min(now.Sub(p.lastHeard)/m.cfg.Period, 255)
			msg.Acks = append(msg.Acks, Ack{Node: id, Incarnation: p.msg.Incarnation, Seq: m.seen[id].seq, Age: uint8(age)})
		}
	}
	if msg.RestartWindow > 0 && m.restartSeq == 0 {
		m.restartSeq = m.seq
	}
	m.sentInView++
	m.tat = later(m.tat, now).Add(m.sendPeriod(now) / sendBudget)
	m.lastSent, m.nextSend = now, now.Add(m.sendPeriod(now))
	m.recompute(now)
	return msg
}

// sendSoon makes the next heartbeat due now, or as soon as the budget
// allows: at most sendBudget heartbeats in any period (a generic cell
// rate algorithm: each heartbeat takes P/budget, a period's worth may be
// spent at once).
func (m *Machine[S]) sendSoon(now time.Time) {
	t := later(now, m.tat.Add(-m.cfg.Period))
	if t.Before(m.nextSend) {
		m.nextSend = t
	}
}

// NextSend is when the next heartbeat is due: a period after the last, or
// sooner after a view change here or at a peer, so that peers learn the new
// view and acknowledge it at once.
func (m *Machine[S]) NextSend() time.Time { return m.nextSend }

// Wake returns the latest time at which Tick (or Outgoing, when NextSend is
// due) must next be called for the Machine to act on time: the next
// heartbeat, the next possible death or suspicion, the end of a lag grace,
// of settling, of a restart window, of a probe's validity or of a hold.
func (m *Machine[S]) Wake() time.Time {
	if m.pending {
		return m.now // heartbeats received and not yet acted on: tick now
	}
	if m.due.Before(m.nextSend) {
		return m.due
	}
	return m.nextSend
}

// deadline returns the earliest time after the last recompute (m.now) at
// which something it derives may change with time alone: a death, a
// suspicion, the end of a lag grace, of settling, of a restart window, of
// a probe's validity, of a hold, of a newcomer's first periods or of a
// peer's silence counted by the others; without any, a time later than
// every one. A death or an end of a window that only tick acts on is
// returned even when passed, until a tick has acted on it.
func (m *Machine[S]) deadline() time.Time {
	w := time.Unix(1<<62, 0)
	half := m.period(max(m.cfg.Tolerance/2, 1)) // silentEverywhere's
	earliest := func(t time.Time) {
		// Deadlines already passed were acted on by the last recompute.
		if t.After(m.now) && t.Before(w) {
			w = t
		}
	}
	// What only tick acts on (a death, the end of a restart window or of
	// inheriting) stays due once passed: a recompute made since (a
	// probe's answer, a heartbeat sent or received) did not act on it,
	// and the Tick that follows must not be skipped. Dropped, a death
	// waited for the next deadline of another kind, up to T/2 periods.
	forTick := func(t time.Time) {
		if t.Before(w) {
			w = t
		}
	}
	for _, p := range m.peers {
		if p.live {
			forTick(p.lastHeard.Add(m.deathWindow(m.now) + 1))
			earliest(p.lastHeard.Add(half))
			earliest(p.liveSince.Add(m.period(2))) // mutual's newcomers
			if !p.behind.IsZero() {
				earliest(p.behind.Add(m.period(m.cfg.LagGrace) + 1))
			}
		}
		earliest(m.lastHeard(p).Add(m.suspectAfter()))
		if !p.probeAt.IsZero() {
			earliest(p.probeAt.Add(m.suspectAfter()))
			earliest(p.probeAt.Add(m.period(m.cfg.Tolerance) + 1))
		}
		if p.restartMsg != nil {
			forTick(p.restartUntil)
		}
		if p.mayHold {
			earliest(p.diedAt.Add(HeldGrace + 1))
		}
	}
	if m.inheriting {
		forTick(m.inheritUntil)
	}
	if !m.selfBehind.IsZero() {
		earliest(m.selfBehind.Add(m.period(m.cfg.LagGrace) + 1))
	}
	if m.hasTiming {
		earliest(m.timing.since.Add(m.period(m.cfg.Tolerance)))
	}
	earliest(m.change.until) // the death window shrinks back
	if !m.settled {
		earliest(m.listenFrom.Add(m.period(m.cfg.Tolerance)))
	}
	if !m.converged {
		for id, at := range m.dropped {
			earliest(at.Add(m.holdFor(id, m.now)))
		}
		for _, p := range m.peers {
			if p.live && !p.claimSince.IsZero() {
				earliest(m.claimHold(p))
			}
		}
	}
	return w
}

// lastHeard is when p was last heard, or this node's start if never.
func (m *Machine[S]) lastHeard(p *peer) time.Time {
	if p.msg == nil {
		return m.start
	}
	return p.lastHeard
}

func (m *Machine[S]) lagging(behind, now time.Time) bool {
	return !behind.IsZero() && now.Sub(behind) > m.period(m.cfg.LagGrace)
}

// advert is what counts of p for eligibility: its last heartbeat, or while
// it restarts the one that announced the restart.
func (m *Machine[S]) advert(p *peer, now time.Time) *Message {
	if m.kept(p, now) {
		return p.restartMsg
	}
	if p.live {
		return p.msg
	}
	return nil
}

func (m *Machine[S]) eligible(p *peer, now time.Time) bool {
	a := m.advert(p, now)
	return a != nil && a.Settled && !a.Leaving && a.Admin == Started && a.Healthy && (m.kept(p, now) || !m.lagging(p.behind, now))
}

func (m *Machine[S]) selfEligible(now time.Time) bool {
	return m.settled && !m.deaf && !m.local.Leaving && m.local.Admin == Started && m.local.Healthy && !m.lagging(m.selfBehind, now)
}

// probedAlive reports whether a probe found p alive within T periods.
func (m *Machine[S]) probedAlive(p *peer, now time.Time) bool {
	return p.probeAlive && !p.probeAt.IsZero() && now.Sub(p.probeAt) <= m.period(m.cfg.Tolerance)
}

// probedDead reports whether a probe found p gone within T periods.
func (m *Machine[S]) probedDead(p *peer, now time.Time) bool {
	return !p.probeAlive && !p.probeAt.IsZero() && now.Sub(p.probeAt) <= m.period(m.cfg.Tolerance)
}

// recompute derives everything from the inputs: lag, settling, deafness,
// suspects, the view (release at once on a change), exclusion (yield) and
// convergence (acquire).
func (m *Machine[S]) recompute(now time.Time) {
	m.checkStall(now)
	m.now, m.pending = now, false
	m.newest = m.local.RulesIndex
	for _, p := range m.peers {
		if p.live {
			m.newest = max(m.newest, p.msg.RulesIndex)
		}
	}
	track := func(behind *time.Time, index uint64) {
		switch {
		case index >= m.newest:
			*behind = time.Time{}
		case behind.IsZero():
			*behind = now
		}
	}
	track(&m.selfBehind, m.local.RulesIndex)
	mutual, unheardAlive := false, false
	for _, p := range m.peers {
		if p.live {
			track(&p.behind, p.msg.RulesIndex)
			if a, ok := ackOf(p.msg.Acks, m.cfg.Self); ok && a.Incarnation == m.cfg.Incarnation {
				mutual = true
			}
		} else if m.probedAlive(p, now) {
			unheardAlive = true
		}
		if hold := m.holds(p, now); hold != p.mayHold {
			p.mayHold = hold
			m.version++
		}
	}
	// Deaf: no peer it hears hears it, and a peer it does not hear is
	// alive (a probe says so): it cannot tell what the others decide.
	if deaf := !mutual && unheardAlive; deaf != m.deaf {
		m.deaf = deaf
		m.version++
		if !deaf {
			// Hearing again: listen to everyone first, as after a start,
			// before taking anything.
			m.settled, m.listenFrom = false, now
		}
	}

	if !m.settled && (now.Sub(m.listenFrom) >= m.period(m.cfg.Tolerance) && !m.unheardAlive(now) || m.heardAll()) {
		m.settled = true
		m.inheriting = false // from now on its view says what it may keep
		m.version++
	}
	for _, p := range m.peers {
		// Ask for a probe of a peer silent for T/2 periods, again every
		// T/2 periods while it stays silent. A peer never heard is asked
		// about only by a node that has not settled or that no peer hears:
		// what a probe says of it counts for those alone (settling, deaf,
		// alone in a view), and a node joining a big cluster, registered
		// before it is heard, was probed by every settled member at once
		// (58 TLS handshakes into a starting agent in a 64-node lab).
		suspect := now.Sub(m.lastHeard(p)) >= m.suspectAfter() && !m.kept(p, now) &&
			(p.probeAt.IsZero() || now.Sub(p.probeAt) >= m.suspectAfter()) &&
			(p.msg != nil || !m.settled || !mutual)
		if suspect != p.suspect {
			p.suspect = suspect
			m.version++
		}
	}

	var elig []uint32
	if m.selfEligible(now) {
		elig = append(elig, m.cfg.Self)
	}
	for _, id := range m.ids {
		if m.eligible(m.peers[id], now) {
			elig = append(elig, id)
		}
	}
	slices.Sort(elig)
	elig = m.mutual(elig, now)
	if v := (View{Eligible: elig, RulesIndex: m.local.RulesIndex, Seed: m.local.Seed}); !m.hasView || !v.Equal(m.view) {
		m.adopt(now, v)
	}

	excluded, released := false, true
	for _, p := range m.peers {
		if !p.live {
			continue
		}
		if p.msg.View.Has(m.cfg.Self) {
			// A leaving peer takes nothing again: that it still counts
			// this node does not hold up this node's own stop (a whole
			// cluster stopped at once hands off at once).
			if !p.msg.Leaving {
				released = false
			}
		} else if m.view.Has(m.cfg.Self) && p.msg.Settled && m.heardBy(p) {
			excluded = true
		}
	}
	if excluded != m.excluded || released != m.released {
		m.excluded, m.released = excluded, released
		m.version++
	}
	if excluded && !m.acceptEmpty {
		var zero S
		m.accept, m.acceptEmpty, m.acquired = zero, true, false
		m.version++
	}

	converged := m.isConverged(now)
	if converged {
		clear(m.dropped) // they all know, or had time to
	}
	if converged != m.converged {
		m.converged = converged
		m.version++
	}
	if converged && !excluded && !m.acquired {
		if !m.curValid {
			m.cur, m.curValid = m.owned(m.view), true
		}
		m.accept, m.acceptEmpty, m.acquired = m.cur, false, true
		m.version++
	}
	m.switchTiming(now)
	m.derived, m.due = m.version, m.deadline()
}

// heardBy reports whether p's view is held against this node: p hears it
// (acknowledges this incarnation), or p hears nobody at all (it may be deaf,
// and yielding to it is what keeps two owners apart when no probe says so).
func (m *Machine[S]) heardBy(p *peer) bool {
	if len(p.msg.Acks) == 0 {
		return true
	}
	a, ok := ackOf(p.msg.Acks, m.cfg.Self)
	return ok && a.Incarnation == m.cfg.Incarnation
}

// adopt makes v the view and releases at once every bucket v does not give
// this node. Nothing is acquired here. owned(v) is computed only when there
// is something to release; otherwise it waits for convergence, so a burst
// of views (a cluster starting) costs nothing.
func (m *Machine[S]) adopt(now time.Time, v View) {
	if m.hasView {
		for _, id := range m.view.Eligible {
			if _, ok := m.dropped[id]; id != m.cfg.Self && !v.Has(id) && !ok {
				m.dropped[id] = now
			}
		}
	}
	for id := range m.dropped {
		if v.Has(id) {
			delete(m.dropped, id)
		}
	}
	m.hasView, m.view, m.adopted, m.viewSeq = true, v, now, m.seq+1
	var zero S
	m.cur, m.curValid = zero, false
	switch {
	case !v.Has(m.cfg.Self) && m.inheriting:
		// Still listening after a restart: the peers keep the previous
		// incarnation's buckets for it (see Inherit).
		m.curValid = true
	case !v.Has(m.cfg.Self):
		// Not eligible: this node owns nothing in v.
		m.curValid = true
		m.accept, m.acceptEmpty = zero, true
	case !m.acceptEmpty:
		m.cur, m.curValid = m.owned(v), true
		m.accept = m.intersect(m.accept, m.cur)
	}
	m.acquired, m.sentInView = false, 0
	for _, p := range m.peers {
		p.acked, p.agrees = false, false
	}
	// Announce the new view now.
	m.sendSoon(now)
	m.version++
}

// holdFor is how long acquisition waits after node id left the view or
// was seen claiming buckets without hearing this node: 0 when it knows
// (it advertises a view without itself: leaving, stopped, unhealthy,
// lagging) or a probe found it gone; deathHold hold periods (see
// deathHold) when it still hears,
// within the last two periods, a member that hears it (it learns from that
// member's next heartbeat that it must yield); else T+1 periods, by which
// it has found itself alone or deaf (see Status.Deaf).
func (m *Machine[S]) holdFor(id uint32, now time.Time) time.Duration {
	p := m.peers[id]
	switch {
	case p == nil:
		return 0 // removed from the registry
	case p.live && !p.msg.View.Has(id):
		return 0
	case !p.live && m.probedDead(p, now):
		return 0
	case !p.live:
		return m.deathHoldLength(now)
	}
	for _, a := range p.msg.Acks {
		if a.Age > 1 {
			continue
		}
		if a.Node == m.cfg.Self && a.Incarnation == m.cfg.Incarnation {
			return m.deathHoldLength(now)
		}
		if k := m.peers[a.Node]; k != nil && k.live && a.Incarnation == k.msg.Incarnation && m.view.Has(a.Node) {
			if b, ok := ackOf(k.msg.Acks, id); ok && b.Incarnation == p.msg.Incarnation {
				return m.deathHoldLength(now)
			}
		}
	}
	return m.period(m.cfg.Tolerance + 1)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// unheardAlive reports whether a probe found alive a peer not heard since
// listening began: settling waits for it (it may be accepting).
func (m *Machine[S]) unheardAlive(now time.Time) bool {
	for _, p := range m.peers {
		if m.probedAlive(p, now) && (p.msg == nil || p.lastHeard.Before(m.listenFrom)) {
			return true
		}
	}
	return false
}

func (m *Machine[S]) heardAll() bool {
	if !m.peersKnown {
		return false
	}
	for _, id := range m.ids {
		p := m.peers[id]
		if p.msg == nil || p.lastHeard.Before(m.listenFrom) {
			return false
		}
		if a, ok := ackOf(p.msg.Acks, m.cfg.Self); !ok || a.Incarnation != m.cfg.Incarnation {
			// A node settles early only once every peer hears it: its
			// first view would otherwise leave out a peer that has not
			// heard it yet (views hold mutually hearing nodes), and that
			// peer, hearing it, would yield all it holds until the next
			// round trip: a joining node blackholed every other node's
			// new connections for that long.
			return false
		}
	}
	return true
}

// isConverged: this node has sent a heartbeat of its view; every other
// member of the view advertises it, acknowledging one of those; every other
// live peer acknowledges one too (it knows this node's state: were it about
// to become eligible, this node's view would change), unless it is settled
// and does not hear this node at all; no live peer still keeps buckets it
// gave up (Message.Keeping); and no hold for a dropped node runs.
func (m *Machine[S]) isConverged(now time.Time) bool {
	if !m.settled || m.sentInView < 1 {
		return false
	}
	for _, p := range m.peers {
		if p.live && p.msg != nil && p.msg.Keeping {
			return false
		}
	}
	for id, at := range m.dropped {
		if now.Before(at.Add(m.holdFor(id, now))) {
			return false
		}
	}
	if len(m.view.Eligible) == 1 {
		// Alone in its view: not while a probe says a peer it does not
		// hear is alive (this node is cut off from it, and nobody else
		// vouches for the view).
		for _, p := range m.peers {
			if !p.live && m.probedAlive(p, now) {
				return false
			}
		}
	}
	for _, id := range m.view.Eligible {
		if id == m.cfg.Self {
			continue
		}
		if p := m.peers[id]; p == nil || !p.agrees {
			return false
		}
	}
	for _, p := range m.peers {
		if !p.live || p.acked || m.view.Has(p.msg.Node) {
			continue
		}
		switch {
		case p.msg.Leaving:
			// It takes nothing again in this incarnation.
		case !p.msg.Settled && !p.msg.Deaf:
			return false // it will hear this node, or settle
		case !p.claimSince.IsZero():
			// It cannot acknowledge; give it the hold to learn that it
			// must yield, from the members that hear it.
			if now.Before(m.claimHold(p)) {
				return false
			}
		default:
			if a, ok := ackOf(p.msg.Acks, m.cfg.Self); ok && a.Incarnation == m.cfg.Incarnation {
				return false // it hears this node: its acknowledgement comes
			}
		}
	}
	return true
}

// claimHold is when a claiming peer's hold ends for the current view.
func (m *Machine[S]) claimHold(p *peer) time.Time {
	return later(m.adopted, p.claimSince).Add(m.holdFor(p.msg.Node, m.now))
}

// Suspects returns the peers to probe now (see Status.Suspects).
func (m *Machine[S]) Suspects() []uint32 {
	var out []uint32
	for _, id := range m.ids {
		if m.peers[id].suspect {
			out = append(out, id)
		}
	}
	return out
}

// Status returns the current output. Accept is shared, not copied.
func (m *Machine[S]) Status() Status[S] {
	st := Status[S]{
		Version: m.version, Incarnation: m.cfg.Incarnation,
		View: m.view, AdoptedAt: m.adopted, Converged: m.converged, Excluded: m.excluded,
		Settled: m.settled && !m.deaf, Deaf: m.deaf, Lagging: m.lagging(m.selfBehind, m.now), NewestRules: m.newest,
		Released: m.released, Accept: m.accept, Deaths: m.deaths, Stalls: m.stalls, Suspects: m.Suspects(),
		Inheriting: m.inheriting, RestartAcked: m.RestartAcked(),
		Period: m.cfg.Period, Tolerance: m.cfg.Tolerance,
	}
	for _, id := range m.ids {
		p := m.peers[id]
		ps := PeerStatus{ID: id, Eligible: m.view.Has(id), Suspect: p.suspect, MayHold: p.mayHold}
		if p.restartMsg != nil {
			ps.Restarting, ps.RestartUntil = true, p.restartUntil
		}
		if p.msg != nil {
			ps.Live, ps.LastHeard, ps.Lagging = p.live, p.lastHeard, m.lagging(p.behind, m.now)
			ps.Incarnation, ps.Settled, ps.Leaving, ps.Admin, ps.Healthy = p.msg.Incarnation, p.msg.Settled, p.msg.Leaving, p.msg.Admin, p.msg.Healthy
			ps.RulesIndex, ps.View, ps.Draining, ps.Counters = p.msg.RulesIndex, p.msg.View, p.msg.Draining, p.msg.Counters
			if a, ok := ackOf(p.msg.Acks, m.cfg.Self); ok && a.Incarnation == m.cfg.Incarnation {
				ps.Hears = true
			}
		}
		st.Peers = append(st.Peers, ps)
	}
	return st
}

// Inheriting is Status().Inheriting without building the whole Status.
func (m *Machine[S]) Inheriting() bool { return m.inheriting }

// RestartAcked is Status().RestartAcked without building the whole Status.
func (m *Machine[S]) RestartAcked() bool {
	if m.restartSeq == 0 {
		return false
	}
	for _, id := range m.ids {
		p := m.peers[id]
		if !p.live {
			continue
		}
		if a, ok := ackOf(p.msg.Acks, m.cfg.Self); !ok || a.Incarnation != m.cfg.Incarnation || a.Seq < m.restartSeq {
			return false
		}
	}
	return true
}

// Version is Status().Version without building the whole Status.
func (m *Machine[S]) Version() uint64 { return m.version }

// Accept is Status().Accept without building the whole Status.
func (m *Machine[S]) Accept() S { return m.accept }

// View is Status().View without building the whole Status.
func (m *Machine[S]) View() View { return m.view }
