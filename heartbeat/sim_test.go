package heartbeat

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoalnet/shoal/filter"
)

// This file is a deterministic cluster simulator: N nodes running the real
// Machine and the real filter.Assign, a virtual clock, and a network with
// per-link loss, delay, jitter, full and one-way partitions.

var simEpoch = time.Unix(1_000_000_000, 0)

var simKey = []byte("0123456789abcdef0123456789abcdef")

var simRing = mustKeyring(simKey)

// otherRing holds another key: its heartbeats are not accepted under simRing.
var otherRing = mustKeyring([]byte("fedcba9876543210fedcba9876543210"))

func mustKeyring(key []byte) *Keyring {
	k, err := NewKeyring(key)
	if err != nil {
		panic(err)
	}
	return k
}

// simConfig is a filter config with n nodes and two multiple-host rules
// (plus the implicit default rule).
func simConfig(n int) *filter.Config {
	c := &filter.Config{Seed: 0x5eed, VIPs: []netip.Addr{netip.MustParseAddr("198.18.0.100")}}
	c.Rules = []filter.Rule{
		{ID: 1, PortLo: 80, PortHi: 80, Proto: filter.ProtoTCP, Mode: filter.ModeMultiple, Affinity: filter.AffinityNone},
		{ID: 2, PortLo: 443, PortHi: 443, Proto: filter.ProtoTCP, Mode: filter.ModeMultiple, Affinity: filter.AffinitySingle},
	}
	for i := range n {
		c.Nodes = append(c.Nodes, filter.Node{ID: filter.NodeID(i + 1), HostPriority: i + 1})
	}
	return c
}

// assignCache memoises filter.Assign per (cluster size, eligible set): every
// node of every run with the same view shares one table.
var assignCache sync.Map

func assignFor(c *filter.Config, v View) *filter.Owners {
	var sb strings.Builder
	fmt.Fprint(&sb, len(c.Nodes), ":", v.Seed, ":")
	for _, id := range v.Eligible {
		fmt.Fprint(&sb, id, ",")
	}
	key := sb.String()
	if o, ok := assignCache.Load(key); ok {
		return o.(*filter.Owners)
	}
	ids := make([]filter.NodeID, len(v.Eligible))
	for i, id := range v.Eligible {
		ids[i] = filter.NodeID(id)
	}
	o := filter.Assign(c, ids)
	assignCache.Store(key, o)
	return o
}

func ownedFunc(c *filter.Config, me uint32) func(View) filter.Set {
	return func(v View) filter.Set { return assignFor(c, v).Owned(filter.NodeID(me)) }
}

func intersectSets(a, b filter.Set) filter.Set { return a.Intersect(b) }

func overlaps(a, b filter.Set) bool {
	for id, m := range a {
		if o := b[id]; o != nil {
			for i := range m {
				if m[i]&o[i] != 0 {
					return true
				}
			}
		}
	}
	return false
}

type simEventKind uint8

const (
	evWake simEventKind = iota
	evDeliver
	evFunc
)

type simEvent struct {
	at   time.Time
	seq  int
	kind simEventKind
	node int // wake: node; deliver: receiver
	from int
	msg  *Message
	wire []byte
	fn   func()
}

type eventQueue []*simEvent

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*simEvent)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type simLink struct {
	loss   float64
	delay  time.Duration
	jitter time.Duration
	cut    bool
	cuts   int // faults currently cutting the link; cut = cuts > 0
}

type simNode struct {
	id         uint32
	m          *Machine[filter.Set]
	up         bool
	wakeAt     time.Time
	accept     filter.Set
	boots      int
	deaths     uint64 // peers declared dead, summed over this node's machines
	excludedAt time.Time
	sentView   View
	viewSeq    uint64 // sequence of the first heartbeat sent with sentView
	// stalledUntil: the agent is stopped (SIGSTOP) until then: it handles
	// nothing, heartbeats wait in its socket, probes of it time out.
	stalledUntil time.Time
}

// accepting is what n's data plane takes new connections in: its machine's
// accepting set, or nothing once its lease has ended (the agent renews the
// lease with every heartbeat it sends; a stalled one sends none).
func (s *sim) accepting(n *simNode) filter.Set {
	if n.m != nil && !n.m.lastSent.IsZero() && s.now.Sub(n.m.lastSent) > n.m.LeaseLength(s.now) {
		return nil
	}
	return n.accept
}

