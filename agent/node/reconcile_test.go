package node

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/shoalnet/shoal/agent/track"
	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
	"github.com/shoalnet/shoal/rules"
)

func TestPlanTables(t *testing.T) {
	cfg := &filter.Config{Seed: 1, VIPs: []netip.Addr{netip.MustParseAddr("198.18.7.100")},
		Rules: []filter.Rule{{ID: 1, PortLo: 80, PortHi: 80, Proto: filter.ProtoTCP}},
		Nodes: []filter.Node{{ID: 1, HostPriority: 1}, {ID: 2, HostPriority: 2}}}
	set := func(bs ...uint16) filter.Set {
		s := filter.Set{}
		for _, b := range bs {
			s.Add(1, b)
		}
		return s
	}
	accept, peers, held := set(1, 2, 3), set(2), set(3, 7)
	tests := []struct {
		name         string
		admin        rules.AdminState
		plugged      bool
		want         map[uint16]filter.BucketState
		wantDraining []uint16
	}{
		{"started", rules.AdminStarted, false,
			map[uint16]filter.BucketState{1: filter.Owned, 2: filter.OwnedDirty, 3: filter.Owned, 7: filter.Draining, 9: filter.NotOwned},
			[]uint16{7}},
		{"draining keeps its connections", rules.AdminDraining, false,
			map[uint16]filter.BucketState{1: filter.Owned, 7: filter.Draining}, []uint16{7}},
		{"stopped cuts everything but what it accepts", rules.AdminStopped, false,
			map[uint16]filter.BucketState{7: filter.NotOwned}, nil},
		{"plug pulled keeps nothing", rules.AdminStarted, true,
			map[uint16]filter.BucketState{1: filter.NotOwned, 2: filter.NotOwned, 3: filter.NotOwned, 7: filter.NotOwned}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := planTables(cfg, 1, tc.admin, tc.plugged, accept, peers, held)
			for b, want := range tc.want {
				if got := p.tables.States[1][b]; got != want {
					t.Errorf("bucket %d: %s, want %s", b, got, want)
				}
			}
			if got := p.draining.Count(); got != len(tc.wantDraining) {
				t.Errorf("announces %d draining buckets, want %v", got, tc.wantDraining)
			}
			for _, b := range tc.wantDraining {
				if !p.draining.Has(1, b) {
					t.Errorf("bucket %d not announced as draining", b)
				}
			}
		})
	}
}

func TestBucketsWireRoundTrip(t *testing.T) {
	s := filter.Set{}
	s.Add(0, 0)
	s.Add(1, 4095)
	s.Add(1, 17)
	back := filter.Set{}
	addBuckets(back, toHeartbeat(s))
	if !back.Equal(s) {
		t.Errorf("round trip lost buckets: %v -> %v", s, back)
	}
}

