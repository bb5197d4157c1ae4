package node

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
	"github.com/shoalnet/shoal/rules"
)

// TestRoutedForwardTargets runs three nodes in routed mode with forwarding:
// every bucket is taken by exactly one node (ownership, not "everything
// the router sends"), and every other node forwards it to that node, by
// its address and with its MAC, from its own address.
func TestRoutedForwardTargets(t *testing.T) {
	c := newTestCluster(t, 3, 20*time.Millisecond)
	c.forward = &Forwarding{
		MTU: func() int { return 1500 },
		NextHops: func(addrs []netip.Addr) map[netip.Addr]net.HardwareAddr {
			out := map[netip.Addr]net.HardwareAddr{}
			for _, a := range addrs {
				out[a] = testMAC(int(a.As4()[3]))
			}
			return out
		},
	}
	c.rules.set(func(st *rules.State) { st.Settings.MACMode = rules.MACRouted })
	for i := 1; i <= 3; i++ {
		c.start(i)
	}
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{127, 0, 0, byte(i)}) }
	check := func() error {
		for b := range filter.NumBuckets {
			owner := 0
			for i, tn := range c.nodes {
				t := tn.dp.kernel.Load()
				if t == nil || !t.Forwarding() || t.States[1] == nil {
					return errString("node tables not forwarding yet")
				}
				if t.States[1][b] == filter.Owned {
					if owner != 0 {
						return errString("a bucket owned twice")
					}
					owner = i + 1
				}
			}
			if owner == 0 {
				return errString("a bucket owned by nobody")
			}
			for i, tn := range c.nodes {
				if i+1 == owner {
					continue
				}
				t := tn.dp.kernel.Load()
				to := t.ForwardTarget(1, uint16(b))
				if to != addr(owner) {
					return errString("a node forwards a bucket elsewhere than its owner")
				}
				idx := t.Forward[1][b]
				if net.HardwareAddr(t.PeerMACs[idx][:]).String() != testMAC(owner).String() {
					return errString("a forward target without its MAC")
				}
			}
		}
		return nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for err := check(); err != nil; err = check() {
		if time.Now().After(deadline) {
			t.Fatalf("routed tables: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i, tn := range c.nodes {
		if got := tn.dp.kernel.Load().Self; got != addr(i+1) {
			t.Errorf("node %d forwards from %s, want %s", i+1, got, addr(i+1))
		}
	}

}

type errString string

func (e errString) Error() string { return string(e) }

// TestForwardRemembersTheLastOwnersThroughViewsThatMoveNothing completes
// the routed tables of node 3 as it joins two others: the buckets it is
// given go to their previous owners meanwhile (the second chance). A view
// that moves no bucket (a write that changes no owner, such as a request
// retried, is a rules index of its own) must not make those previous
// owners forgotten: node 3 would drop the packets of connections its
// peers still hold.
func TestForwardRemembersTheLastOwnersThroughViewsThatMoveNothing(t *testing.T) {
	st := &rules.State{
		Index:    1,
		Settings: rules.Settings{ClusterID: 7, HashSeed: 1, MACMode: rules.MACRouted},
		VIPs:     []netip.Addr{netip.MustParseAddr("198.18.7.100")},
		Rules: []filter.Rule{{ID: 1, VIP: netip.MustParseAddr("198.18.7.100"), PortLo: 80, PortHi: 80,
			Proto: filter.ProtoTCP, Mode: filter.ModeMultiple, Affinity: filter.AffinityNone}},
	}
	for i := 1; i <= 3; i++ {
		st.Nodes = append(st.Nodes, rules.Node{ID: filter.NodeID(i), Admin: rules.AdminStarted, NodeInfo: rules.NodeInfo{
			Name: fmt.Sprintf("n%d", i), HostPriority: i, HeartbeatAddr: fmt.Sprintf("127.0.0.%d:7946", i)}})
	}
	f := &forwarder{host: &Forwarding{
		MTU: func() int { return 1500 },
		NextHops: func(addrs []netip.Addr) map[netip.Addr]net.HardwareAddr {
			out := map[netip.Addr]net.HardwareAddr{}
			for _, a := range addrs {
				out[a] = testMAC(int(a.As4()[3]))
			}
			return out
		},
	}}
	assign := &sharedAssigner{}
	snap := func(index uint64, eligible ...uint32) *Snap {
		rs := st.Clone()
		rs.Index = index
		s := &Snap{rs: rs, fcfg: rs.FilterConfig()}
		s.hb.View = heartbeat.View{Eligible: eligible, RulesIndex: index, Seed: 1}
		for _, id := range []uint32{1, 2} {
			s.hb.Peers = append(s.hb.Peers, heartbeat.PeerStatus{ID: id, Live: true})
		}
		return s
	}
	complete := func(s *Snap) *filter.Tables {
		tb := &filter.Tables{Config: s.fcfg, Routed: true}
		f.complete(s, 3, tb, assign)
		return tb
	}
	complete(snap(1, 1, 2))
	joined := complete(snap(2, 1, 2, 3))
	again := complete(snap(3, 1, 2, 3))
	before := assign.assign(snap(1, 1, 2).fcfg, []filter.NodeID{1, 2})
	mine, kept := 0, 0
	for b, o := range assign.assign(snap(3, 1, 2, 3).fcfg, []filter.NodeID{1, 2, 3}).Rules[1] {
		if o != 3 {
			continue
		}
		mine++
		want := netip.AddrFrom4([4]byte{127, 0, 0, byte(before.Rules[1][b])})
		if got := joined.ForwardTarget(1, uint16(b)); got != want {
			t.Fatalf("bucket %d after the join: forwarded to %v, want its previous owner %v", b, got, want)
		}
		if again.ForwardTarget(1, uint16(b)) == want {
			kept++
		}
	}
	if mine == 0 || kept != mine {
		t.Errorf("after a view that moved nothing, %d of node 3's %d buckets still go to their previous owner", kept, mine)
	}
}
