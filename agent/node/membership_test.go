package node

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
	"github.com/shoalnet/shoal/rules"
)

// pipeLink delivers heartbeats straight into another member's inbox.
type pipeLink struct {
	inbox *[]*heartbeat.Message
	sent  []time.Time
	now   func() time.Time
}

func (l *pipeLink) Send(msg *heartbeat.Message, _ []netip.AddrPort) error {
	*l.inbox = append(*l.inbox, msg)
	l.sent = append(l.sent, l.now())
	return nil
}
func (l *pipeLink) Reject(heartbeat.Reason) {}
func (l *pipeLink) Stats() heartbeat.Stats  { return heartbeat.Stats{} }

// staticRules is a rules source that only the test changes (through
// applyRules), so that the test decides when each member learns of a change.
type staticRules struct{ st *rules.State }

func (s staticRules) State() *rules.State                  { return s.st }
func (s staticRules) Subscribe() (<-chan struct{}, func()) { return nil, func() {} }

// memberPair is nodes 1 and 2 of a twoNodeRules state as members on the
// test's virtual clock (*now): each sends into the other's inbox, which
// the test delivers when it chooses.
type memberPair struct {
	now   *time.Time
	ms    [2]*membership
	links [2]*pipeLink
	inbox [2][]*heartbeat.Message
}

// newMemberPair starts the two members of st at *now; prepare, when set,
// runs on each member before it starts.
func newMemberPair(t *testing.T, st *rules.State, now *time.Time, prepare func(i int, m *membership)) *memberPair {
	t.Helper()
	p := &memberPair{now: now}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	clock := func() time.Time { return *p.now }
	for i := range p.ms {
		p.links[i] = &pipeLink{inbox: &p.inbox[1-i], now: clock}
		m := newMembership(filter.NodeID(i+1), testIncarnation, log, p.links[i], staticRules{st}, func() bool { return true })
		m.now = clock
		if prepare != nil {
			prepare(i, m)
		}
		if err := m.start(*p.now); err != nil {
			t.Fatal(err)
		}
		p.ms[i] = m
	}
	return p
}

