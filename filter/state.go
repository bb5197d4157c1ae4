package filter

import (
	"math/bits"
	"net/netip"
)

// Bitmap is a set of buckets of one rule.
type Bitmap [NumBuckets / 64]uint64

// Has reports whether bucket b is in the set.
func (m *Bitmap) Has(b uint16) bool { return m[b/64]&(1<<(b%64)) != 0 }

// Add puts bucket b in the set.
func (m *Bitmap) Add(b uint16) { m[b/64] |= 1 << (b % 64) }

// Count returns the number of buckets in the set.
func (m *Bitmap) Count() int {
	n := 0
	for _, w := range m {
		n += bits.OnesCount64(w)
	}
	return n
}

// Set is a set of (rule, bucket) pairs. A missing rule is an empty set.
type Set map[RuleID]*Bitmap

// Has reports whether bucket b of rule id is in the set.
func (s Set) Has(id RuleID, b uint16) bool {
	m := s[id]
	return m != nil && m.Has(b)
}

// Add puts bucket b of rule id in the set.
func (s Set) Add(id RuleID, b uint16) {
	m := s[id]
	if m == nil {
		m = new(Bitmap)
		s[id] = m
	}
	m.Add(b)
}

// Count returns the number of pairs in the set.
func (s Set) Count() int {
	n := 0
	for _, m := range s {
		n += m.Count()
	}
	return n
}

// Intersect returns the pairs in both s and o.
func (s Set) Intersect(o Set) Set {
	out := Set{}
	for id, m := range s {
		om := o[id]
		if om == nil {
			continue
		}
		var r Bitmap
		any := false
		for i := range r {
			r[i] = m[i] & om[i]
			any = any || r[i] != 0
		}
		if any {
			out[id] = &r
		}
	}
	return out
}

// Minus returns the pairs of s that are not in o.
func (s Set) Minus(o Set) Set {
	out := Set{}
	for id, m := range s {
		om := o[id]
		var r Bitmap
		any := false
		for i := range r {
			r[i] = m[i]
			if om != nil {
				r[i] &^= om[i]
			}
			any = any || r[i] != 0
		}
		if any {
			out[id] = &r
		}
	}
	return out
}

// Equal reports whether s and o hold the same pairs.
func (s Set) Equal(o Set) bool {
	return s.Intersect(o).Count() == s.Count() && s.Count() == o.Count()
}

// Owned returns the buckets that node me owns.
func (o *Owners) Owned(me NodeID) Set {
	s := Set{}
	for id, t := range o.Rules {
		for b, n := range t {
			if n == me {
				s.Add(id, uint16(b))
			}
		}
	}
	return s
}

// BucketState is what a node does with packets of one bucket.
type BucketState uint8

// Bucket states, as DESIGN.md defines them.
const (
	NotOwned   BucketState = iota // accept nothing
	Owned                         // accept everything
	OwnedDirty                    // accept SYNs and packets of connections I hold
	Draining                      // accept only packets of connections I hold
)

// TakesSYNs reports whether a bucket in state s takes new connections
// (Owned, OwnedDirty).
func (s BucketState) TakesSYNs() bool { return s == Owned || s == OwnedDirty }

func (s BucketState) String() string {
	switch s {
	case NotOwned:
		return "not-owned"
	case Owned:
		return "owned"
	case OwnedDirty:
		return "owned-dirty"
	case Draining:
		return "draining"
	}
	return "invalid"
}

// MaxHandTo bounds the hand-over indexes of one set of tables: 0 is none,
// 1 to MaxHandTo-3 index HandMACs, HandKeep marks a bucket whose SYNs this
// node keeps under Prev, and HandPending a bucket about to be acquired.
const MaxHandTo = 64

// HandKeep, as a bucket's HandTo index in a rule Prev remaps, says that a
// SYN there which Prev's states take is taken here still: its owner under
// the new mapping does not advertise the new rules yet, so it neither takes
// the flooded copy nor one handed over (see Tables.Prev).
const HandKeep = MaxHandTo - 2

