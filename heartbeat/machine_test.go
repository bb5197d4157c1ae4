package heartbeat

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const tP = 100 * time.Millisecond

var t0 = time.Unix(1_700_000_000, 0)

func at(periods float64) time.Time { return t0.Add(time.Duration(periods * float64(tP))) }

// harness is one Machine over toySet with a counter of owned() calls. The
// peers' heartbeats it makes acknowledge the machine's last heartbeat and
// every other peer.
type harness struct {
	t     *testing.T
	m     *Machine[toySet]
	self  uint32
	peers []uint32
	owned int
	sent  uint64 // sequence of the machine's last heartbeat
	seqs  map[uint32]uint64
	incs  map[uint32]uint64
	local Local
}

func hAddr(id uint32) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, 0, byte(id)}), 7946)
}

func newHarness(t *testing.T, self uint32, peers ...uint32) *harness {
	return newHarnessWith(t, Config{Period: tP, Tolerance: 6, LagGrace: 10}, self, peers...)
}

// newHarnessWith is newHarness with the timing of cfg (its period,
// tolerance, lag grace and hold period).
func newHarnessWith(t *testing.T, cfg Config, self uint32, peers ...uint32) *harness {
	h := &harness{t: t, self: self, peers: peers, seqs: map[uint32]uint64{}, incs: map[uint32]uint64{}}
	own := toyOwned(self)
	cfg.ClusterID, cfg.Self, cfg.Incarnation = 1, self, 1
	m, err := NewMachine(cfg, t0,
		func(v View) toySet { h.owned++; return own(v) }, toyIntersect)
	if err != nil {
		t.Fatal(err)
	}
	h.m = m
	reg := map[uint32]netip.AddrPort{self: hAddr(self)}
	for _, id := range peers {
		reg[id] = hAddr(id)
	}
	m.SetPeers(t0, reg)
	h.local = Local{Admin: Started, Healthy: true, RulesIndex: 5, Seed: 9}
	m.SetLocal(t0, h.local)
	return h
}

// hb is a heartbeat from peer id advertising view elig, started and
// healthy, hearing the machine and every other peer.
func (h *harness) hb(id uint32, elig ...uint32) *Message {
	h.seqs[id]++
	if h.incs[id] == 0 {
		h.incs[id] = 1
	}
	msg := &Message{ClusterID: 1, Node: id, Incarnation: h.incs[id], Seq: h.seqs[id], Admin: Started, Healthy: true, Settled: true,
		RulesIndex: 5, View: View{Eligible: elig, RulesIndex: 5, Seed: 9}}
	for _, other := range append([]uint32{h.self}, h.peers...) {
		switch {
		case other == id:
		case other == h.self:
			if h.sent > 0 {
				msg.Acks = append(msg.Acks, Ack{Node: other, Incarnation: 1, Seq: h.sent})
			}
		default:
			msg.Acks = append(msg.Acks, Ack{Node: other, Incarnation: max(h.incs[other], 1), Seq: h.seqs[other]})
		}
	}
	slices.SortFunc(msg.Acks, func(a, b Ack) int { return int(a.Node) - int(b.Node) })
	return msg
}

func (h *harness) recv(now time.Time, msg *Message) {
	h.t.Helper()
	if err := h.m.Receive(now, msg, hAddr(msg.Node)); err != nil {
		h.t.Fatalf("Receive(%d seq %d): %v", msg.Node, msg.Seq, err)
	}
}

// step advances to now: ticks, and sends if due.
func (h *harness) step(now time.Time) {
	h.m.Tick(now)
	if !now.Before(h.m.NextSend()) {
		h.sent = h.m.Outgoing(now).Seq
	}
}

// runTo steps at every heartbeat due before now, then at now: a node that
// keeps sending, as a running one does (one that sends nothing for longer
// than its lease has stalled, see checkStall).
func (h *harness) runTo(now time.Time) {
	for next := h.m.NextSend(); next.Before(now); next = h.m.NextSend() {
		h.step(next)
	}
	h.step(now)
}

// converge2 brings node 1 with peer 2 to a converged view {1,2}: returns the time.
func converge2(h *harness) time.Time {
	now := at(0)
	for i := 0; i < 3; i++ {
		now = at(float64(i))
		h.recv(now.Add(time.Millisecond), h.hb(2, 1, 2))
		h.step(now.Add(2 * time.Millisecond))
	}
	return now
}