// violation is two nodes, not cut off from each other, accepting new
// connections in one bucket at the same instant.
type violation struct {
	at   time.Duration
	a, b uint32
	why  violationCause
}

// violationCause says why b still accepted buckets that a, whose view
// leaves b out, has taken (b yields on the first heartbeat of that view).
type violationCause uint8

const (
	// causeUnexplained: b had received a heartbeat of a's view. A bug.
	causeUnexplained violationCause = iota
	// causeLost: every heartbeat a sent b since adopting the view was
	// lost. DESIGN.md accepts this.
	causeLost
	// causeDelayed: some were sent and not lost, but none has arrived yet:
	// the one-way delay exceeded what the timing argument assumes.
	causeDelayed
)

type sim struct {
	t        testing.TB
	cfg      Config
	fcfg     *filter.Config
	rng      *rand.Rand
	now      time.Time
	seq      int
	q        eventQueue
	nodes    []*simNode
	links    [][]simLink // [from][to]
	codec    bool
	healWait [][]bool // [from][to]: to has not heard from hear it since a full cut between them ended
	healAt   [][]seen // [to][from]: to's incarnation and sequence when that cut ended
	// scheduled [from][to] is the last sequence from sent to to that was
	// not dropped (it arrived or is in flight).
	scheduled [][]uint64
	viol      []violation
	maxDelay  time.Duration // largest one-way delay drawn
	trace     func(string)
	// Probes: the second channel (a TCP connection to the peer API). It
	// works unless the node is down or a cable fault cuts the pair
	// (probeCuts); heartbeat-only faults leave it alone. noProbes turns
	// probing off, as for an agent that does not probe.
	noProbes  bool
	probeCuts [][]int
	probing   [][]bool // [i][j]: i's probe of j is in flight
	// onAccept, when set, is called after a node's accepting set changes.
	onAccept func(n *simNode)
}

func newSim(t testing.TB, n int, cfg Config, seed uint64) *sim {
	s := &sim{t: t, cfg: cfg.WithDefaults(), fcfg: simConfig(n), rng: rand.New(rand.NewPCG(seed, 0x5eed)), now: simEpoch, codec: n <= 8}
	s.links = make([][]simLink, n)
	s.healWait = make([][]bool, n)
	s.healAt = make([][]seen, n)
	s.scheduled = make([][]uint64, n)
	s.probeCuts = make([][]int, n)
	s.probing = make([][]bool, n)
	for i := range n {
		s.probeCuts[i] = make([]int, n)
		s.probing[i] = make([]bool, n)
		s.scheduled[i] = make([]uint64, n)
		s.links[i] = make([]simLink, n)
		s.healWait[i] = make([]bool, n)
		s.healAt[i] = make([]seen, n)
		for j := range n {
			s.links[i][j] = simLink{delay: 100 * time.Microsecond, jitter: 50 * time.Microsecond}
		}
		s.nodes = append(s.nodes, &simNode{id: uint32(i + 1)})
	}
	return s
}

func (s *sim) elapsed() time.Duration { return s.now.Sub(simEpoch) }

func (s *sim) push(e *simEvent) {
	s.seq++
	e.seq = s.seq
	heap.Push(&s.q, e)
}

// at runs fn at simulated time simEpoch+d.
func (s *sim) at(d time.Duration, fn func()) {
	s.push(&simEvent{at: simEpoch.Add(d), kind: evFunc, fn: fn})
}

// addr is node i's heartbeat address.
func (s *sim) addr(i int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i + 1)}), 7946)
}

func (s *sim) registry() map[uint32]netip.AddrPort {
	reg := make(map[uint32]netip.AddrPort, len(s.nodes))
	for i := range s.nodes {
		reg[uint32(i+1)] = s.addr(i)
	}
	return reg
}

