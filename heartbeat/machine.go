package heartbeat

import (
	"fmt"
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
}

// PeerStatus is what this node knows of one registered peer.
type PeerStatus struct {
	ID          uint32
	Live        bool // a valid heartbeat arrived within the last T periods
	Eligible    bool // in this node's view
	Lagging     bool // rules index behind the newest seen for longer than the grace
	LastHeard   time.Time
	Incarnation uint64
	Settled     bool
	Admin       AdminState
	Healthy     bool
	RulesIndex  uint64
	View        View // the view the peer advertises
	Draining    Buckets
	Counters    Counters
}

// Status is the Machine's output: everything the agent acts on.
type Status[S any] struct {
	// Version grows whenever anything below that the agent acts on changes
	// (view, convergence, accepting set, peers' liveness, admin state,
	// health, rules index or draining buckets); comparing it is enough to
	// know whether to reconcile.
	Version     uint64
	Incarnation uint64
	View        View
	AdoptedAt   time.Time // when this node adopted View
	Converged   bool      // every member advertised View for K periods since it was adopted
	Excluded    bool      // a live peer's view leaves this eligible node out: Accept is empty
	Settled     bool      // done listening after start
	Lagging     bool      // this node's rules index lags the newest seen past the grace
	NewestRules uint64    // the newest rules index seen, here or at a live peer
	// Accept is the accepting set: the buckets where this node takes new
	// connections. It is shared with the Machine and must not be modified.
	Accept        S
	Peers         []PeerStatus // every registered peer, sorted by id
	PeersDraining Buckets      // union of the live peers' draining buckets
	Deaths        uint64       // times a live peer was declared dead, since start
}

type peer struct {
	msg       *Message // the last accepted heartbeat; nil until one arrives
	lastHeard time.Time
	live      bool
	behind    time.Time // since when its rules index lags the newest; zero if not
	match     int       // consecutive heartbeats advertising our view, counted per DESIGN.md
}

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
	local      Local
	registry   map[uint32]bool
	peersKnown bool // SetPeers was called
	peers      map[uint32]*peer
	settled    bool
	selfBehind time.Time
	newest     uint64

	hasView     bool
	view        View
	adopted     time.Time
	cur         S    // owned(view), once curValid
	curValid    bool // cur has been computed for view
	accept      S
	acceptEmpty bool // accept is the zero S
	acquired    bool // accept = cur, taken on convergence
	converged   bool
	excluded    bool
	sentInView  int

	seq      uint64
	lastSent time.Time
	nextSend time.Time

	now     time.Time // the latest time given
	version uint64
	deaths  uint64
}

// NewMachine returns the Machine of a node that starts at now, with an empty
// accepting set. Call SetPeers and SetLocal next: until SetPeers the node
// cannot settle early, and the zero Local is unhealthy, so not eligible.
// Zero fields of cfg take their defaults.
func NewMachine[S any](cfg Config, now time.Time, owned func(View) S, intersect func(a, b S) S) (*Machine[S], error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("heartbeat config: %w", err)
	}
	if cfg.Incarnation == 0 {
		cfg.Incarnation = uint64(now.UnixNano())
	}
	m := &Machine[S]{
		cfg: cfg, owned: owned, intersect: intersect,
		start: now, registry: map[uint32]bool{}, peers: map[uint32]*peer{},
		acceptEmpty: true, nextSend: now,
	}
	m.recompute(now)
	return m, nil
}

// Config returns the settings in use, defaults filled in.
func (m *Machine[S]) Config() Config { return m.cfg }

func (m *Machine[S]) period(n int) time.Duration { return time.Duration(n) * m.cfg.Period }

// Receive takes one decoded, authenticated heartbeat. It returns an error
// wrapping ErrSelf, ErrUnknownNode, ErrForeignCluster or ErrStale when the
// heartbeat is dropped.
func (m *Machine[S]) Receive(now time.Time, msg *Message) error {
	switch {
	case msg.ClusterID != m.cfg.ClusterID:
		return fmt.Errorf("%w: cluster id %d", ErrForeignCluster, msg.ClusterID)
	case msg.Node == m.cfg.Self:
		// Our own heartbeat looped back, or another node uses our id.
		return fmt.Errorf("%w: node %d incarnation %d", ErrSelf, msg.Node, msg.Incarnation)
	case !m.registry[msg.Node]:
		return fmt.Errorf("%w: node %d", ErrUnknownNode, msg.Node)
	}
	p := m.peers[msg.Node]
	if p == nil {
		p = &peer{}
		m.peers[msg.Node] = p
	}
	changed := p.msg == nil || !p.live
	if old := p.msg; old != nil {
		switch {
		case msg.Incarnation == old.Incarnation && msg.Seq <= old.Seq:
			return fmt.Errorf("%w: node %d sequence %d, last %d", ErrStale, msg.Node, msg.Seq, old.Seq)
		case msg.Incarnation < old.Incarnation && p.live:
			// Incarnations grow across restarts; an older one while the
			// newer is live is a replay. Once the newer is dead, any
			// incarnation is taken as a restart (a clock set back).
			return fmt.Errorf("%w: node %d incarnation %d, live one is %d", ErrStale, msg.Node, msg.Incarnation, old.Incarnation)
		case msg.Incarnation != old.Incarnation:
			// A restarted peer is a fresh member: nothing it said before counts.
			p.match, p.behind, changed = 0, time.Time{}, true
		case msg.Admin != old.Admin || msg.Healthy != old.Healthy || msg.Settled != old.Settled ||
			msg.RulesIndex != old.RulesIndex || !msg.View.Equal(old.View) || !msg.Draining.Equal(old.Draining):
			changed = true
		}
	}
	p.msg, p.lastHeard, p.live = msg, now, true
	if m.hasView && msg.View.Equal(m.view) {
		// Only a heartbeat received a period after we adopted the view
		// was surely sent after it (one-way delay < P), so only those count.
		if now.Sub(m.adopted) >= m.cfg.Period {
			p.match++
		}
	} else {
		p.match = 0
	}
	if changed {
		m.version++
	} else if m.converged {
		// The steady state: a live peer repeats itself and nothing that
		// recompute derives can change (deadlines are Tick's).
		m.now = now
		return nil
	}
	m.recompute(now)
	return nil
}

