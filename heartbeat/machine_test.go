package heartbeat

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const tP = 100 * time.Millisecond

var t0 = time.Unix(1_700_000_000, 0)

func at(periods float64) time.Time { return t0.Add(time.Duration(periods * float64(tP))) }

// harness is one Machine over toySet with a counter of owned() calls.
type harness struct {
	t     *testing.T
	m     *Machine[toySet]
	owned int
	seqs  map[uint32]uint64
	incs  map[uint32]uint64
	local Local
}

func newHarness(t *testing.T, self uint32, peers ...uint32) *harness {
	h := &harness{t: t, seqs: map[uint32]uint64{}, incs: map[uint32]uint64{}}
	own := toyOwned(self)
	m, err := NewMachine(Config{ClusterID: 1, Self: self, Key: simKey, Incarnation: 1, Period: tP, Tolerance: 5, Converge: 2, LagGrace: 10}, t0,
		func(v View) toySet { h.owned++; return own(v) }, toyIntersect)
	if err != nil {
		t.Fatal(err)
	}
	h.m = m
	m.SetPeers(t0, append([]uint32{self}, peers...))
	h.local = Local{Admin: Started, Healthy: true, RulesIndex: 5, Seed: 9}
	m.SetLocal(t0, h.local)
	return h
}

// hb is a heartbeat from peer id advertising view elig, started and healthy.
func (h *harness) hb(id uint32, elig ...uint32) *Message {
	h.seqs[id]++
	if h.incs[id] == 0 {
		h.incs[id] = 1
	}
	return &Message{ClusterID: 1, Node: id, Incarnation: h.incs[id], Seq: h.seqs[id], Admin: Started, Healthy: true, Settled: true,
		RulesIndex: 5, View: View{Eligible: elig, RulesIndex: 5, Seed: 9}}
}

func (h *harness) recv(now time.Time, msg *Message) {
	h.t.Helper()
	if err := h.m.Receive(now, msg); err != nil {
		h.t.Fatalf("Receive(%d seq %d): %v", msg.Node, msg.Seq, err)
	}
}

// step advances to now: ticks, and sends if due.
func (h *harness) step(now time.Time) {
	h.m.Tick(now)
	if !now.Before(h.m.NextSend()) {
		h.m.Outgoing(now)
	}
}

// converge2 brings node 1 with peer 2 to a converged view {1,2}: returns the time.
func converge2(h *harness) time.Time {
	now := at(0)
	for i := 0; i < 6; i++ {
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
		t.Fatalf("after 6 periods: view %v converged %v accept %d, want {1,2} converged 8", st.View.Eligible, st.Converged, toyCount(st.Accept))
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

func TestNotConvergedUntilPeersAdvertiseK(t *testing.T) {
	h := newHarness(t, 1, 2)
	// Peer 2 is heard but advertises a view without node 1 first, then the
	// right one; convergence needs K=2 matching heartbeats received a
	// period after adoption.
	h.recv(at(0.1), h.hb(2, 2))
	h.step(at(0.2))
	h.recv(at(1.1), h.hb(2, 2))
	h.step(at(1.2))
	if st := h.m.Status(); !st.Excluded || toyCount(st.Accept) != 0 {
		t.Fatalf("peer leaves us out: excluded %v accept %d, want true 0", st.Excluded, toyCount(st.Accept))
	}
	h.recv(at(2.1), h.hb(2, 1, 2))
	h.step(at(2.2))
	if st := h.m.Status(); st.Converged {
		t.Fatal("converged after one matching heartbeat")
	}
	h.recv(at(3.1), h.hb(2, 1, 2))
	h.step(at(3.2))
	if st := h.m.Status(); !st.Converged || toyCount(st.Accept) != 8 {
		t.Fatalf("after two matching heartbeats: converged %v accept %d", st.Converged, toyCount(st.Accept))
	}
}

func TestDeathReleasesNothingAcquiresAfterK(t *testing.T) {
	h := newHarness(t, 1, 2)
	now := converge2(h)
	// Peer 2 goes silent. It stays live for T periods, then dies.
	last := now.Add(time.Millisecond)
	h.step(last.Add(5 * tP))
	if st := h.m.Status(); !st.Peers[0].Live {
		t.Fatal("peer dead after exactly T periods; want more than T")
	}
	h.step(last.Add(5*tP + time.Millisecond))
	st := h.m.Status()
	if st.Peers[0].Live || !slices.Equal(st.View.Eligible, []uint32{1}) || st.Deaths != 1 {
		t.Fatalf("after T periods silent: live %v view %v deaths %d", st.Peers[0].Live, st.View.Eligible, st.Deaths)
	}
	if toyCount(st.Accept) != 8 || st.Converged {
		t.Fatalf("on the view change: accept %d converged %v; want the 8 it had, not converged", toyCount(st.Accept), st.Converged)
	}
	adopted := st.AdoptedAt
	for i := 0.0; i < 2; i += 0.25 {
		h.step(adopted.Add(time.Duration(i * float64(tP))))
	}
	if toyCount(h.m.Status().Accept) != 8 {
		t.Fatal("acquired before K periods")
	}
	h.step(adopted.Add(2 * tP))
	if st := h.m.Status(); !st.Converged || toyCount(st.Accept) != 16 {
		t.Fatalf("K periods after: converged %v accept %d, want all 16", st.Converged, toyCount(st.Accept))
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
		want error
	}{
		{"replay", m1, ErrStale},
		{"older seq", &Message{ClusterID: 1, Node: 2, Incarnation: 1, Seq: 0}, ErrStale},
		{"older incarnation while live", &Message{ClusterID: 1, Node: 2, Incarnation: 0, Seq: 50}, ErrStale},
		{"unregistered", &Message{ClusterID: 1, Node: 3, Incarnation: 1, Seq: 1}, ErrUnknownNode},
		{"own id", &Message{ClusterID: 1, Node: 1, Incarnation: 2, Seq: 1}, ErrSelf},
		{"other cluster", &Message{ClusterID: 2, Node: 2, Incarnation: 1, Seq: 9}, ErrForeignCluster},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := h.m.Receive(at(0.2), tt.msg); !errors.Is(err, tt.want) {
				t.Errorf("Receive = %v, want %v", err, tt.want)
			}
		})
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
	if st := h.m.Status(); !st.Settled || !st.View.Has(1) {
		t.Fatalf("after hearing everyone: settled %v view %v", st.Settled, st.View.Eligible)
	}
	g := newHarness(t, 1, 2)
	g.step(at(4.9))
	if g.m.Status().Settled {
		t.Fatal("settled alone before T periods")
	}
	g.step(at(5))
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
		{"defaults", Config{Self: 1, Key: simKey}, true},
		{"no self", Config{Key: simKey}, false},
		{"short key", Config{Self: 1, Key: simKey[:16]}, false},
		{"tolerance 1", Config{Self: 1, Key: simKey, Tolerance: 1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.cfg.WithDefaults().Validate(); (err == nil) != tt.ok {
				t.Errorf("Validate = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func TestUnionBuckets(t *testing.T) {
	got := Union(Buckets{1: {3, 1000}}, Buckets{1: {2, 3}, 2: {4095}}, nil)
	want := Buckets{1: {2, 3, 1000}, 2: {4095}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Union (-want +got):\n%s", diff)
	}
}
