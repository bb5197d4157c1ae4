package node

import (
	"net"
	"net/netip"
	"sort"
	"time"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
	"github.com/shoalnet/shoal/rules"
)

// Forwarding is what routed mode's forwarding needs of the host; a node
// without it keeps whatever the routers send it (plain ECMP).
type Forwarding struct {
	// MTU is the cluster interface's.
	MTU func() int
	// NextHops returns, for each address, the MAC a packet to it leaves
	// with: its own, or its gateway's when it is on another subnet;
	// missing when not known.
	NextHops func(addrs []netip.Addr) map[netip.Addr]net.HardwareAddr
}

// forwarder completes routed tables with where the packets a node does not
// take go (filter.Tables.Forward). Owned by the reconciler's goroutine.
type forwarder struct {
	host *Forwarding
	// The owners of the view the tables were last completed for, and of
	// the view before it: a bucket this node acquires is still its
	// previous owner's until that owner lets it go.
	view       heartbeat.View
	owners     *filter.Owners
	cfg        *filter.Config
	prevOwners *filter.Owners
	prevCfg    *filter.Config
	// unresolved: a live peer's next hop had no known MAC when the tables
	// were last completed (its packets are dropped): they are completed
	// again every resolveEvery until it has one.
	unresolved bool
}

// complete fills t's forwarding for snapshot s: every bucket's packets
// that this node does not take go to the bucket's owner in the view, or,
// when that is this node, to a peer that advertises holding connections
// in it (draining) or else to its owner in the previous view: the node
// that may hold a connection this one does not (the second chance).
// Nothing when this node has no IPv4 heartbeat address or its plug is
// pulled.
//
// owners come from the reconciler's assigner, which the hand-overs of the
// same view ask too.
func (f *forwarder) complete(s *Snap, self filter.NodeID, t *filter.Tables, assign *sharedAssigner) {
	me := NodeAddr(s.rs, self)
	if !me.IsValid() || s.plugged {
		return
	}
	owners := assign.assign(s.fcfg, nodeIDs(s.hb.View.Eligible))
	if !s.hb.View.Equal(f.view) || f.cfg != s.fcfg {
		// A view that moves no bucket (another rules index: a request
		// retried, a node's info) keeps the owners before the last move.
		if !sameOwners(owners, f.owners) {
			f.prevOwners, f.prevCfg = f.owners, f.cfg
		}
		f.owners, f.cfg, f.view = owners, s.fcfg, s.hb.View
	}
	var samePrev func(filter.RuleID) bool
	if f.prevOwners != nil {
		samePrev = sameFlows(f.prevCfg, s.fcfg)
	}
	t.Self, t.MTU = me, f.host.MTU()

	// Every other member gets an index, in ID order.
	ids := make([]filter.NodeID, 0, len(s.rs.Nodes))
	for _, n := range s.rs.Nodes {
		if n.ID != self && NodeAddr(s.rs, n.ID).IsValid() {
			ids = append(ids, n.ID)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	if len(ids) > filter.MaxForward-1 {
		ids = ids[:filter.MaxForward-1]
	}
	addrs := make([]netip.Addr, len(ids))
	index := make(map[filter.NodeID]uint8, len(ids))
	for i, id := range ids {
		addrs[i] = NodeAddr(s.rs, id)
		index[id] = uint8(i + 1)
		t.Peers[i+1] = addrs[i]
	}
	macs := f.host.NextHops(addrs)
	live := map[filter.NodeID]bool{}
	for _, p := range s.hb.Peers {
		live[filter.NodeID(p.ID)] = p.Live
	}
	f.unresolved = false
	for i, a := range addrs {
		copy(t.PeerMACs[i+1][:], macs[a])
		f.unresolved = f.unresolved || len(macs[a]) != 6 && live[ids[i]]
	}

	drainers := map[filter.RuleID]map[uint16]filter.NodeID{}
	for _, p := range s.hb.Peers {
		if !p.Live {
			continue
		}
		for id, bs := range p.Draining {
			m := drainers[filter.RuleID(id)]
			if m == nil {
				m = map[uint16]filter.NodeID{}
				drainers[filter.RuleID(id)] = m
			}
			for _, b := range bs {
				if _, ok := m[b]; !ok {
					m[b] = filter.NodeID(p.ID)
				}
			}
		}
	}
	t.Forward = make(map[filter.RuleID]*[filter.NumBuckets]uint8, len(owners.Rules))
	for id, own := range owners.Rules {
		fw := new([filter.NumBuckets]uint8)
		var prev *[filter.NumBuckets]filter.NodeID
		if samePrev != nil && samePrev(id) {
			prev = f.prevOwners.Rules[id]
		}
		for b, o := range own {
			to := o
			if o == self || o == filter.NoNode {
				to = filter.NoNode
				if d, ok := drainers[id][uint16(b)]; ok {
					to = d
				} else if prev != nil && prev[b] != self {
					to = prev[b]
				}
			}
			fw[b] = index[to]
		}
		t.Forward[id] = fw
	}
}

// sameOwners reports whether a and b give every bucket of every rule the
// same owner, with the same meaning.
func sameOwners(a, b *filter.Owners) bool {
	if a == nil || b == nil || len(a.Rules) != len(b.Rules) {
		return a == b
	}
	for id, own := range a.Rules {
		o := b.Rules[id]
		if o == nil || o != own && *o != *own || !a.Maps[id].Equal(b.Maps[id]) {
			return false
		}
	}
	return true
}

// resolveEvery is how often tables are completed again while a live peer's
// next hop has no known MAC (its heartbeats resolve it within a period or
// two).
const resolveEvery = time.Second

// NodeAddr returns node id's heartbeat address if it is IPv4, the address
// packets are forwarded to it at; the zero Addr otherwise.
func NodeAddr(rs *rules.State, id filter.NodeID) netip.Addr {
	n := rs.Node(id)
	if n == nil {
		return netip.Addr{}
	}
	ap, err := netip.ParseAddrPort(n.HeartbeatAddr)
	if err != nil || !ap.Addr().Unmap().Is4() || ap.Addr().IsUnspecified() {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// MemberAddrs returns the members' addresses that forwarded packets are
// taken from: their IPv4 heartbeat addresses.
func MemberAddrs(rs *rules.State) []netip.Addr {
	var out []netip.Addr
	for _, n := range rs.Nodes {
		if a := NodeAddr(rs, n.ID); a.IsValid() {
			out = append(out, a)
		}
	}
	return out
}