// Tick lets time pass: peers silent for more than T periods die, and
// deadlines (settling, rules lag, convergence) are checked. Call it at
// Wake() at the latest.
func (m *Machine[S]) Tick(now time.Time) {
	for _, p := range m.peers {
		if p.live && now.Sub(p.lastHeard) > m.period(m.cfg.Tolerance) {
			p.live, p.match, p.behind = false, 0, time.Time{}
			m.deaths++
			m.version++
		}
	}
	m.recompute(now)
}

// SetLocal sets what this node advertises about itself. l.Draining is kept,
// not copied.
func (m *Machine[S]) SetLocal(now time.Time, l Local) {
	old := m.local
	m.local = l
	if old.Admin != l.Admin || old.Healthy != l.Healthy || old.RulesIndex != l.RulesIndex || old.Seed != l.Seed {
		m.version++
	}
	m.recompute(now)
}

// SetPeers sets the node registry: only these nodes' heartbeats count, and
// these are the nodes this one must hear before it settles. Self and 0 are
// ignored.
func (m *Machine[S]) SetPeers(now time.Time, ids []uint32) {
	reg := make(map[uint32]bool, len(ids))
	for _, id := range ids {
		if id != 0 && id != m.cfg.Self {
			reg[id] = true
		}
	}
	for id := range m.peers {
		if !reg[id] {
			delete(m.peers, id)
			m.version++
		}
	}
	if len(reg) != len(m.registry) {
		m.version++
	}
	m.registry, m.peersKnown = reg, true
	m.recompute(now)
}

// Outgoing returns the heartbeat to send now, to every registered peer, and
// schedules the next one a period later. Call it at NextSend().
func (m *Machine[S]) Outgoing(now time.Time) *Message {
	m.seq++
	msg := &Message{
		ClusterID: m.cfg.ClusterID, Node: m.cfg.Self, Incarnation: m.cfg.Incarnation, Seq: m.seq,
		Admin: m.local.Admin, Healthy: m.local.Healthy, Settled: m.settled,
		RulesIndex: m.local.RulesIndex, View: m.view, Draining: m.local.Draining, Counters: m.local.Counters,
	}
	m.sentInView++
	m.lastSent, m.nextSend = now, now.Add(m.cfg.Period)
	m.recompute(now)
	return msg
}

// NextSend is when the next heartbeat is due: a period after the last, or
// sooner after a view change, so that peers learn the new view at once.
func (m *Machine[S]) NextSend() time.Time { return m.nextSend }

// Wake returns the latest time at which Tick (or Outgoing, when NextSend is
// due) must next be called for the Machine to act on time: the next
// heartbeat, the next possible death, the end of a lag grace, of settling or
// of the convergence wait.
func (m *Machine[S]) Wake() time.Time {
	w := m.nextSend
	earliest := func(t time.Time) {
		// Deadlines already passed were acted on by the last recompute.
		if t.After(m.now) && t.Before(w) {
			w = t
		}
	}
	for _, p := range m.peers {
		if p.live {
			earliest(p.lastHeard.Add(m.period(m.cfg.Tolerance) + 1))
			if !p.behind.IsZero() {
				earliest(p.behind.Add(m.period(m.cfg.LagGrace) + 1))
			}
		}
	}
	if !m.selfBehind.IsZero() {
		earliest(m.selfBehind.Add(m.period(m.cfg.LagGrace) + 1))
	}
	if !m.settled {
		earliest(m.start.Add(m.period(m.cfg.Tolerance)))
	}
	if !m.converged {
		earliest(m.adopted.Add(m.period(m.cfg.Converge)))
	}
	return w
}

func (m *Machine[S]) lagging(behind, now time.Time) bool {
	return !behind.IsZero() && now.Sub(behind) > m.period(m.cfg.LagGrace)
}

