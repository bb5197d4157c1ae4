package filter

import (
	"cmp"
	"encoding/binary"
	"hash/fnv"
	"net/netip"
	"slices"
)

// A bucket number stands for a set of flows only under a given mapping: the
// hash seed, the rule's flow key (affinity) and the traffic the rule covers.
// When the mapping changes, bucket b of a rule may hold other flows than
// before, so a node that keeps "its" bucket b would take packets of
// connections other nodes hold. Grant carries the mapping along with the
// buckets so that the accepting set keeps a rule's buckets only while they
// mean what they meant when they were granted.

// Span is a range of destination ports of one protocol on one VIP. Proto
// is ProtoTCP or ProtoUDP; 0 stands for the other protocols (ICMP and the
// rest), which have no ports (Lo = Hi = 0) and belong to DefaultRule.
type Span struct {
	VIP    netip.Addr
	Proto  Protocol
	Lo, Hi uint16
}

func compareSpans(a, b Span) int {
	if c := a.VIP.Compare(b.VIP); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Proto, b.Proto); c != 0 {
		return c
	}
	return cmp.Compare(a.Lo, b.Lo)
}

// Mapping is what a rule's bucket numbers mean: the flows the rule covers
// (Cover: sorted, disjoint, adjacent spans merged) and how a flow's bucket
// is computed from it (Seed, Affinity). Two rules' mappings are compared
// with Within; Fingerprint names one for logs and status.
type Mapping struct {
	Seed     uint32
	Affinity Affinity
	Cover    []Span
}

// Within reports whether every flow m maps, o maps to the same bucket: the
// same seed and affinity, and m's coverage inside o's. A bucket granted
// under o may be kept under m exactly then. A nil Mapping covers nothing.
func (m *Mapping) Within(o *Mapping) bool {
	if m == nil || len(m.Cover) == 0 {
		return true
	}
	if o == nil || m.Seed != o.Seed || m.Affinity != o.Affinity {
		return false
	}
	j := 0
	for _, s := range m.Cover {
		// o's spans are merged, so s lies inside one of them or not at all.
		for j < len(o.Cover) && spanBefore(o.Cover[j], s) {
			j++
		}
		if j == len(o.Cover) {
			return false
		}
		if c := o.Cover[j]; !sameRange(c, s) || c.Lo > s.Lo || c.Hi < s.Hi {
			return false
		}
	}
	return true
}

// spanBefore reports whether a ends before b starts.
func spanBefore(a, b Span) bool {
	if c := a.VIP.Compare(b.VIP); c != 0 {
		return c < 0
	}
	if a.Proto != b.Proto {
		return a.Proto < b.Proto
	}
	return a.Hi < b.Lo
}

func sameRange(a, b Span) bool { return a.VIP == b.VIP && a.Proto == b.Proto }

// Equal reports whether m and o map the same flows to the same buckets.
func (m *Mapping) Equal(o *Mapping) bool { return m.Within(o) && o.Within(m) }

// Fingerprint is a 64-bit hash of the mapping (FNV-1a over its canonical
// form): equal mappings have equal fingerprints, and a changed mapping a
// different one but for hash collisions.
func (m *Mapping) Fingerprint() uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.BigEndian.PutUint32(b[:4], m.Seed)
	b[4] = byte(m.Affinity)
	h.Write(b[:5])
	for _, s := range m.Cover {
		a := s.VIP.As16()
		h.Write(a[:])
		b[0] = byte(s.Proto)
		binary.BigEndian.PutUint16(b[1:3], s.Lo)
		binary.BigEndian.PutUint16(b[3:5], s.Hi)
		h.Write(b[:5])
	}
	return h.Sum64()
}