// deliver hands member i the heartbeats sent to it, from its peer's
// registered address.
func (p *memberPair) deliver(i int) {
	msgs := p.inbox[i]
	p.inbox[i] = nil
	for _, msg := range msgs {
		p.ms[i].receive(msg, netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", 7001+(1-i))))
	}
}

// step runs both members at now: each takes its heartbeats and steps, and
// its data plane takes every table at once.
func (p *memberPair) step() {
	for i, m := range p.ms {
		p.deliver(i)
		m.step(*p.now)
		m.takeReport(pushReport{snap: m.snap.Load(), ok: true, healthy: true})
	}
}

func twoNodeRules(index uint64, weight1, weight2 int) *rules.State {
	st := &rules.State{
		Index:    index,
		Settings: rules.Settings{ClusterID: 7, HashSeed: 1, HeartbeatPeriod: 100 * time.Millisecond, HeartbeatTolerance: 12},
		VIPs:     []netip.Addr{netip.MustParseAddr("198.18.7.100")},
		Rules: []filter.Rule{{ID: 1, VIP: netip.MustParseAddr("198.18.7.100"), PortLo: 80, PortHi: 80,
			Proto: filter.ProtoTCP, Mode: filter.ModeMultiple, Affinity: filter.AffinityNone}},
		LastRuleID: 1, LastNodeID: 2,
	}
	for i, w := range []int{weight1, weight2} {
		st.Nodes = append(st.Nodes, rules.Node{ID: filter.NodeID(i + 1), Admin: rules.AdminStarted,
			NodeInfo: rules.NodeInfo{Name: fmt.Sprintf("n%d", i+1), HostPriority: i + 1, HeartbeatAddr: fmt.Sprintf("127.0.0.1:%d", 7001+i)},
			Rules:    map[filter.RuleID]filter.NodeRule{1: {Weight: w}}})
	}
	return st
}

// TestRulesAndViewApplyInOrder: a node never acquires for an old view with
// new rules. Two members run in virtual time, heartbeats delivered at once;
// a weight change that gives node 1 more buckets reaches node 1 first and
// node 2 three periods later (replication lag), at every moment around
// convergence in turn. At no time may both accept one bucket, and no member
// may take a bucket it did not have except when its view converged.
func TestRulesAndViewApplyInOrder(t *testing.T) {
	const period = 100 * time.Millisecond
	const dt = period / 10
	r1, r2 := twoNodeRules(5, 50, 50), twoNodeRules(6, 90, 10)
	acquired := 0
	for at := 0; at <= 80; at++ {
		t.Run(fmt.Sprintf("change at %v", time.Duration(at)*dt), func(t *testing.T) {
			now := time.Unix(1000, 0)
			p := newMemberPair(t, r1, &now, nil)
			ms := p.ms
			prev := [2]filter.Set{{}, {}}
			for tick := 0; tick < 200; tick++ {
				now = now.Add(dt)
				if tick == at {
					ms[0].applyRules(now, r2)
				}
				if tick == at+30 {
					ms[1].applyRules(now, r2)
				}
				p.step()
				var acc [2]filter.Set
				for i, m := range ms {
					s := m.snap.Load()
					acc[i] = s.hb.Accept.get().Buckets
					if gained := acc[i].Minus(prev[i]); gained.Count() > 0 {
						acquired++
						if !s.hb.Converged {
							t.Fatalf("tick %d: node %d took %d buckets in view %v without converging on it",
								tick, i+1, gained.Count(), s.hb.View)
						}
						if own := filter.Assign(s.fcfg, nodeIDs(s.hb.View.Eligible)).Owned(m.self); acc[i].Minus(own).Count() > 0 {
							t.Fatalf("tick %d: node %d accepts buckets its view's rules (index %d) do not give it", tick, i+1, s.rs.Index)
						}
					}
					prev[i] = acc[i]
				}
				if both := acc[0].Intersect(acc[1]).Count(); both > 0 {
					t.Fatalf("tick %d: %d buckets accepted by both nodes", tick, both)
				}
			}
			for i, m := range ms {
				if s := m.snap.Load(); !s.hb.Converged || s.hb.View.RulesIndex != r2.Index {
					t.Errorf("node %d never converged on the new rules: view %v converged %v", i+1, s.hb.View, s.hb.Converged)
				}
			}
		})
	}
	if acquired == 0 {
		t.Fatal("no member ever acquired a bucket: the test proves nothing")
	}
}

// TestOwnedUsesTheViewsRules: whatever the order in which the machine sees
// a rules change and its own new rules index, the buckets it would take for
// a view are computed with that view's rules, never with newer ones.
func TestOwnedUsesTheViewsRules(t *testing.T) {
	r1, r2 := twoNodeRules(5, 50, 50), twoNodeRules(6, 90, 10)
	now := time.Unix(1000, 0)
	var inbox []*heartbeat.Message
	m := newMembership(1, testIncarnation, slog.New(slog.NewTextHandler(io.Discard, nil)), &pipeLink{inbox: &inbox, now: time.Now},
		staticRules{r1}, func() bool { return true })
	if err := m.start(now); err != nil {
		t.Fatal(err)
	}
	old := heartbeat.View{Eligible: []uint32{1, 2}, RulesIndex: r1.Index, Seed: 1}
	under := func(st *rules.State) filter.Set {
		return filter.Assign(st.FilterConfig(), []filter.NodeID{1, 2}).Owned(1)
	}
	if got, want := m.owned(old).get().Buckets, under(r1); !got.Equal(want) {
		t.Fatalf("owned(view of rules %d) = %d buckets, want %d", r1.Index, got.Count(), want.Count())
	}
	m.applyRules(now, r2)
	if more := under(r2).Minus(under(r1)); more.Count() == 0 {
		t.Fatal("the new rules give node 1 nothing more: the test proves nothing")
	}
	if extra := m.owned(old).get().Buckets.Minus(under(r1)); extra.Count() > 0 {
		t.Errorf("after the rules change, owned(view of rules %d) holds %d buckets only the new rules give", r1.Index, extra.Count())
	}
	if m.machine.View().RulesIndex != r2.Index {
		t.Errorf("the machine's view %v is not of the new rules %d", m.machine.View(), r2.Index)
	}
	v2 := heartbeat.View{Eligible: []uint32{1, 2}, RulesIndex: r2.Index, Seed: 1}
	if got, want := m.owned(v2).get().Buckets, under(r2); !got.Equal(want) {
		t.Errorf("owned(view of rules %d) = %d buckets, want %d", r2.Index, got.Count(), want.Count())
	}
}

// TestHeartbeatSettingsAtRuntime: new heartbeat settings reach two members
// 30 ms apart (replication lag); both switch once they have converged on
// the rules that carry them: from then on each sends a heartbeat every new
// period and leases its data plane for the new T-1 periods (after the
// change's transition), with no peer declared dead and the view unchanged.
func TestHeartbeatSettingsAtRuntime(t *testing.T) {
	const dt = 5 * time.Millisecond
	r1 := twoNodeRules(5, 50, 50) // 100 ms x 12
	r2 := twoNodeRules(6, 50, 50)
	r2.Settings.HeartbeatPeriod, r2.Settings.HeartbeatTolerance = 40*time.Millisecond, 8
	var leases [2][]time.Duration
	now := time.Unix(1000, 0)
	p := newMemberPair(t, r1, &now, func(i int, m *membership) {
		m.renew = func(d time.Duration) error { leases[i] = append(leases[i], d); return nil }
	})
	ms, links := p.ms, p.links
	run := func(d time.Duration, each func()) {
		for end := now.Add(d); now.Before(end); {
			now = now.Add(dt)
			p.step()
			if each != nil {
				each()
			}
		}
	}
	run(2*time.Second, nil)
	both := []uint32{1, 2}
	for i, m := range ms {
		if st := m.snap.Load().hb; !st.Converged || !slices.Equal(st.View.Eligible, both) || st.Period != 100*time.Millisecond {
			t.Fatalf("node %d before the change: converged %v view %v period %v", i+1, st.Converged, st.View.Eligible, st.Period)
		}
	}
	ms[0].applyRules(now, r2)
	changed := now
	run(30*time.Millisecond, nil)
	ms[1].applyRules(now, r2)
	sentBefore := [2]int{len(links[0].sent), len(links[1].sent)}
	run(3*time.Second, func() {
		for i, m := range ms {
			st := m.snap.Load().hb
			if !slices.Equal(st.View.Eligible, both) {
				t.Fatalf("node %d: view %v %v after the change, want both nodes", i+1, st.View.Eligible, now.Sub(changed))
			}
		}
	})
	for i, m := range ms {
		st := m.snap.Load().hb
		if st.Period != 40*time.Millisecond || st.Tolerance != 8 || st.Deaths != 0 || !st.Converged {
			t.Errorf("node %d after the change: timing %v x %d, %d deaths, converged %v; want 40ms x 8, none, converged", i+1, st.Period, st.Tolerance, st.Deaths, st.Converged)
		}
		// The last second's heartbeats, one every 40 ms.
		sent := links[i].sent[sentBefore[i]:]
		var gaps []time.Duration
		for k := 1; k < len(sent); k++ {
			if now.Sub(sent[k]) < time.Second {
				gaps = append(gaps, sent[k].Sub(sent[k-1]))
			}
		}
		if len(gaps) < 20 || slices.Min(gaps) < 40*time.Millisecond || slices.Max(gaps) > 45*time.Millisecond {
			t.Errorf("node %d: %d heartbeats in the last second, gaps %v to %v; want one every 40 ms", i+1, len(gaps), slices.Min(gaps), slices.Max(gaps))
		}
		if l := leases[i][len(leases[i])-1]; l != 7*40*time.Millisecond {
			t.Errorf("node %d: lease %v, want 7 x 40 ms", i+1, l)
		}
	}
}

// fanLink delivers heartbeats straight into every other member's inbox.
type fanLink struct {
	inboxes []*[]*heartbeat.Message
	sent    []time.Time
	now     func() time.Time
}

func (l *fanLink) Send(msg *heartbeat.Message, _ []netip.AddrPort) error {
	for _, in := range l.inboxes {
		*in = append(*in, msg)
	}
	l.sent = append(l.sent, l.now())
	return nil
}
func (l *fanLink) Reject(heartbeat.Reason) {}
func (l *fanLink) Stats() heartbeat.Stats  { return heartbeat.Stats{} }

// TestHeartbeatsFallIntoStep: a member that hears a peer while its own
// heartbeat is due within half a period sends at once. Members knocked out
// of phase (stalled goroutines) must still each send about once a period,
// never with a gap above the period, and go out in one burst per period.
// (Here the machine's own replies also bring them back into step; the
// wake-ups saved in a real lab are measured by bench/idle.sh.)
func TestHeartbeatsFallIntoStep(t *testing.T) {
	const period = 100 * time.Millisecond
	const dt = period / 20
	st := twoNodeRules(5, 50, 50)
	st.LastNodeID = 3
	n3 := st.Nodes[1]
	n3.ID, n3.Name, n3.HostPriority, n3.HeartbeatAddr = 3, "n3", 3, "127.0.0.1:7003"
	st.Nodes = append(st.Nodes, n3)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	var inbox [3][]*heartbeat.Message
	var ms [3]*membership
	var links [3]*fanLink
	for i := range ms {
		links[i] = &fanLink{now: clock}
		for j := range inbox {
			if j != i {
				links[i].inboxes = append(links[i].inboxes, &inbox[j])
			}
		}
		m := newMembership(filter.NodeID(i+1), testIncarnation, log, links[i], staticRules{st}, func() bool { return true })
		m.now = clock
		ms[i] = m
	}
	// Once they have settled and converged (by 2 s: a view change is
	// answered at once, which brings them into step), members 2 and 3 stall for 0.3 and 0.6 periods, as goroutines that did
	// not run, and then go on: out of phase with member 1.
	stalled := func(i, tick int) bool {
		return i > 0 && tick >= 300+100*i && tick < 300+100*i+6*i
	}
	var next [3]time.Time
	const ticks = int(50 * period / dt)
	for tick := range ticks {
		now = now.Add(dt)
		for i, m := range ms {
			if tick == 0 {
				if err := m.start(now); err != nil {
					t.Fatal(err)
				}
			}
			if stalled(i, tick) {
				continue
			}
			msgs := inbox[i]
			inbox[i] = nil
			if len(msgs) == 0 && now.Before(next[i]) {
				continue // the goroutine sleeps until its timer
			}
			for _, msg := range msgs {
				m.receive(msg, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(7001+msg.Node-1)))
			}
			next[i] = m.step(now)
			m.takeReport(pushReport{snap: m.snap.Load(), ok: true, healthy: true})
		}
	}
	// Over the last 20 periods.
	from := now.Add(-20 * period)
	instants := map[time.Time]bool{}
	for i, l := range links {
		var last time.Time
		n := 0
		for _, at := range l.sent {
			if at.Before(from) {
				last = at
				continue
			}
			if gap := at.Sub(last); gap > period+dt {
				t.Errorf("member %d: %v between heartbeats (period %v)", i+1, gap, period)
			}
			last = at
			instants[at] = true
			n++
		}
		if n < 19 || n > 21 {
			t.Errorf("member %d sent %d heartbeats in 20 periods, want about 20", i+1, n)
		}
	}
	// Heartbeats delivered in one tick are answered in that tick or the
	// next (members step in turn): a burst is sends at most a tick apart.
	// In step, three members make about 20 bursts (replies to a view
	// change aside); out of step, 60.
	times := slices.SortedFunc(maps.Keys(instants), time.Time.Compare)
	bursts := 0
	for i, at := range times {
		if i == 0 || at.Sub(times[i-1]) > dt {
			bursts++
		}
	}
	if bursts > 25 {
		t.Errorf("heartbeats went out in %d bursts in 20 periods: the members did not fall into step", bursts)
	}
	t.Logf("%d bursts of heartbeats in 20 periods", bursts)
}