func (m *Machine[S]) eligible(p *peer, now time.Time) bool {
	return p.live && p.msg.Settled && p.msg.Admin == Started && p.msg.Healthy && !m.lagging(p.behind, now)
}

func (m *Machine[S]) selfEligible(now time.Time) bool {
	return m.settled && m.local.Admin == Started && m.local.Healthy && !m.lagging(m.selfBehind, now)
}

// recompute derives everything from the inputs: lag, settling, the view
// (release at once on a change), exclusion (yield) and convergence
// (acquire).
func (m *Machine[S]) recompute(now time.Time) {
	m.now = now
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
	for _, p := range m.peers {
		if p.live {
			track(&p.behind, p.msg.RulesIndex)
		}
	}

	if !m.settled && (now.Sub(m.start) >= m.period(m.cfg.Tolerance) || m.heardAll()) {
		m.settled = true
		m.version++
	}

	var elig []uint32
	if m.selfEligible(now) {
		elig = append(elig, m.cfg.Self)
	}
	for id, p := range m.peers {
		if m.eligible(p, now) {
			elig = append(elig, id)
		}
	}
	slices.Sort(elig)
	if v := (View{Eligible: elig, RulesIndex: m.local.RulesIndex, Seed: m.local.Seed}); !m.hasView || !v.Equal(m.view) {
		m.adopt(now, v)
	}

	excluded := false
	if m.view.Has(m.cfg.Self) {
		for _, p := range m.peers {
			if p.live && p.msg.Settled && !p.msg.View.Has(m.cfg.Self) {
				excluded = true
				break
			}
		}
	}
	if excluded != m.excluded {
		m.excluded = excluded
		m.version++
	}
	if excluded && !m.acceptEmpty {
		var zero S
		m.accept, m.acceptEmpty, m.acquired = zero, true, false
		m.version++
	}

	converged := m.isConverged(now)
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
}

// adopt makes v the view and releases at once every bucket v does not give
// this node. Nothing is acquired here. owned(v) is computed only when there
// is something to release; otherwise it waits for convergence, so a burst
// of views (a cluster starting) costs nothing.
func (m *Machine[S]) adopt(now time.Time, v View) {
	m.hasView, m.view, m.adopted = true, v, now
	var zero S
	m.cur, m.curValid = zero, false
	switch {
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
		p.match = 0
	}
	// Announce the new view now, but at most four heartbeats a period
	// when views change in a burst (a cluster starting).
	m.nextSend = now
	if next := m.lastSent.Add(m.cfg.Period / 4); !m.lastSent.IsZero() && next.After(now) {
		m.nextSend = next
	}
	m.version++
}

func (m *Machine[S]) heardAll() bool {
	if !m.peersKnown {
		return false
	}
	for id := range m.registry {
		if p := m.peers[id]; p == nil || p.msg == nil {
			return false
		}
	}
	return true
}

// isConverged: every member of the view, this node included, has advertised
// it for K periods since this node adopted it.
func (m *Machine[S]) isConverged(now time.Time) bool {
	k := m.cfg.Converge
	if !m.settled || m.sentInView < k || now.Sub(m.adopted) < m.period(k) {
		return false
	}
	for _, id := range m.view.Eligible {
		if id == m.cfg.Self {
			continue
		}
		if p := m.peers[id]; p == nil || p.match < k {
			return false
		}
	}
	return true
}

// Status returns the current output. Accept is shared, not copied.
func (m *Machine[S]) Status() Status[S] {
	st := Status[S]{
		Version: m.version, Incarnation: m.cfg.Incarnation,
		View: m.view, AdoptedAt: m.adopted, Converged: m.converged, Excluded: m.excluded,
		Settled: m.settled, Lagging: m.lagging(m.selfBehind, m.now), NewestRules: m.newest,
		Accept: m.accept, Deaths: m.deaths,
	}
	var draining []Buckets
	ids := make([]uint32, 0, len(m.registry))
	for id := range m.registry {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		ps := PeerStatus{ID: id, Eligible: m.view.Has(id)}
		if p := m.peers[id]; p != nil && p.msg != nil {
			ps.Live, ps.LastHeard, ps.Lagging = p.live, p.lastHeard, m.lagging(p.behind, m.now)
			ps.Incarnation, ps.Settled, ps.Admin, ps.Healthy = p.msg.Incarnation, p.msg.Settled, p.msg.Admin, p.msg.Healthy
			ps.RulesIndex, ps.View, ps.Draining, ps.Counters = p.msg.RulesIndex, p.msg.View, p.msg.Draining, p.msg.Counters
			if p.live {
				draining = append(draining, p.msg.Draining)
			}
		}
		st.Peers = append(st.Peers, ps)
	}
	st.PeersDraining = Union(draining...)
	return st
}

// Version is Status().Version without building the whole Status.
func (m *Machine[S]) Version() uint64 { return m.version }

// Accept is Status().Accept without building the whole Status.
func (m *Machine[S]) Accept() S { return m.accept }

// View is Status().View without building the whole Status.
func (m *Machine[S]) View() View { return m.view }