func TestConvergeAndAcquire(t *testing.T) {
	h := newHarness(t, 1, 2)
	if st := h.m.Status(); toyCount(st.Accept) != 0 || st.Converged {
		t.Fatalf("at start: accept %d converged %v, want empty and not converged", toyCount(st.Accept), st.Converged)
	}
	now := converge2(h)
	st := h.m.Status()
	if !st.Converged || !slices.Equal(st.View.Eligible, []uint32{1, 2}) || toyCount(st.Accept) != 8 {
		t.Fatalf("after 3 periods: view %v converged %v accept %d, want {1,2} converged 8", st.View.Eligible, st.Converged, toyCount(st.Accept))
	}
	calls := h.owned
	for i := 1; i <= 20; i++ {
		h.recv(now.Add(time.Duration(i)*tP), h.hb(2, 1, 2))
		h.step(now.Add(time.Duration(i)*tP + time.Millisecond))
	}
	if h.owned != calls {
		t.Errorf("owned() called %d times in 20 stable periods, want 0", h.owned-calls)
	}
}

// TestConvergesOnAcknowledgement: a member's advertisement of the view
// counts only once it acknowledges a heartbeat sent after adoption; then
// acquisition is immediate, no periods are waited.
func TestConvergesOnAcknowledgement(t *testing.T) {
	h := newHarness(t, 1, 2)
	h.recv(at(0.1), h.hb(2, 1, 2)) // peer 2 does not hear us yet: not settled
	if st := h.m.Status(); st.Converged || st.Settled || st.View.Has(1) {
		t.Fatalf("peer not hearing us: settled %v converged %v view %v; want neither, without this node", st.Settled, st.Converged, st.View.Eligible)
	}
	h.step(at(0.2))
	h.recv(at(0.21), h.hb(2, 1, 2)) // hears us now: view {1,2}, acknowledging nothing sent in it
	if st := h.m.Status(); st.Converged || !st.View.Has(2) || h.m.NextSend().After(at(0.21)) {
		t.Fatalf("converged %v view %v next send %v; want false, {1,2}, at once", st.Converged, st.View.Eligible, h.m.NextSend())
	}
	h.step(at(0.22))
	h.recv(at(0.23), h.hb(2, 2)) // acknowledges, but advertises another view
	if st := h.m.Status(); st.Converged || !st.Excluded {
		t.Fatalf("peer hears us and leaves us out: converged %v excluded %v, want false true", st.Converged, st.Excluded)
	}
	h.recv(at(0.24), h.hb(2, 1, 2))
	if st := h.m.Status(); !st.Converged || toyCount(st.Accept) != 8 {
		t.Fatalf("acknowledged: converged %v accept %d, want true 8", st.Converged, toyCount(st.Accept))
	}
}

// TestNoConvergenceWhileAPeerKeeps: a peer that advertises the view but
// still keeps taking SYNs in buckets it gave up (Keeping) holds back
// convergence, and so acquisition, until a heartbeat says it let them go.
func TestNoConvergenceWhileAPeerKeeps(t *testing.T) {
	h := newHarness(t, 1, 2)
	h.recv(at(0.1), h.hb(2, 1, 2))
	h.step(at(0.2))
	keeping := h.hb(2, 1, 2)
	keeping.Keeping = true
	h.recv(at(0.21), keeping)
	h.step(at(0.22))
	keeping = h.hb(2, 1, 2)
	keeping.Keeping = true
	h.recv(at(0.23), keeping)
	if st := h.m.Status(); st.Converged || toyCount(st.Accept) != 0 || !st.View.Has(2) {
		t.Fatalf("peer keeping: converged %v accept %d view %v; want false 0 {1,2}", st.Converged, toyCount(st.Accept), st.View.Eligible)
	}
	h.recv(at(0.24), h.hb(2, 1, 2))
	if st := h.m.Status(); !st.Converged || toyCount(st.Accept) != 8 {
		t.Fatalf("peer let go: converged %v accept %d, want true 8", st.Converged, toyCount(st.Accept))
	}
}

// TestRepliesAtOnce: a peer that adopts a view gets this node's
// acknowledgement at once, within the burst limit.
func TestRepliesAtOnce(t *testing.T) {
	h := newHarness(t, 1, 2)
	now := converge2(h)
	next := h.m.NextSend()
	h.recv(now.Add(5*time.Millisecond), h.hb(2, 1, 2))
	if !h.m.NextSend().Equal(next) {
		t.Fatalf("a repeated view moved the next heartbeat from %v to %v", next, h.m.NextSend())
	}
	t1 := now.Add(6 * time.Millisecond)
	h.recv(t1, h.hb(2, 2))
	if !h.m.NextSend().Equal(t1) {
		t.Fatalf("peer changed its view: next heartbeat %v, want at once (%v)", h.m.NextSend(), t1)
	}
	// Many changes in one period: at most sendBudget heartbeats go out.
	sent := 0
	for i := range 20 {
		ti := t1.Add(time.Duration(i) * time.Millisecond)
		if i%2 == 0 {
			h.recv(ti, h.hb(2, 1, 2))
		} else {
			h.recv(ti, h.hb(2, 2))
		}
		if !ti.Before(h.m.NextSend()) {
			h.sent = h.m.Outgoing(ti).Seq
			sent++
		}
	}
	if budget := sendBudget; sent > budget+1 {
		t.Errorf("%d heartbeats in 20 ms, want at most %d a period", sent, budget+1)
	}
}