// TestNewViewAdvertisedOnceItsTablesAreIn: a node advertises a new view in
// the heartbeat it sends as soon as the data plane reports the view's
// tables in, even when a heartbeat re-advertising the previous view went out
// meanwhile (taking the machine's send-at-once): otherwise the new owners of
// the buckets it released wait up to a period for it, while nobody accepts
// those buckets.
func TestNewViewAdvertisedOnceItsTablesAreIn(t *testing.T) {
	const period = 100 * time.Millisecond
	r1, r2 := twoNodeRules(5, 50, 50), twoNodeRules(6, 90, 10)
	now := time.Unix(1000, 0)
	p := newMemberPair(t, r1, &now, nil)
	ms, inbox := p.ms, &p.inbox
	for tick := 0; tick < 200; tick++ {
		now = now.Add(period / 10)
		p.step()
	}
	if s := ms[0].snap.Load(); !s.hb.Converged {
		t.Fatalf("node 1 did not converge: view %v", s.hb.View)
	}
	// The rules change reaches node 1 a period after its last heartbeat:
	// its next heartbeat is due, and goes out with the old view, whose
	// tables are the only ones in the kernel.
	now = ms[0].lastSent.Add(period)
	inbox[1] = nil
	ms[0].applyRules(now, r2)
	ms[0].step(now)
	if len(inbox[1]) == 0 || inbox[1][len(inbox[1])-1].View.RulesIndex != r1.Index {
		t.Fatalf("while the new view's tables are pushed, node 1 sent %d heartbeats, want one of the old view (rules %d)", len(inbox[1]), r1.Index)
	}
	// A millisecond later the tables are in.
	now = now.Add(time.Millisecond)
	ms[0].takeReport(pushReport{snap: ms[0].snap.Load(), ok: true, healthy: true})
	sent := len(inbox[1])
	ms[0].step(now)
	if len(inbox[1]) == sent {
		t.Fatalf("node 1 sent nothing once the new view's tables were in; its next heartbeat is due %v later", ms[0].machine.NextSend().Sub(now))
	}
	if v := inbox[1][len(inbox[1])-1].View; v.RulesIndex != r2.Index {
		t.Errorf("the heartbeat sent once the tables were in advertises view %v, want the new one (rules %d)", v, r2.Index)
	}
}