// boot starts (or restarts) node i with a fresh incarnation.
func (s *sim) boot(i int) {
	n := s.nodes[i]
	n.boots++
	c := s.cfg
	c.Self = n.id
	c.Incarnation = uint64(n.boots) // as LoadIncarnation: one more per start
	m, err := NewMachine(c, s.now, ownedFunc(s.fcfg, n.id), intersectSets)
	if err != nil {
		s.t.Fatal(err)
	}
	// As the agent runs it: the heartbeats delivered at one instant are
	// acted on once, at the tick Wake asks for.
	m.DeferRecompute(!*simImmediate)
	m.SetPeers(s.now, s.registry())
	m.SetLocal(s.now, Local{Admin: Started, Healthy: true, RulesIndex: 7, Seed: s.fcfg.Seed})
	n.m, n.up, n.accept, n.excludedAt = m, true, nil, time.Time{}
	n.wakeAt = time.Time{}
	s.schedule(i)
}

// crash stops node i: it sends and receives nothing more.
func (s *sim) crash(i int) {
	n := s.nodes[i]
	if n.up {
		n.deaths += n.m.Status().Deaths
	}
	n.up, n.m, n.accept = false, nil, nil
}

func (s *sim) schedule(i int) {
	n := s.nodes[i]
	w := n.m.Wake()
	if w.Before(s.now) {
		w = s.now
	}
	if n.wakeAt.IsZero() || w.Before(n.wakeAt) {
		n.wakeAt = w
		s.push(&simEvent{at: w, kind: evWake, node: i})
	}
}

func (s *sim) send(i int, msg *Message) {
	var wire []byte
	if s.codec {
		// On the wire as agents send it once every node decodes it:
		// protocol 3, compact acks, widened by the receiving machine.
		c := *msg
		c.CompactAcks = true
		var err error
		if wire, err = Encode(&c, simRing); err != nil {
			s.t.Fatal(err)
		}
	}
	if n := s.nodes[i]; !msg.View.Equal(n.sentView) || n.viewSeq == 0 {
		n.sentView, n.viewSeq = msg.View, msg.Seq
	}
	for j := range s.nodes {
		if j == i {
			continue
		}
		l := s.links[i][j]
		if l.cut || s.rng.Float64() < l.loss {
			continue
		}
		s.scheduled[i][j] = msg.Seq
		d := l.delay
		if l.jitter > 0 {
			d += time.Duration(s.rng.Int64N(int64(l.jitter)))
		}
		s.maxDelay = max(s.maxDelay, d)
		s.push(&simEvent{at: s.now.Add(d), kind: evDeliver, node: j, from: i, msg: msg, wire: wire})
	}
}

// run processes events up to simulated time simEpoch+until.
func (s *sim) run(until time.Duration) {
	end := simEpoch.Add(until)
	for len(s.q) > 0 && !s.q[0].at.After(end) {
		e := heap.Pop(&s.q).(*simEvent)
		s.now = e.at
		switch e.kind {
		case evFunc:
			e.fn()
		case evWake:
			n := s.nodes[e.node]
			if !n.up || !e.at.Equal(n.wakeAt) {
				continue // stale
			}
			if s.now.Before(n.stalledUntil) {
				// Stalled: it runs again at stalledUntil.
				n.wakeAt = n.stalledUntil
				s.push(&simEvent{at: n.wakeAt, kind: evWake, node: e.node})
				continue
			}
			n.wakeAt = time.Time{}
			n.m.Tick(s.now)
			if !s.now.Before(n.m.NextSend()) {
				s.send(e.node, n.m.Outgoing(s.now))
			}
			s.after(e.node)
		case evDeliver:
			n := s.nodes[e.node]
			if n.up && s.now.Before(n.stalledUntil) && !s.links[e.from][e.node].cut {
				// Waits in its socket until it runs again.
				e.at = n.stalledUntil
				s.push(e)
				continue
			}
			if !n.up || s.links[e.from][e.node].cut {
				continue
			}
			msg := e.msg
			if e.wire != nil {
				var err error
				if msg, err = Decode(e.wire, simRing, s.cfg.ClusterID); err != nil {
					s.t.Fatalf("decode: %v", err)
				}
			}
			err := n.m.Receive(s.now, msg, s.addr(e.from))
			s.after(e.node)
			// A cut heals for a pair once each has heard the other hear it
			// (a heartbeat that acknowledges one sent after the heal):
			// until then both may own.
			if a, ok := ackOf(msg.Acks, n.id); err == nil && s.healWait[e.from][e.node] && ok && a.Incarnation == n.m.cfg.Incarnation &&
				(a.Incarnation != s.healAt[e.node][e.from].inc || a.Seq > s.healAt[e.node][e.from].seq) {
				s.healWait[e.from][e.node] = false
				if !s.healWait[e.node][e.from] {
					s.checkPair(e.node, e.from)
				}
			}
		}
	}
	s.now = end
}