// TestSendBudgetWhateverTheSize: in a 32-node cluster where every peer
// adopts a new view within one period (a storm), this node sends at most
// twice sendBudget heartbeats that period (a period's worth at once, then
// the budget's rate), each to every peer: a budget that grew with the
// peers let it answer every peer.
func TestSendBudgetWhateverTheSize(t *testing.T) {
	var peers, all []uint32
	for id := uint32(2); id <= 32; id++ {
		peers = append(peers, id)
	}
	all = append([]uint32{1}, peers...)
	h := newHarness(t, 1, peers...)
	now := at(0)
	for i := range 3 {
		now = at(float64(i))
		for _, id := range peers {
			h.recv(now.Add(time.Millisecond), h.hb(id, all...))
		}
		h.step(now.Add(2 * time.Millisecond))
	}
	start := now.Add(3 * time.Millisecond)
	sent := 0
	for i := range 2 * len(peers) {
		ti := start.Add(time.Duration(i) * tP / time.Duration(2*len(peers)))
		id := peers[i%len(peers)]
		if i < len(peers) {
			h.recv(ti, h.hb(id, all[:len(all)-1]...)) // a view without node 32
		} else {
			h.recv(ti, h.hb(id, all...))
		}
		if !ti.Before(h.m.NextSend()) {
			h.sent = h.m.Outgoing(ti).Seq
			sent++
		}
	}
	if sent > 2*sendBudget {
		t.Errorf("%d heartbeats in one period of a storm among 32 nodes, want at most %d", sent, 2*sendBudget)
	}
	if sent < 2 {
		t.Errorf("%d heartbeats in one period of a storm, want the changes answered", sent)
	}
}

// TestDeathHold: a view that drops a silent peer is acted on only after
// the hold (the peer may still be alive and not know), unless a probe
// found the peer gone. The hold is deathHold hold periods: with a period
// scaled for a big cluster, the settings' period, not the scaled one.
func TestDeathHold(t *testing.T) {
	for _, tc := range []struct {
		probed bool
		hold   time.Duration // Config.HoldPeriod
	}{{false, 0}, {true, 0}, {false, tP / 3}} {
		probed := tc.probed
		h := newHarnessWith(t, Config{Period: tP, Tolerance: 6, LagGrace: 10, HoldPeriod: tc.hold}, 1, 2)
		hold := deathHold * tP
		if tc.hold != 0 {
			hold = deathHold * tc.hold
		}
		now := converge2(h)
		last := now.Add(time.Millisecond)
		if probed {
			h.m.Probe(last.Add(4*tP), 2, ProbeSilent)
		}
		h.runTo(last.Add(6 * tP))
		if st := h.m.Status(); !st.Peers[0].Live {
			t.Fatal("peer dead after exactly T periods; want more than T")
		}
		died := last.Add(6*tP + time.Millisecond)
		h.runTo(died)
		st := h.m.Status()
		if st.Peers[0].Live || !slices.Equal(st.View.Eligible, []uint32{1}) || st.Deaths != 1 {
			t.Fatalf("probed=%v: after T periods silent: live %v view %v deaths %d", probed, st.Peers[0].Live, st.View.Eligible, st.Deaths)
		}
		if probed {
			if toyCount(st.Accept) != 16 {
				t.Errorf("probe found the peer gone: accept %d at once, want all 16", toyCount(st.Accept))
			}
			continue
		}
		if toyCount(st.Accept) != 8 || st.Converged {
			t.Fatalf("on the view change: accept %d converged %v; want the 8 it had, not converged", toyCount(st.Accept), st.Converged)
		}
		h.runTo(died.Add(hold - time.Millisecond))
		if toyCount(h.m.Status().Accept) != 8 {
			t.Fatalf("hold period %v: acquired before the hold (%v) ended", tc.hold, hold)
		}
		h.runTo(died.Add(hold))
		if st := h.m.Status(); !st.Converged || toyCount(st.Accept) != 16 {
			t.Fatalf("hold period %v: after the hold (%v): converged %v accept %d, want all 16", tc.hold, hold, st.Converged, toyCount(st.Accept))
		}
	}
}