// TestHeartbeatTimingScalesWithRegistry: rules that register 17 nodes (two
// live, fifteen never started) switch both live members to twice the
// settings' period and half their tolerance (heartbeat.ScaledTiming), with
// no death and the view kept, and they then send half as often.
func TestHeartbeatTimingScalesWithRegistry(t *testing.T) {
	const dt = 5 * time.Millisecond
	r1 := twoNodeRules(5, 50, 50) // 100 ms x 12
	r2 := twoNodeRules(6, 50, 50)
	for id := 3; id <= 17; id++ {
		r2.Nodes = append(r2.Nodes, rules.Node{ID: filter.NodeID(id), Admin: rules.AdminStarted,
			NodeInfo: rules.NodeInfo{Name: fmt.Sprintf("n%d", id), HostPriority: id, HeartbeatAddr: fmt.Sprintf("127.0.0.1:%d", 7001+id)}})
	}
	r2.LastNodeID = 17
	now := time.Unix(1000, 0)
	p := newMemberPair(t, r1, &now, nil)
	run := func(d time.Duration) {
		for end := now.Add(d); now.Before(end); {
			now = now.Add(dt)
			p.step()
		}
	}
	run(2 * time.Second)
	for _, m := range p.ms {
		m.applyRules(now, r2)
	}
	sentBefore := [2]int{len(p.links[0].sent), len(p.links[1].sent)}
	run(4 * time.Second)
	both := []uint32{1, 2}
	for i, m := range p.ms {
		st := m.snap.Load().hb
		if st.Period != 200*time.Millisecond || st.Tolerance != 6 || st.Deaths != 0 || !st.Converged || !slices.Equal(st.View.Eligible, both) {
			t.Errorf("node %d with 17 registered: timing %v x %d, %d deaths, converged %v, view %v; want 200ms x 6, none, converged on both", i+1, st.Period, st.Tolerance, st.Deaths, st.Converged, st.View.Eligible)
		}
		sent := p.links[i].sent[sentBefore[i]:]
		var last []time.Time
		for _, at := range sent {
			if now.Sub(at) < 2*time.Second {
				last = append(last, at)
			}
		}
		if len(last) < 9 || len(last) > 11 {
			t.Errorf("node %d sent %d heartbeats in the last 2 s, want about 10 (one every 200 ms)", i+1, len(last))
		}
	}
}