// after checks a node whose state may have changed and schedules its wake.
func (s *sim) after(i int) {
	n := s.nodes[i]
	a := n.m.Accept()
	if reflect.ValueOf(a).UnsafePointer() != reflect.ValueOf(n.accept).UnsafePointer() {
		n.accept = a
		if s.trace != nil {
			st := n.m.Status()
			s.trace(fmt.Sprintf("node %d accept %d view %v conv=%v excl=%v", n.id, a.Count(), st.View.Eligible, st.Converged, st.Excluded))
		}
		if len(a) > 0 {
			for j := range s.nodes {
				s.checkPair(i, j)
			}
		}
		if s.onAccept != nil {
			s.onAccept(n)
		}
	}
	if !s.noProbes {
		for _, id := range n.m.Suspects() {
			s.probe(i, int(id-1))
		}
	}
	s.schedule(i)
}

// probe starts node i's probe of node j: the answer comes a round trip
// later when j is up and reachable, or after a timeout that ends before j
// would die.
func (s *sim) probe(i, j int) {
	if s.probing[i][j] {
		return
	}
	s.probing[i][j] = true
	boots := s.nodes[i].boots
	d := 2*s.links[i][j].delay + 100*time.Microsecond
	alive := s.nodes[j].up && s.probeCuts[i][j] == 0 && !s.now.Before(s.nodes[j].stalledUntil)
	if !alive {
		d = time.Duration(s.cfg.Tolerance/2-1) * s.cfg.Period
	}
	s.push(&simEvent{at: s.now.Add(d), kind: evFunc, fn: func() {
		s.probing[i][j] = false
		n := s.nodes[i]
		if !n.up || n.boots != boots {
			return
		}
		r := ProbeSilent // a crashed host, a cut cable, a stalled agent
		if s.nodes[j].up && s.probeCuts[i][j] == 0 && !s.now.Before(s.nodes[j].stalledUntil) {
			r = ProbeAlive
		}
		n.m.Probe(s.now, uint32(j+1), r)
		s.after(i)
	}})
}

// cutCable cuts (+1) or restores (-1) everything between i and j, both
// ways: heartbeats and probes.
func (s *sim) cutCable(i, j, delta int) {
	if i == j {
		return
	}
	s.cutLink(i, j, delta)
	s.cutLink(j, i, delta)
	s.probeCuts[i][j] += delta
	s.probeCuts[j][i] += delta
}

// position is node i's incarnation and last sequence number sent.
func (s *sim) position(i int) seen {
	if n := s.nodes[i]; n.up {
		return seen{n.m.cfg.Incarnation, n.m.seq}
	}
	return seen{}
}

// cutOff reports whether i and j share no channel at all: a cable cut
// between them (heartbeats and probes), or one that ended before they heard
// each other again (the heal is when both sides may still own the same
// buckets, by design). Heartbeats lost both ways while probes pass do not
// cut a pair off: their data paths work, and two owners there are a bug.
func (s *sim) cutOff(i, j int) bool {
	return s.probeCuts[i][j] > 0 || s.healWait[i][j] || s.healWait[j][i]
}

func (s *sim) checkPair(i, j int) {
	a, b := s.nodes[i], s.nodes[j]
	if i == j || !a.up || !b.up || s.cutOff(i, j) {
		return
	}
	if overlaps(s.accepting(a), s.accepting(b)) {
		if s.trace != nil {
			s.trace(fmt.Sprintf("VIOLATION %d %d", a.id, b.id))
		}
		s.viol = append(s.viol, violation{at: s.elapsed(), a: a.id, b: b.id, why: max(s.cause(a, b), s.cause(b, a))})
	}
}