func TestReleaseAtOnce(t *testing.T) {
	h := newHarness(t, 1, 2, 3)
	now := at(0)
	for i := 0; i < 10; i++ {
		now = at(float64(i))
		h.recv(now, h.hb(2, 1, 2))
		h.step(now.Add(time.Millisecond))
	}
	// Node 3 never spoke: node 1 settled after T periods without it, and
	// {1,2} converged.
	before := h.m.Status().Accept
	if toyCount(before) != 8 {
		t.Fatalf("before the join: accept %d, want 8", toyCount(before))
	}
	h.recv(now.Add(2*time.Millisecond), h.hb(3, 1, 2, 3))
	st := h.m.Status()
	if !slices.Equal(st.View.Eligible, []uint32{1, 2, 3}) {
		t.Fatalf("view %v, want {1,2,3}", st.View.Eligible)
	}
	want := toyIntersect(before, toyOwned(1)(st.View))
	if diff := cmp.Diff(want, st.Accept); diff != "" {
		t.Errorf("accept after join (-want +got):\n%s", diff)
	}
}

func TestRejectsStaleAndUnknown(t *testing.T) {
	h := newHarness(t, 1, 2)
	m1 := h.hb(2, 1, 2)
	h.recv(at(0.1), m1)
	tests := []struct {
		name string
		msg  *Message
		from netip.AddrPort
		want error
	}{
		{"replay", m1, hAddr(2), ErrStale},
		{"older seq", &Message{ClusterID: 1, Node: 2, Incarnation: 1, Seq: 0}, hAddr(2), ErrStale},
		{"older incarnation", &Message{ClusterID: 1, Node: 2, Incarnation: 0, Seq: 50}, hAddr(2), ErrOldIncarnation},
		{"other address", &Message{ClusterID: 1, Node: 2, Incarnation: 1, Seq: 50}, hAddr(3), ErrWrongAddress},
		{"other port", &Message{ClusterID: 1, Node: 2, Incarnation: 1, Seq: 50}, netip.AddrPortFrom(hAddr(2).Addr(), 7947), ErrWrongAddress},
		{"unregistered", &Message{ClusterID: 1, Node: 3, Incarnation: 1, Seq: 1}, hAddr(3), ErrUnknownNode},
		{"own id", &Message{ClusterID: 1, Node: 1, Incarnation: 2, Seq: 1}, hAddr(1), ErrSelf},
		{"other cluster", &Message{ClusterID: 2, Node: 2, Incarnation: 1, Seq: 9}, hAddr(2), ErrForeignCluster},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := h.m.Version()
			if err := h.m.Receive(at(0.2), tt.msg, tt.from); !errors.Is(err, tt.want) {
				t.Errorf("Receive = %v, want %v", err, tt.want)
			}
			if h.m.Version() != v {
				t.Error("a rejected heartbeat changed the status")
			}
		})
	}
	// The same address as an IPv4-mapped IPv6 one is that address.
	mapped := netip.AddrPortFrom(netip.AddrFrom16(hAddr(2).Addr().As16()), 7946)
	if err := h.m.Receive(at(0.3), h.hb(2, 1, 2), mapped); err != nil {
		t.Errorf("from %v: %v", mapped, err)
	}
}

// TestReplayAfterDeath: once a peer is dead, no captured heartbeat of it,
// of any incarnation, brings it back; only a newer sequence number or
// incarnation does.
func TestReplayAfterDeath(t *testing.T) {
	h := newHarness(t, 1, 2)
	var captured []*Message
	now := at(0)
	h.incs[2] = 3
	for i := range 3 {
		now = at(float64(i))
		msg := h.hb(2, 1, 2)
		captured = append(captured, msg)
		h.recv(now.Add(time.Millisecond), msg)
		h.step(now.Add(2 * time.Millisecond))
	}
	old := &Message{ClusterID: 1, Node: 2, Incarnation: 2, Seq: 1000, Admin: Started, Healthy: true, Settled: true, View: View{Eligible: []uint32{1, 2}, RulesIndex: 5, Seed: 9}}
	captured = append(captured, old)
	dead := now.Add(7 * tP)
	h.step(dead)
	if h.m.Status().Peers[0].Live {
		t.Fatal("peer 2 still live after T silent periods")
	}
	for _, msg := range captured {
		if err := h.m.Receive(dead.Add(time.Millisecond), msg, hAddr(2)); err == nil {
			t.Errorf("replay of incarnation %d seq %d accepted after death", msg.Incarnation, msg.Seq)
		}
	}
	if st := h.m.Status(); st.Peers[0].Live || st.View.Has(2) {
		t.Fatalf("replays revived the peer: live %v view %v", st.Peers[0].Live, st.View.Eligible)
	}
	h.incs[2] = 4
	h.seqs[2] = 0
	h.recv(dead.Add(2*time.Millisecond), h.hb(2, 1, 2))
	if !h.m.Status().Peers[0].Live {
		t.Error("a newer incarnation was not taken")
	}
}