// HandPending, as a bucket's HandTo index, marks a DRAINING bucket this
// node owns in its view and is about to acquire: the one kind of bucket a
// SYN handed over to this node is taken in. A bucket draining because this
// node released it holds the same state byte otherwise, and a SYN handed
// there by a node a view behind (to the bucket's owner in that view) must
// not be taken: the owner in the newer view takes the flooded copy too
// (a join followed within the hand-over grace by a weight change answered
// one SYN from two nodes, and the client was reset).
const HandPending = MaxHandTo - 1

// Tables is one node's complete data-plane input: the config that maps
// packets to rules and buckets, and the node's state for every bucket.
type Tables struct {
	Config *Config
	States map[RuleID]*[NumBuckets]BucketState
	// HandTo gives, per rule and bucket, the index in HandMACs of the node
	// a SYN is handed over to when this node does not take it (a bucket it
	// released, whose new owner may not have taken it yet; see HandOver);
	// 0 or a missing rule: none.
	HandTo   map[RuleID]*[NumBuckets]uint8
	HandMACs [MaxHandTo][6]byte
	// Prev, when set, is the tables this node judged by before a change of
	// rules remapped flows (Config.Remapped): the mapping its peers that
	// have not applied the change still judge by. A SYN in a rule Prev
	// remaps is judged under Prev first: if Prev's states take it (this
	// node owned the flow before), it is taken here while the bucket's new
	// owner cannot take it (HandKeep, HandPending) and handed over to the
	// new owner once it can (a HandTo index); a SYN Prev's states do not
	// take is judged by these tables alone, and never handed over from
	// here. The data plane keeps Prev's copy of the tables as they were
	// pushed; Prev itself has no Prev.
	Prev *Tables
	// Routed: the cluster is in routed mode, where the routers send each
	// node its flows at its own MAC. A SYN so addressed is then a client's,
	// not one handed over by a peer (there is no flooded copy to hand), and
	// no SYN is handed over by MAC: forwarding does it (Forward).
	Routed bool
	// Self, in routed mode, is this node's address, from which it forwards
	// (an IPv4 address); the zero Addr turns forwarding off. A VIP packet
	// these tables do not take (a NotOwned bucket, a Draining one without
	// the connection, an OwnedDirty one without it) is then forwarded,
	// encapsulated in IPv4, to the node Forward names for its bucket,
	// unless it made MaxHops hops already; a packet forwarded to Self from a
	// member (SetMembers) is judged as the packet it carries, and a SYN so
	// forwarded by a pending bucket's forward target is taken
	// (the hand-over of the multicast modes).
	Self netip.Addr
	// Forward gives per rule and bucket the index in Peers of the node a
	// packet is forwarded to; 0 or a missing rule: none.
	Forward map[RuleID]*[NumBuckets]uint8
	Peers   [MaxForward]netip.Addr
	// PeerMACs are the next hops' MACs to Peers, by the same index: the
	// peer's own, or its gateway's when it is on another subnet. A packet
	// is forwarded out by the interface it came in by; without a MAC it is
	// dropped.
	PeerMACs [MaxForward][6]byte
	// MTU bounds what is forwarded: a packet that would exceed it once
	// encapsulated is dropped (0: no bound). SYN-ACKs sent from a VIP
	// advertise an MSS that leaves room for the encapsulation (MSS).
	MTU int
}

// MaxForward bounds the forward targets of one set of tables (index 0 is
// none); MaxHops the times a packet is forwarded.
const (
	MaxForward = 64
	MaxHops    = 3
	// EncapOverhead is what forwarding adds to a packet: an IPv4 header.
	EncapOverhead = 20
)

// Forwarding reports whether the tables forward (routed mode, Self set).
func (t *Tables) Forwarding() bool { return t.Routed && t.Self.IsValid() }