// Mappings returns the mapping of every rule of c, DefaultRule included,
// as the data plane applies them: for each VIP and protocol the ports of
// the rules for that VIP, then those of the rules for every VIP, first rule
// first (Config.Lookup's order); DefaultRule gets the rest, and every VIP's
// non-TCP, non-UDP traffic.
func (c *Config) Mappings() map[RuleID]*Mapping {
	out := make(map[RuleID]*Mapping, len(c.Rules)+1)
	out[DefaultRule] = &Mapping{Seed: c.Seed, Affinity: AffinitySingle}
	for i := range c.Rules {
		out[c.Rules[i].ID] = &Mapping{Seed: c.Seed, Affinity: c.Rules[i].Affinity}
	}
	vips := slices.Clone(c.VIPs)
	slices.SortFunc(vips, netip.Addr.Compare)
	vips = slices.Compact(vips)
	type gap struct{ lo, hi int }
	for _, vip := range vips {
		out[DefaultRule].Cover = append(out[DefaultRule].Cover, Span{VIP: vip})
		for _, p := range []Protocol{ProtoTCP, ProtoUDP} {
			gaps := []gap{{0, 65535}}
			paint := func(r *Rule) {
				m := out[r.ID]
				var left []gap
				for _, g := range gaps {
					lo, hi := max(g.lo, int(r.PortLo)), min(g.hi, int(r.PortHi))
					if lo > hi {
						left = append(left, g)
						continue
					}
					m.Cover = append(m.Cover, Span{VIP: vip, Proto: p, Lo: uint16(lo), Hi: uint16(hi)})
					if g.lo < lo {
						left = append(left, gap{g.lo, lo - 1})
					}
					if hi < g.hi {
						left = append(left, gap{hi + 1, g.hi})
					}
				}
				gaps = left
			}
			for _, specific := range []bool{true, false} {
				for i := range c.Rules {
					r := &c.Rules[i]
					if r.VIP.IsValid() == specific && (!specific || r.VIP == vip) && r.Proto&p != 0 {
						paint(r)
					}
				}
			}
			for _, g := range gaps {
				out[DefaultRule].Cover = append(out[DefaultRule].Cover, Span{VIP: vip, Proto: p, Lo: uint16(g.lo), Hi: uint16(g.hi)})
			}
		}
	}
	for _, m := range out {
		m.Cover = mergeSpans(m.Cover)
	}
	return out
}

// Remapped returns the rules of c (DefaultRule included) that map some
// flow to another bucket than prev did, or that cover flows prev gave to
// another rule or to no rule: those whose mapping in c is not Within their
// mapping in prev.
func (c *Config) Remapped(prev *Config) map[RuleID]bool {
	out := map[RuleID]bool{}
	pm := prev.Mappings()
	for id, m := range c.Mappings() {
		if !m.Within(pm[id]) {
			out[id] = true
		}
	}
	return out
}

// mergeSpans sorts disjoint spans and joins the adjacent ones.
func mergeSpans(ss []Span) []Span {
	slices.SortFunc(ss, compareSpans)
	out := ss[:0]
	for _, s := range ss {
		if n := len(out); n > 0 && sameRange(out[n-1], s) && int(out[n-1].Hi)+1 == int(s.Lo) {
			out[n-1].Hi = s.Hi
			continue
		}
		out = append(out, s)
	}
	return out
}

// Grant is a set of buckets together with the mapping each rule's buckets
// were computed under: a node's accepting set, as the heartbeat machine
// keeps it.
type Grant struct {
	Buckets Set
	Maps    map[RuleID]*Mapping
}

// Grant returns the buckets node me owns, with their mappings.
func (o *Owners) Grant(me NodeID) Grant {
	return Grant{Buckets: o.Owned(me), Maps: o.Maps}
}

// Intersect returns the buckets that both g and now grant, expressed in
// now's mappings: a rule is kept only when its mapping in now lies Within
// its mapping in g, so that no bucket kept holds a flow it did not hold
// when g granted it. This is the intersection of the two sets of flows,
// rounded down to whole buckets of now: when a rule's seed or affinity
// changed, or its coverage grew (a removed rule's traffic falling to
// DefaultRule or to a rule for every VIP, a wider port range, a new VIP),
// the whole rule is released; when its coverage only shrank (a rule added
// over part of it) its buckets are kept. g and now are not modified.
func (g Grant) Intersect(now Grant) Grant {
	out := Grant{Buckets: Set{}, Maps: now.Maps}
	for id, m := range g.Buckets {
		om := now.Buckets[id]
		if om == nil || !now.Maps[id].Within(g.Maps[id]) {
			continue
		}
		var r Bitmap
		any := false
		for i := range r {
			r[i] = m[i] & om[i]
			any = any || r[i] != 0
		}
		if any {
			out.Buckets[id] = &r
		}
	}
	return out
}