func TestRestartIsFreshMember(t *testing.T) {
	h := newHarness(t, 1, 2)
	now := converge2(h)
	h.incs[2], h.seqs[2] = 2, 0
	msg := h.hb(2, 1) // restarted, not settled yet: listening
	msg.Settled = false
	h.recv(now.Add(10*time.Millisecond), msg)
	st := h.m.Status()
	if st.Peers[0].Incarnation != 2 || st.View.Has(2) {
		t.Fatalf("after restart: incarnation %d view %v; want 2 and peer not eligible until settled", st.Peers[0].Incarnation, st.View.Eligible)
	}
	if st.Excluded {
		t.Error("an unsettled peer's view made this node yield")
	}
}

func TestLaggingRulesLeaveEligibleSet(t *testing.T) {
	h := newHarness(t, 1, 2)
	now := converge2(h)
	// Peer 2 applies rules index 6; we stay at 5.
	for i := 1; i <= 12; i++ {
		msg := h.hb(2, 2)
		msg.RulesIndex, msg.View.RulesIndex = 6, 6
		msg.View.Eligible = []uint32{1, 2}
		h.recv(now.Add(time.Duration(i)*tP), msg)
		h.step(now.Add(time.Duration(i)*tP + time.Millisecond))
		st := h.m.Status()
		lagging := !st.View.Has(1)
		if wantLag := i > 10; lagging != wantLag {
			t.Fatalf("period %d: self lagging=%v (view %v), want %v", i, lagging, st.View.Eligible, wantLag)
		}
	}
	h.local.RulesIndex = 6
	h.m.SetLocal(now.Add(13*tP), h.local)
	if st := h.m.Status(); !st.View.Has(1) || st.View.RulesIndex != 6 {
		t.Errorf("caught up: view %+v, want self back at index 6", st.View)
	}
}

func TestNotSettledUntilPeersHeard(t *testing.T) {
	h := newHarness(t, 1, 2, 3)
	h.recv(at(0.5), h.hb(2, 2))
	if h.m.Status().Settled {
		t.Fatal("settled before hearing peer 3")
	}
	h.recv(at(0.6), h.hb(3, 3))
	if st := h.m.Status(); st.Settled {
		t.Fatal("settled after hearing everyone but before they hear it: its view would leave them out, and they would yield")
	}
	h.step(at(0.7))
	h.recv(at(0.8), h.hb(2, 1, 2, 3))
	if st := h.m.Status(); st.Settled {
		t.Fatal("settled before peer 3 hears it")
	}
	h.recv(at(0.8), h.hb(3, 1, 2, 3))
	if st := h.m.Status(); !st.Settled || !st.View.Has(1) {
		t.Fatalf("heard by everyone: view %v, want this node in it", st.View.Eligible)
	}
	g := newHarness(t, 1, 2)
	g.step(at(5.9))
	if g.m.Status().Settled {
		t.Fatal("settled alone before T periods")
	}
	g.step(at(6))
	if !g.m.Status().Settled {
		t.Fatal("not settled after T periods")
	}
}

func TestOutgoingCarriesState(t *testing.T) {
	h := newHarness(t, 1)
	h.local.Draining = Buckets{3: {1, 2}}
	h.m.SetLocal(at(0), h.local)
	a, b := h.m.Outgoing(at(0)), h.m.Outgoing(at(1))
	if b.Seq != a.Seq+1 || a.Incarnation != 1 || !a.Healthy || a.RulesIndex != 5 || !a.Draining.Equal(h.local.Draining) {
		t.Errorf("outgoing %+v then %+v", a, b)
	}
	if !b.Settled || !slices.Equal(b.View.Eligible, []uint32{1}) {
		t.Errorf("alone with an empty registry: settled %v view %v", b.Settled, b.View.Eligible)
	}
}