// MSS returns the MSS that SYN-ACKs from a VIP advertise at most to IPv4
// and IPv6 clients when the tables forward, so that a full-size segment
// still fits the MTU once encapsulated; 0: left alone.
func (t *Tables) MSS() (v4, v6 uint16) {
	if !t.Forwarding() || t.MTU <= 0 {
		return 0, 0
	}
	return uint16(max(t.MTU-EncapOverhead-40, 0)), uint16(max(t.MTU-EncapOverhead-60, 0))
}

// forwardTo returns the index in Peers of the node a packet of bucket b
// of rule id goes to, 0 for none.
func (t *Tables) forwardTo(id RuleID, b uint16) int {
	f := t.Forward[id]
	if f == nil || int(f[b]) >= MaxForward || !t.Peers[f[b]].IsValid() {
		return 0
	}
	return int(f[b])
}

// ForwardTarget returns the node a packet of bucket b of rule id goes to
// when these tables do not take it (routed mode); the zero Addr for none.
func (t *Tables) ForwardTarget(id RuleID, b uint16) netip.Addr {
	if !t.Forwarding() {
		return netip.Addr{}
	}
	return t.Peers[t.forwardTo(id, b)]
}

// peerIndex returns the first index in Peers of address a, 0 for none.
func (t *Tables) peerIndex(a netip.Addr) int {
	for i := 1; i < MaxForward; i++ {
		if t.Peers[i] == a {
			return i
		}
	}
	return 0
}

// Remapped returns the rules of t whose bucket numbers Prev does not map
// the same way: Prev's mapping of the rule's flows is another (a changed
// seed or affinity, coverage that grew). Nil without Prev.
func (t *Tables) Remapped() map[RuleID]bool {
	if t.Prev == nil {
		return nil
	}
	return t.Config.Remapped(t.Prev.Config)
}

// pending reports whether bucket b of rule id is marked HandPending.
func (t *Tables) pending(id RuleID, b uint16) bool {
	h := t.HandTo[id]
	return h != nil && h[b] == HandPending
}

// handTo returns the MAC a SYN in bucket b of rule id is handed over to.
func (t *Tables) handTo(id RuleID, b uint16) ([6]byte, bool) {
	h := t.HandTo[id]
	if h == nil || h[b] == 0 || h[b] >= HandKeep {
		return [6]byte{}, false
	}
	mac := t.HandMACs[h[b]]
	return mac, mac != [6]byte{}
}

// NewTables computes node me's bucket states. accept is its accepting set
// (from convergence), peersDraining the buckets other nodes still hold
// connections in, myDraining the buckets it holds connections in itself.
// A rule disabled cluster-wide, or on this node, accepts nothing at all.
func NewTables(c *Config, me NodeID, accept, peersDraining, myDraining Set) *Tables {
	t := &Tables{Config: c, States: make(map[RuleID]*[NumBuckets]BucketState, len(c.Rules)+1)}
	node := c.Node(me)
	for _, id := range c.RuleIDs() {
		st := new([NumBuckets]BucketState)
		t.States[id] = st
		if disabled(c, node, id) {
			continue
		}
		// The rule's bitmaps once, not a map lookup per bucket: every
		// push computes these tables, and in a 32-node lab's rule changes
		// the lookups were the largest part of a push's CPU.
		var none Bitmap
		acc, pd, md := bitmapOr(accept[id], &none), bitmapOr(peersDraining[id], &none), bitmapOr(myDraining[id], &none)
		for b := range st {
			bk := uint16(b)
			switch {
			case acc.Has(bk) && pd.Has(bk):
				st[b] = OwnedDirty
			case acc.Has(bk):
				st[b] = Owned
			case md.Has(bk):
				st[b] = Draining
			}
		}
	}
	return t
}

// bitmapOr is m, or none when m is nil.
func bitmapOr(m, none *Bitmap) *Bitmap {
	if m == nil {
		return none
	}
	return m
}

func disabled(c *Config, node *Node, id RuleID) bool {
	if r := c.Rule(id); r != nil && (r.Mode == ModeDisabled || r.State == RuleDisabled) {
		return true
	}
	return node != nil && node.RuleOf(id).State == RuleDisabled
}
