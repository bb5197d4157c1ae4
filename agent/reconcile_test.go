package agent

import (
	"net/netip"
	"testing"

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
	back := fromHeartbeat(toHeartbeat(s))
	if !back.Equal(s) {
		t.Errorf("round trip lost buckets: %v -> %v", s, back)
	}
}

// TestPeersDraining checks that a live peer on another rules index makes
// every bucket dirty (its announcements are in other coordinates), and so
// does a peer that may still serve its connections (a stalled agent), and
// that otherwise the peers' announcements are taken as they are.
func TestPeersDraining(t *testing.T) {
	cfg := &filter.Config{Rules: []filter.Rule{{ID: 4, PortLo: 80, PortHi: 80, Proto: filter.ProtoTCP}}}
	union := heartbeat.Buckets{4: {9}}
	tests := []struct {
		name      string
		peers     []heartbeat.PeerStatus
		wantCount int
	}{
		{"same index", []heartbeat.PeerStatus{{ID: 2, Live: true, RulesIndex: 10}}, 1},
		{"dead peer on an old index", []heartbeat.PeerStatus{{ID: 2, RulesIndex: 9}}, 1},
		{"live peer behind", []heartbeat.PeerStatus{{ID: 2, Live: true, RulesIndex: 10}, {ID: 3, Live: true, RulesIndex: 9}}, 2 * filter.NumBuckets},
		{"live peer ahead", []heartbeat.PeerStatus{{ID: 3, Live: true, RulesIndex: 11}}, 2 * filter.NumBuckets},
		{"dead peer that may hold connections", []heartbeat.PeerStatus{{ID: 2, Live: true, RulesIndex: 10}, {ID: 3, RulesIndex: 10, MayHold: true}}, 2 * filter.NumBuckets},
		{"back, listening, may hold", []heartbeat.PeerStatus{{ID: 3, Live: true, RulesIndex: 10, MayHold: true}}, 2 * filter.NumBuckets},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := peersDraining(cfg, 10, tc.peers, union)
			if got.Count() != tc.wantCount || !got.Has(4, 9) {
				t.Errorf("%d dirty buckets (bucket 9 of rule 4: %v), want %d", got.Count(), got.Has(4, 9), tc.wantCount)
			}
		})
	}
}