// cutLink adds (+1) or removes (-1) one fault cutting the link from i to j.
// When a cable cut ends (the link comes back while the other direction is
// up too and the probes' path was cut), j may still accept i's buckets
// until it hears i: the pair counts as cut off until then.
func (s *sim) cutLink(i, j, delta int) {
	if i == j {
		return
	}
	l := &s.links[i][j]
	wasFull := l.cut && s.links[j][i].cut
	l.cuts += delta
	l.cut = l.cuts > 0
	if wasFull && !l.cut && s.probeCuts[i][j] > 0 {
		// A cable cut ends: neither side has heard the other hear it yet.
		s.healWait[i][j], s.healWait[j][i] = true, true
		s.healAt[i][j], s.healAt[j][i] = s.position(i), s.position(j)
	}
	if !wasFull && l.cut && s.links[j][i].cut {
		// A full cut starts: any pending heal is moot.
		s.healWait[i][j], s.healWait[j][i] = false, false
	}
}

// coverage reports whether the up nodes' accepting sets partition every
// bucket of every rule: each bucket accepted by exactly one up node.
func (s *sim) coverage() (ok bool, why string) { return s.coverageWith() }

// coverageWith is coverage with more sets accepting beside the up nodes'
// (a restarting node's pinned data plane).
func (s *sim) coverageWith(more ...filter.Set) (ok bool, why string) {
	for _, rid := range s.fcfg.RuleIDs() {
		var once, twice filter.Bitmap
		sets := slices.Clone(more)
		for _, n := range s.nodes {
			if n.up {
				sets = append(sets, s.accepting(n))
			}
		}
		for _, set := range sets {
			if m := set[rid]; m != nil {
				for i := range m {
					twice[i] |= once[i] & m[i]
					once[i] |= m[i]
				}
			}
		}
		for i := range once {
			if once[i] != ^uint64(0) || twice[i] != 0 {
				return false, fmt.Sprintf("rule %d buckets %d-%d: some have no owner or two", rid, i*64, i*64+63)
			}
		}
	}
	return true, ""
}

// totalDeaths is the number of times any node declared a peer dead.
func (s *sim) totalDeaths() uint64 {
	var d uint64
	for _, n := range s.nodes {
		d += n.deaths
		if n.up {
			d += n.m.Status().Deaths
		}
	}
	return d
}

func (s *sim) setAllLinks(f func(l *simLink)) {
	for i := range s.links {
		for j := range s.links[i] {
			if i != j {
				f(&s.links[i][j])
			}
		}
	}
}

// startAll boots every node at a random phase within the first period and
// returns once the cluster first covers every bucket, or fails.
func (s *sim) startAll(deadline time.Duration) time.Duration {
	for i := range s.nodes {
		s.at(time.Duration(s.rng.Int64N(int64(s.cfg.Period))), func() { s.boot(i) })
	}
	step := s.cfg.Period / 10
	for d := step; d <= deadline; d += step {
		s.run(d)
		if ok, _ := s.coverage(); ok {
			return d
		}
	}
	_, why := s.coverage()
	s.t.Fatalf("cluster of %d never covered every bucket within %v: %s", len(s.nodes), deadline, why)
	return 0
}

// waitCoverage runs until the up nodes cover every bucket exactly once and
// returns the simulated time at which that first held (sampled every P/20).
func (s *sim) waitCoverage(deadline time.Duration) (time.Duration, bool) {
	step := s.cfg.Period / 20
	for d := s.elapsed() + step; d <= deadline; d += step {
		s.run(d)
		if ok, _ := s.coverage(); ok {
			return d, true
		}
	}
	return 0, false
}

func sortedDurations(ds []time.Duration) []time.Duration {
	out := slices.Clone(ds)
	slices.Sort(out)
	return out
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p)
	return sorted[i]
}

// cause classifies an overlap seen from a's side (see violationCause); it
// returns causeUnexplained when a's view does include b.
func (s *sim) cause(a, b *simNode) violationCause {
	v := a.m.View()
	if v.Has(b.id) {
		return causeUnexplained
	}
	if p := b.m.peers[a.id]; p != nil && p.msg != nil && p.msg.Incarnation == a.m.cfg.Incarnation && p.msg.View.Equal(v) {
		return causeUnexplained
	}
	if s.scheduled[a.id-1][b.id-1] >= a.viewSeq {
		return causeDelayed
	}
	return causeLost
}