// TestPeersDraining checks that a live peer on another rules index makes
// every bucket dirty (its announcements are in other coordinates), and so
// does a peer that may still serve its connections (a stalled agent), and
// that otherwise the live peers' announcements are taken together as they
// are, and a dead peer's are not.
func TestPeersDraining(t *testing.T) {
	cfg := &filter.Config{Rules: []filter.Rule{{ID: 4, PortLo: 80, PortHi: 80, Proto: filter.ProtoTCP}}}
	// Every case has node 5, live on index 10, draining bucket 9.
	five := heartbeat.PeerStatus{ID: 5, Live: true, RulesIndex: 10, Draining: heartbeat.Buckets{4: {9}}}
	tests := []struct {
		name      string
		peers     []heartbeat.PeerStatus
		wantCount int
	}{
		{"same index", []heartbeat.PeerStatus{{ID: 2, Live: true, RulesIndex: 10}}, 1},
		{"two live peers drain", []heartbeat.PeerStatus{{ID: 2, Live: true, RulesIndex: 10, Draining: heartbeat.Buckets{4: {9, 4095}}}}, 2},
		{"the second list adds to the first", []heartbeat.PeerStatus{{ID: 2, Live: true, RulesIndex: 10, Draining: heartbeat.Buckets{4: {10}}}}, 2},
		{"a peer drains every bucket", []heartbeat.PeerStatus{{ID: 2, Live: true, RulesIndex: 10, Draining: heartbeat.Buckets{4: everyBucket()}}}, filter.NumBuckets},
		{"dead peer on an old index", []heartbeat.PeerStatus{{ID: 2, RulesIndex: 9}}, 1},
		{"dead peer's announcement", []heartbeat.PeerStatus{{ID: 2, RulesIndex: 10, Draining: heartbeat.Buckets{4: {10}}}}, 1},
		{"live peer behind", []heartbeat.PeerStatus{{ID: 2, Live: true, RulesIndex: 10}, {ID: 3, Live: true, RulesIndex: 9}}, 2 * filter.NumBuckets},
		{"live peer ahead", []heartbeat.PeerStatus{{ID: 3, Live: true, RulesIndex: 11}}, 2 * filter.NumBuckets},
		{"dead peer that may hold connections", []heartbeat.PeerStatus{{ID: 2, Live: true, RulesIndex: 10}, {ID: 3, RulesIndex: 10, MayHold: true}}, 2 * filter.NumBuckets},
		{"back, listening, may hold", []heartbeat.PeerStatus{{ID: 3, Live: true, RulesIndex: 10, MayHold: true}}, 2 * filter.NumBuckets},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := peersDraining(cfg, 10, append(tc.peers, five))
			if got.Count() != tc.wantCount || !got.Has(4, 9) {
				t.Errorf("%d dirty buckets (bucket 9 of rule 4: %v), want %d", got.Count(), got.Has(4, 9), tc.wantCount)
			}
		})
	}
}