func TestAdminStateNames(t *testing.T) {
	for a := Started; a <= Suspended; a++ {
		got, err := ParseAdminState(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAdminState(%q) = %v, %v", a.String(), got, err)
		}
	}
	if _, err := ParseAdminState("running"); err == nil {
		t.Error("ParseAdminState accepted an unknown name")
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{Self: 1, Incarnation: 1}, true},
		{"no self", Config{Incarnation: 1}, false},
		{"no incarnation", Config{Self: 1}, false},
		{"tolerance 1", Config{Self: 1, Incarnation: 1, Tolerance: 1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.cfg.WithDefaults().Validate(); (err == nil) != tt.ok {
				t.Errorf("Validate = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

// TestReturningPeerDropsNoMember: a peer that comes back after a silence
// (node 3, as after a stall) is heard by this node before another
// member's heartbeat can acknowledge it. That member (node 1) hears
// everybody and stays in the view; the newcomer joins once node 1
// acknowledges it. Past two periods, a member that still does not hear it
// is taken for the deaf side, as before.
func TestReturningPeerDropsNoMember(t *testing.T) {
	for _, stillDeaf := range []bool{false, true} {
		h := newHarness(t, 2, 1, 3)
		deafTo3 := func() *Message { // node 1's heartbeat, not acknowledging node 3
			msg := h.hb(1, 1, 2)
			msg.Acks = slices.DeleteFunc(msg.Acks, func(a Ack) bool { return a.Node == 3 })
			return msg
		}
		for i := range 3 {
			h.recv(at(float64(i)+0.1), h.hb(1, 1, 2, 3))
			h.recv(at(float64(i)+0.1), h.hb(3, 1, 2, 3))
			h.step(at(float64(i) + 0.2))
		}
		for i := 3; i < 12; i++ { // node 3 silent: dead after the tolerance
			h.recv(at(float64(i)+0.1), deafTo3())
			h.step(at(float64(i) + 0.2))
		}
		if st := h.m.Status(); !st.Converged || !slices.Equal(st.View.Eligible, []uint32{1, 2}) {
			t.Fatalf("node 3 dead: view %v converged %v, want {1,2} converged", st.View.Eligible, st.Converged)
		}
		h.recv(at(12.1), h.hb(3, 1, 2, 3))
		if st := h.m.Status(); !slices.Equal(st.View.Eligible, []uint32{1, 2}) {
			t.Fatalf("node 3 back, node 1's last heartbeat from before: view %v, want {1,2}: node 1 hears everybody", st.View.Eligible)
		}
		if !stillDeaf {
			h.recv(at(12.15), h.hb(1, 1, 2))
			if st := h.m.Status(); !slices.Equal(st.View.Eligible, []uint32{1, 2, 3}) {
				t.Fatalf("node 1 acknowledges node 3: view %v, want {1,2,3}", st.View.Eligible)
			}
			continue
		}
		for i := 12; i < 16; i++ {
			h.recv(at(float64(i)+0.12), deafTo3())
			h.step(at(float64(i) + 0.2))
			h.recv(at(float64(i)+1.1), h.hb(3, 1, 2, 3))
		}
		if st := h.m.Status(); !slices.Equal(st.View.Eligible, []uint32{2, 3}) {
			t.Fatalf("node 1 deaf to node 3 for 4 periods: view %v, want {2,3} (node 1 the deaf side)", st.View.Eligible)
		}
	}
}

// TestDeferRecompute: deferred, a heartbeat that changes the view leaves
// the outputs alone until the next Tick, Wake asks for that tick at once,
// and the tick gives what an immediate machine gave on receipt; a reply is
// scheduled at once either way.
func TestDeferRecompute(t *testing.T) {
	imm, def := newHarness(t, 1, 2, 3), newHarness(t, 1, 2, 3)
	def.m.DeferRecompute(true)
	var now time.Time
	for _, h := range []*harness{imm, def} {
		for i := range 9 { // node 3 silent: settles after T periods
			now = at(float64(i))
			h.recv(now.Add(time.Millisecond), h.hb(2, 1, 2))
			h.step(now.Add(2 * time.Millisecond))
		}
		if st := h.m.Status(); !st.Converged || !slices.Equal(st.View.Eligible, []uint32{1, 2}) {
			t.Fatalf("before node 3: view %v converged %v", st.View.Eligible, st.Converged)
		}
	}
	// Node 3 is heard: it joins the view.
	now = now.Add(10 * time.Millisecond)
	imm.recv(now, imm.hb(3, 1, 2, 3))
	def.recv(now, def.hb(3, 1, 2, 3))
	want := imm.m.Status()
	if !slices.Equal(want.View.Eligible, []uint32{1, 2, 3}) {
		t.Fatalf("immediate: view %v after node 3's heartbeat, want {1,2,3}", want.View.Eligible)
	}
	if got := def.m.Status(); !slices.Equal(got.View.Eligible, []uint32{1, 2}) {
		t.Errorf("deferred: view %v before the tick, want {1,2} still", got.View.Eligible)
	}
	if w := def.m.Wake(); !w.Equal(now) {
		t.Errorf("deferred: Wake %v, want now (%v): a recompute waits", w, now)
	}
	if !def.m.NextSend().Equal(imm.m.NextSend()) {
		t.Errorf("deferred: next send %v, immediate %v: the reply must not wait for the tick", def.m.NextSend(), imm.m.NextSend())
	}
	def.m.Tick(now)
	got := def.m.Status()
	if !got.View.Equal(want.View) || got.Converged != want.Converged || toyCount(got.Accept) != toyCount(want.Accept) {
		t.Errorf("deferred after the tick: view %v converged %v accept %d; immediate: %v %v %d",
			got.View.Eligible, got.Converged, toyCount(got.Accept), want.View.Eligible, want.Converged, toyCount(want.Accept))
	}
	imm.m.Tick(now)
	if w, iw := def.m.Wake(), imm.m.Wake(); !w.Equal(iw) {
		t.Errorf("deferred after the tick: Wake %v, immediate %v", w, iw)
	}
}

// TestFirstToDeclareADeathStays: a peer that every member last heard T/2
// periods ago or more is dying: when one member declares it dead first,
// the others drop the dying peer, not that member (the deaf side of their
// broken link by the older rule, which excluded it, and it yielded all it
// held, until the others declared the death too). A link cut one way from
// a peer heard recently by the others is judged as before.
func TestFirstToDeclareADeathStays(t *testing.T) {
	setAck := func(msg *Message, id uint32, age int, drop bool) *Message {
		out := msg.Acks[:0]
		for _, a := range msg.Acks {
			if a.Node == id {
				if drop {
					continue
				}
				a.Age = uint8(age)
			}
			out = append(out, a)
		}
		msg.Acks = out
		return msg
	}
	run := func(t *testing.T, silentFor float64, ageAt3 int) []uint32 {
		h := newHarness(t, 1, 2, 3, 4)
		var now time.Time
		for i := range 4 {
			now = at(float64(i))
			for _, id := range []uint32{2, 3, 4} {
				h.recv(now.Add(time.Millisecond), h.hb(id, 1, 2, 3, 4))
			}
			h.step(now.Add(2 * time.Millisecond))
		}
		if st := h.m.Status(); !st.Converged || len(st.View.Eligible) != 4 {
			t.Fatalf("before: view %v converged %v", st.View.Eligible, st.Converged)
		}
		// Node 4 falls silent here (or, with ageAt3 0, only towards node 2).
		last := now
		for k := 1.0; k <= silentFor; k++ {
			now = last.Add(time.Duration(k * float64(tP)))
			h.recv(now, setAck(h.hb(3, 1, 2, 3, 4), 4, min(int(k), ageAt3), false))
			if ageAt3 == 0 {
				h.recv(now, h.hb(4, 1, 2, 3, 4))
			}
			h.step(now.Add(time.Millisecond))
		}
		// Node 2 declares node 4 dead first.
		now = now.Add(10 * time.Millisecond)
		h.recv(now, setAck(h.hb(2, 1, 2, 3), 4, 0, true))
		h.step(now.Add(time.Millisecond))
		return h.m.Status().View.Eligible
	}
	// Tolerance 6: node 4 silent for 5 periods (dead at 6 here), node 3
	// last heard it as long ago.
	if v := run(t, 5, 5); !slices.Equal(v, []uint32{1, 2, 3}) {
		t.Errorf("node 4 silent everywhere, node 2 declares it dead first: view %v, want [1 2 3]", v)
	}
	// Node 4 heard by node 1 and node 3 a moment ago: the link to node 2
	// is cut one way, and node 2 is the deaf side, as before.
	if v := run(t, 5, 0); !slices.Equal(v, []uint32{1, 3, 4}) {
		t.Errorf("link 4->2 cut, node 4 heard by the others: view %v, want [1 3 4]", v)
	}
}

// TestWidenCompactAcks: the low 32 bits of an acknowledgement's
// incarnation and sequence (protocol 3) are widened from what the node
// knows, across the 2^32 boundary: this node's own sequence, a peer's
// incarnation; what it does not know stays as it came.
func TestWidenCompactAcks(t *testing.T) {
	for _, c := range []struct {
		ref  uint64
		low  uint32
		want uint64
	}{
		{5, 7, 7},
		{1<<32 + 10, 10, 1<<32 + 10},
		{1<<32 + 10, 0xfffffff0, 0xfffffff0},
		{0xfffffff0, 3, 1<<32 + 3},
		{0, 0xffffffff, 0xffffffff},
	} {
		if got := nearest(c.ref, c.low); got != c.want {
			t.Errorf("nearest(%#x, %#x) = %#x, want %#x", c.ref, c.low, got, c.want)
		}
	}
	h := newHarness(t, 1, 2, 3)
	h.m.seq = 1<<32 + 10
	h.incs[2] = 1<<33 + 5
	h.recv(at(0.1), h.hb(2, 1, 2, 3))
	acks := []Ack{
		{Node: 1, Incarnation: 1, Seq: 10},
		{Node: 2, Incarnation: 5, Seq: 1},
		{Node: 4, Incarnation: 77, Seq: 3},
	}
	h.m.widen(acks)
	want := []Ack{
		{Node: 1, Incarnation: 1, Seq: 1<<32 + 10},
		{Node: 2, Incarnation: 1<<33 + 5, Seq: 1},
		{Node: 4, Incarnation: 77, Seq: 3},
	}
	for i := range want {
		if acks[i] != want[i] {
			t.Errorf("ack %d widened to %+v, want %+v", i, acks[i], want[i])
		}
	}
}

// TestNeverHeardSuspectedOnlyWhenItMatters: a registered peer never heard
// is a suspect (to probe) while this node settles, and again once no peer
// hears it; not while it is settled among peers that hear it (every
// settled member probed a node joining a big cluster at once).
func TestNeverHeardSuspectedOnlyWhenItMatters(t *testing.T) {
	h := newHarness(t, 1, 2, 3)
	has3 := func() bool { return slices.Contains(h.m.Suspects(), 3) }
	for i := 0; i < 10; i++ {
		now := at(float64(i))
		h.recv(now, h.hb(2, 1, 2))
		h.step(now.Add(time.Millisecond))
		if i == 4 && (!has3() || h.m.Status().Settled) {
			t.Fatalf("settling, node 3 silent for 4 periods: suspect %v settled %v; want a suspect, not settled", has3(), h.m.Status().Settled)
		}
	}
	if st := h.m.Status(); !st.Settled || !st.Converged || has3() {
		t.Fatalf("settled with node 2: settled %v converged %v, node 3 a suspect %v; want settled, converged, no suspect", st.Settled, st.Converged, has3())
	}
	// Node 2 stops hearing this node: nobody does, and node 3 matters
	// again (this node may be the deaf one).
	for i := 10; i < 14; i++ {
		now := at(float64(i))
		msg := h.hb(2, 2)
		msg.Acks = slices.DeleteFunc(msg.Acks, func(a Ack) bool { return a.Node == 1 })
		h.recv(now, msg)
		h.step(now.Add(time.Millisecond))
	}
	if !has3() {
		t.Errorf("no peer hears this node: node 3 not a suspect (suspects %v)", h.m.Suspects())
	}
}

// TestDeathDueAfterAnotherRecompute: a peer's death is declared by the
// first Tick past its deadline even when something else recomputed after
// the deadline passed and before that Tick (a probe's answer handled late,
// a heartbeat sent): the recompute does not declare deaths, and the Tick
// that follows was skipped as having nothing due, so the death waited for
// the next deadline of another kind (here 2 periods).
func TestDeathDueAfterAnotherRecompute(t *testing.T) {
	for _, late := range []string{"probe answer", "heartbeat sent"} {
		t.Run(late, func(t *testing.T) {
			h := newHarness(t, 1, 2, 3, 4)
			h.m.DeferRecompute(true) // as the agent runs it
			for _, id := range []uint32{2, 3, 4} {
				h.recv(at(0), h.hb(id, 1, 2, 3, 4))
			}
			// Peers 2 and 4 keep sending every period; 3 is silent after 0.
			for i := 1; i <= 6; i++ {
				h.recv(at(float64(i)), h.hb(2, 1, 2, 3, 4))
				h.recv(at(float64(i)), h.hb(4, 1, 2, 3, 4))
				h.runTo(at(float64(i)))
			}
			if !h.m.peers[3].live {
				t.Fatal("peer 3 dead before its T periods of silence")
			}
			// Past the death deadline (T=6 periods after 0), something
			// recomputes before the agent's next Tick.
			now := at(6.5)
			switch late {
			case "probe answer":
				h.m.Probe(now, 3, ProbeSilent)
			case "heartbeat sent":
				h.sent = h.m.Outgoing(now).Seq
			}
			h.m.Tick(now)
			if h.m.peers[3].live {
				t.Fatalf("peer 3 still live at %v after the Tick, silent since 0 (death window %v); due %v",
					now.Sub(t0), h.m.deathWindow(now), h.m.due.Sub(t0))
			}
		})
	}
}