// TestCompactHeartbeatsOnceEveryNodeSpeaks: a member sends heartbeats with
// compact acknowledgements (protocol 3) only while every registered node
// reports rules.CompactHeartbeatLevel: one older node keeps the whole
// cluster on protocol 2, which it decodes.
func TestCompactHeartbeatsOnceEveryNodeSpeaks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		levels [2]int
		want   bool
	}{
		{"both at the level", [2]int{rules.CompactHeartbeatLevel, rules.CompactHeartbeatLevel}, true},
		{"one below it", [2]int{rules.CompactHeartbeatLevel, rules.CompactHeartbeatLevel - 1}, false},
		{"neither says", [2]int{0, 0}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := twoNodeRules(5, 50, 50)
			for i := range st.Nodes {
				st.Nodes[i].CommandLevel = tc.levels[i]
			}
			now := time.Unix(1000, 0)
			p := newMemberPair(t, st, &now, nil)
			seen := 0
			for range 20 {
				now = now.Add(10 * time.Millisecond)
				for _, msg := range append(p.inbox[0], p.inbox[1]...) {
					seen++
					if msg.CompactAcks != tc.want {
						t.Fatalf("levels %v: a heartbeat with compact acks %v, want %v", tc.levels, msg.CompactAcks, tc.want)
					}
				}
				p.step()
			}
			if seen == 0 {
				t.Fatal("no heartbeat sent")
			}
		})
	}
}