// TestHandoffPushesNothingTwice: the reconciler pushes tables only when
// they change, and scans sockets only after tables that release buckets, so
// that a new owner's push of the buckets it acquires never waits behind a
// scan or a redundant push (issue 10: a SYN that finds no owner waits a
// second). A node whose peer leaves (nothing released here) must report the
// new view in the kernel without a scan or a push; the push that acquires
// follows as soon as the view converges.
func TestHandoffPushesNothingTwice(t *testing.T) {
	const period = 100 * time.Millisecond
	r := twoNodeRules(5, 50, 50)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	p := newMemberPair(t, r, &now, nil)
	ms, inbox := p.ms, &p.inbox
	// Node 1's data plane, with a tracker that counts its scans.
	var scans int
	trk := track.New(func([]netip.Addr) ([]track.Conn, error) { scans++; return nil, nil }, log)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go trk.Run(ctx)
	dp := &fakeDP{}
	rec := newReconciler(1, log, dp, func() net.HardwareAddr { return net.HardwareAddr{2, 0, 0, 0, 0, 1} }, trk, ms[0].toDP, ms[0].reports)
	rec.now = clock
	push := func() pushReport {
		t.Helper()
		rec.snap = ms[0].toDP.Take()
		epoch := rec.epoch
		rec.reconcile(ctx, now)
		rep := ms[0].reports.Take()
		if rec.epoch != epoch {
			// Tables that release buckets ask for a scan once they are
			// in; take its result, as the reconciler's goroutine would.
			select {
			case <-trk.Out.Ready:
				rec.held = trk.Out.Take()
			case <-time.After(10 * time.Second):
				t.Fatal("no scan after tables that release buckets")
			}
		}
		if !rep.ok || rep.snap != rec.snap {
			t.Fatalf("no report of snapshot %d in the kernel", rec.snap.gen)
		}
		ms[0].takeReport(rep)
		return rep
	}
	step := func(peers bool) {
		now = now.Add(period / 10)
		for i, m := range ms {
			if i == 1 && !peers {
				inbox[1] = nil
				continue
			}
			p.deliver(i)
			m.step(now)
			if i == 1 {
				m.takeReport(pushReport{snap: m.snap.Load(), ok: true, healthy: true})
			} else {
				push()
			}
		}
	}
	for range 200 {
		step(true)
	}
	if s := ms[0].snap.Load(); !s.hb.Converged || len(s.hb.View.Eligible) != 2 {
		t.Fatalf("node 1 did not converge with node 2: view %v converged %v", s.hb.View, s.hb.Converged)
	}
	updates, scanned := dp.updates.Load(), scans
	tablesAt := rec.pub.Load().tablesAt
	if tablesAt.IsZero() {
		t.Fatal("tables pushed, but no time published for them")
	}
	// Node 2 stops: once its tables are in it sends a heartbeat that says
	// so, then nothing.
	ms[1].leaving = true
	step(true)
	step(true)
	var acquired bool
	for range 50 {
		step(false)
		s := ms[0].snap.Load()
		if s.hb.View.Has(2) {
			continue
		}
		if !s.hb.Converged {
			if scans != scanned {
				t.Fatalf("node 1 scanned sockets for a view that releases nothing here (%d scans; view %v, accepting %d buckets, kernel tables accept %v)",
					scans-scanned, s.hb.View, s.hb.Accept.get().Buckets.Count(), stateCounts(rec.last.tables, filter.Owned))
			}
			if n := dp.updates.Load(); n != updates {
				t.Fatalf("node 1 pushed %d tables for a view that changes none of its buckets", n-updates)
			}
			if at := rec.pub.Load().tablesAt; !at.Equal(tablesAt) {
				t.Fatalf("tables unchanged, but their time moved from %v to %v", tablesAt, at)
			}
			continue
		}
		if got := s.hb.Accept.get().Buckets[1].Count(); got != filter.NumBuckets {
			t.Fatalf("node 1 alone accepts %d buckets of rule 1, want all %d", got, filter.NumBuckets)
		}
		if k := dp.kernel.Load(); k == nil || stateCounts(k, filter.Owned)[1] != filter.NumBuckets {
			t.Fatalf("converged alone, node 1's kernel tables do not accept every bucket")
		}
		if at := rec.pub.Load().tablesAt; !at.Equal(now) {
			t.Fatalf("the tables that acquire went in at %v, published as %v", now, at)
		}
		acquired = true
		break
	}
	if !acquired {
		t.Fatal("node 1 never converged alone after node 2 left")
	}
	if n := dp.updates.Load() - updates; n != 1 {
		t.Errorf("node 1 pushed %d tables from node 2's leaving to its acquisition, want 1 (the acquisition)", n)
	}
}

func everyBucket() []uint16 {
	l := make([]uint16, filter.NumBuckets)
	for i := range l {
		l[i] = uint16(i)
	}
	return l
}

// BenchmarkPeersDrainingRemap is peersDraining through a remap of a
// 32-node cluster: every live peer drains every bucket of two rules but
// its own share.
func BenchmarkPeersDrainingRemap(b *testing.B) {
	cfg := &filter.Config{Rules: []filter.Rule{{ID: 1, PortLo: 80, PortHi: 80, Proto: filter.ProtoTCP}, {ID: 2, PortLo: 443, PortHi: 443, Proto: filter.ProtoTCP}}}
	var peers []heartbeat.PeerStatus
	for id := uint32(2); id <= 32; id++ {
		var l []uint16
		for k := range uint16(filter.NumBuckets) {
			if uint32(k)%32 != id-1 {
				l = append(l, k)
			}
		}
		peers = append(peers, heartbeat.PeerStatus{ID: id, Live: true, RulesIndex: 10, Draining: heartbeat.Buckets{1: l, 2: l}})
	}
	b.ReportAllocs()
	for b.Loop() {
		if got := peersDraining(cfg, 10, peers); got.Count() != 2*filter.NumBuckets {
			b.Fatalf("%d buckets, want %d", got.Count(), 2*filter.NumBuckets)
		}
	}
}
