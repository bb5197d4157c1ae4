package filter

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/gopacket/layers"
)

var (
	refVIP6     = netip.MustParseAddr("2001:db8::1")
	refVIP6b    = netip.MustParseAddr("2001:db8::2")
	refClient6  = netip.MustParseAddr("2001:db8:5:0:1::77")
	refNeighbor = netip.MustParseAddr("2001:db8:5:0:ffff::1") // the same /64 as refClient6
)

// refConfig6 has IPv6 VIPs next to an IPv4 one: an all-VIP all-ports TCP
// rule (1, affinity none), refVIP6 port 80 TCP (2, single), refVIP6b port
// 53 UDP (3, network) and a disabled rule on refVIP6 port 9 UDP (4).
func refConfig6() *Config {
	return &Config{Seed: 0xfeed, VIPs: []netip.Addr{refVIP, refVIP6, refVIP6b}, Rules: []Rule{
		{ID: 1, PortLo: 0, PortHi: 65535, Proto: ProtoTCP, Affinity: AffinityNone},
		{ID: 2, VIP: refVIP6, PortLo: 80, PortHi: 80, Proto: ProtoTCP, Affinity: AffinitySingle},
		{ID: 3, VIP: refVIP6b, PortLo: 53, PortHi: 53, Proto: ProtoUDP, Affinity: AffinityNetwork},
		{ID: 4, VIP: refVIP6, PortLo: 9, PortHi: 9, Proto: ProtoUDP, Mode: ModeDisabled},
	}}
}

func TestKeyOf(t *testing.T) {
	c6 := netip.MustParseAddr("2001:db8:1:2:3:4:5:6")
	tests := []struct {
		name   string
		aff    Affinity
		client netip.Addr
		port   uint16
		want   []uint32
	}{
		{"ipv4 none", AffinityNone, refClient, 7, []uint32{u32(refClient), 7}},
		{"ipv4 single", AffinitySingle, refClient, 7, []uint32{u32(refClient), 0}},
		{"ipv4 network", AffinityNetwork, refClient, 7, []uint32{u32(refClient) &^ 0xff, 0}},
		{"ipv4-mapped is ipv4", AffinityNone, netip.AddrFrom16(refClient.As16()), 7, []uint32{u32(refClient), 7}},
		{"ipv6 none", AffinityNone, c6, 7, []uint32{0x20010db8, 0x00010002, 0x00030004, 0x00050006, 7}},
		{"ipv6 single", AffinitySingle, c6, 7, []uint32{0x20010db8, 0x00010002, 0x00030004, 0x00050006, 0}},
		{"ipv6 network is the /64", AffinityNetwork, c6, 7, []uint32{0x20010db8, 0x00010002, 0, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := KeyOf(tt.aff, tt.client, tt.port)
			if diff := cmp.Diff(tt.want, k.Words()); diff != "" {
				t.Errorf("KeyOf words (-want +got):\n%s", diff)
			}
			if got, want := k.Hash(99), HashWords(99, tt.want); got != want {
				t.Errorf("Hash = %#x, want HashWords %#x", got, want)
			}
		})
	}
	// The IPv4 helpers are the same function.
	a, b := FlowKey(AffinityNone, u32(refClient), 9)
	if k := KeyOf(AffinityNone, refClient, 9); Hash(5, a, b) != k.Hash(5) || Bucket(5, AffinityNone, u32(refClient), 9) != k.Bucket(5) {
		t.Error("Hash and Bucket disagree with Key")
	}
}

// tcp6 is a TCP segment from refClient6 to vip.
func tcp6(vip netip.Addr, sport, dport uint16) pkt6 {
	return pkt6{src: refClient6, dst: vip, sport: sport, dport: dport, proto: layers.IPProtocolTCP, ack: true}
}

func TestClassifyIPv6(t *testing.T) {
	c := refConfig6()
	bucket := func(aff Affinity, client netip.Addr, port uint16) uint16 {
		k := keyFor(aff, client, port)
		return k.Bucket(c.Seed)
	}
	owned := func(rule RuleID, aff Affinity, client netip.Addr, port uint16) Result {
		return Result{Verdict: Accept, Rule: rule, Bucket: bucket(aff, client, port), State: Owned}
	}
	malformed := Result{Verdict: Drop, Reason: DropMalformed, Rule: DefaultRule}
	pass := Result{Verdict: Pass}
	mod := func(p pkt6, f func(*pkt6)) pkt6 { f(&p); return p }
	with := func(p pkt6, f func(*pkt6)) []byte { return mod(p, f).build() }
	set := func(b []byte, f func(ip []byte)) []byte { f(b[14:]); return b }
	hbh := ext6{nh: nhHopByHop}
	quote := func(q pkt6) []byte { return embedded6(q) }
	icmp6 := func(typ uint8, inner []byte) []byte {
		return (&pkt6{src: refNeighbor, dst: refVIP6, proto: layers.IPProtocolICMPv6, icmpType: typ, inner: inner}).build()
	}
	fromVIP := pkt6{src: refVIP6, sport: 443, dst: refClient6, dport: 5555, proto: layers.IPProtocolTCP}
	exts := func(n int) []ext6 {
		es := make([]ext6, n)
		for i := range es {
			es[i] = ext6{nh: []uint8{nhHopByHop, nhRouting, nhDestOpts}[i%3]}
		}
		return es
	}
	testClassify(t, c, []classifyCase{
		{"tcp, all-vip rule, key /128 and port", tcp6(refVIP6, 40000, 443).build(), owned(1, AffinityNone, refClient6, 40000)},
		{"tcp, vip rule, key /128", tcp6(refVIP6, 40000, 80).build(), owned(2, AffinitySingle, refClient6, 0)},
		{"vlan", with(tcp6(refVIP6, 40000, 80), func(p *pkt6) { p.vlan = true }), owned(2, AffinitySingle, refClient6, 0)},
		{"udp, network affinity keys the /64",
			(&pkt6{src: refNeighbor, dst: refVIP6b, sport: 1, dport: 53, proto: layers.IPProtocolUDP}).build(), owned(3, AffinityNetwork, refClient6, 0)},
		{"udp, disabled rule", (&pkt6{src: refClient6, dst: refVIP6, sport: 1, dport: 9, proto: layers.IPProtocolUDP}).build(),
			Result{Verdict: Drop, Reason: DropDisabled, Rule: 4, Bucket: bucket(AffinityNone, refClient6, 1), State: Owned}},
		{"udp, no rule: default", (&pkt6{src: refClient6, dst: refVIP6, sport: 1, dport: 10, proto: layers.IPProtocolUDP}).build(),
			owned(DefaultRule, AffinitySingle, refClient6, 0)},
		{"ipv4-mapped source keys as IPv6",
			with(tcp6(refVIP6, 40000, 443), func(p *pkt6) { p.src = netip.AddrFrom16(refClient.As16()) }),
			owned(1, AffinityNone, netip.AddrFrom16(refClient.As16()), 40000)},
		{"extension headers stepped over", with(tcp6(refVIP6, 40000, 80), func(p *pkt6) {
			p.exts = []ext6{hbh, {nh: nhRouting, units: 2}, {nh: nhDestOpts, units: 1}}
		}), owned(2, AffinitySingle, refClient6, 0)},
		{"MaxExtHeaders extension headers", with(tcp6(refVIP6, 40000, 80), func(p *pkt6) { p.exts = exts(MaxExtHeaders) }),
			owned(2, AffinitySingle, refClient6, 0)},
		{"one extension header too many", with(tcp6(refVIP6, 40000, 80), func(p *pkt6) { p.exts = exts(MaxExtHeaders + 1) }), malformed},
		{"transport header past MaxL4Offset", with(tcp6(refVIP6, 40000, 80), func(p *pkt6) {
			p.exts = []ext6{{nh: nhDestOpts, units: (MaxL4Offset-40)/8 - 1}, hbh} // ends at 40+MaxL4Offset-40+8
		}), malformed},
		{"transport header at MaxL4Offset", with(tcp6(refVIP6, 40000, 80), func(p *pkt6) {
			p.exts = []ext6{{nh: nhDestOpts, units: (MaxL4Offset-40)/8 - 1}}
		}), owned(2, AffinitySingle, refClient6, 0)},
		{"extension header past the payload", set(with(tcp6(refVIP6, 40000, 80), func(p *pkt6) { p.exts = []ext6{hbh} }),
			func(ip []byte) { ip[41] = 9 }), malformed},
		{"esp: default rule", with(tcp6(refVIP6, 0, 0), func(p *pkt6) { p.proto = 50; p.payload = make([]byte, 8) }),
			owned(DefaultRule, AffinitySingle, refClient6, 0)},
		{"header cut before the addresses", tcp6(refVIP6, 1, 80).build()[:14+39], pass},
		{"not a VIP", tcp6(netip.MustParseAddr("2001:db8::99"), 1, 80).build(), pass},
		{"version 4 in an IPv6 frame", set(tcp6(refVIP6, 1, 80).build(), func(ip []byte) { ip[0] = 0x40 }), malformed},
		{"payload length 0 (jumbogram)", set(tcp6(refVIP6, 1, 80).build(), func(ip []byte) { binary.BigEndian.PutUint16(ip[4:], 0) }), malformed},
		{"payload length past the frame", set(tcp6(refVIP6, 1, 80).build(), func(ip []byte) { binary.BigEndian.PutUint16(ip[4:], uint16(len(ip)-40+1)) }), malformed},
		{"tcp data offset past the segment", set(tcp6(refVIP6, 1, 80).build(), func(ip []byte) { ip[40+12] = 0xf0 }), malformed},
		{"ethernet padding is fine", append(tcp6(refVIP6, 40000, 80).build(), 0, 0, 0, 0), owned(2, AffinitySingle, refClient6, 0)},
		{"neighbour solicitation to a VIP passes", icmp6(135, make([]byte, 20)), pass},
		{"router advertisement passes", icmp6(134, make([]byte, 8)), pass},
		{"redirect passes", icmp6(137, make([]byte, 32)), pass},
		{"echo request: default rule, key /128", icmp6(128, nil), owned(DefaultRule, AffinitySingle, refNeighbor, 0)},
		{"short icmpv6", set(icmp6(128, nil)[:14+40+4], func(ip []byte) { binary.BigEndian.PutUint16(ip[4:], 4) }), malformed},
		{"packet too big about a VIP flow: the flow's bucket", icmp6(2, quote(fromVIP)), owned(1, AffinityNone, refClient6, 5555)},
		{"destination unreachable, quote with extension headers",
			icmp6(1, quote(pkt6{src: refVIP6, sport: 80, dst: refClient6, dport: 5555, proto: layers.IPProtocolTCP, exts: []ext6{hbh, {nh: nhDestOpts}}})),
			owned(2, AffinitySingle, refClient6, 0)},
		{"time exceeded, quote of a later fragment: port 0", icmp6(3, quote(mod(fromVIP, func(p *pkt6) { p.exts = []ext6{{nh: nhFragment, fragOff: 9}} }))),
			owned(1, AffinitySingle, refClient6, 0)},
		{"error about a packet not from a VIP: keyed by its sender",
			icmp6(1, quote(mod(fromVIP, func(p *pkt6) { p.src = netip.MustParseAddr("2001:db8::99") }))), owned(DefaultRule, AffinitySingle, refNeighbor, 0)},
		{"error quoting udp to no rule", icmp6(1, quote(mod(fromVIP, func(p *pkt6) { p.proto = layers.IPProtocolUDP }))),
			owned(DefaultRule, AffinitySingle, refClient6, 0)},
		{"error with a quote shorter than an IPv6 header", icmp6(1, quote(fromVIP)[:39]), malformed},
		{"error quote without the ports", icmp6(2, quote(fromVIP)[:42]), malformed},
		{"atomic fragment: judged as unfragmented", with(tcp6(refVIP6, 40000, 80), func(p *pkt6) { p.exts = []ext6{{nh: nhFragment, id: 5}} }),
			owned(2, AffinitySingle, refClient6, 0)},
		{"later fragment, first unseen: rule for port 0, key /128",
			with(tcp6(refVIP6, 40000, 80), func(p *pkt6) { p.exts = []ext6{{nh: nhFragment, fragOff: 100, id: 5}} }), owned(1, AffinitySingle, refClient6, 0)},
		{"later udp fragment, first unseen: rule for udp port 0 (none: default)",
			(&pkt6{src: refClient6, dst: refVIP6, proto: layers.IPProtocolUDP, exts: []ext6{{nh: nhFragment, fragOff: 100, id: 6}}}).build(),
			owned(DefaultRule, AffinitySingle, refClient6, 0)},
	})
}

// TestFragmentsIPv6 follows a fragmented IPv6 datagram: its first fragment
// is judged by its ports, the later ones take that verdict (named by
// addresses, next header and the 32-bit id, not the 16 bits IPv4 has), an
// atomic fragment is not remembered.
func TestFragmentsIPv6(t *testing.T) {
	c := refConfig6()
	tb := allIn(c, Owned)
	st := new([NumBuckets]BucketState) // rule 1: only the first fragment's bucket is owned
	first := tcp6(refVIP6, 40000, 443)
	k := keyFor(AffinityNone, refClient6, 40000)
	st[k.Bucket(c.Seed)] = Owned
	tb.States[1] = st
	cl := NewClassifier(tb, nodeMAC, nil)
	frag := func(p pkt6, off uint16, more bool, id uint32) []byte {
		p.exts = []ext6{{nh: nhFragment, fragOff: off, more: more, id: id}}
		return p.build()
	}
	later := tcp6(refVIP6, 0, 0)
	if r := cl.Classify(frag(later, 50, false, 0x10001)); r.Verdict != Drop {
		t.Fatalf("later fragment before its first: %+v, want a drop (rule 1, port 0, bucket not owned)", r)
	}
	if r := cl.Classify(frag(first, 0, true, 0x10001)); r.Verdict != Accept || r.Rule != 1 {
		t.Fatalf("first fragment: %+v, want accepted under rule 1", r)
	}
	if r := cl.Classify(frag(later, 50, false, 0x10001)); r.Verdict != Accept || r.Rule != 1 {
		t.Errorf("later fragment: %+v, want the first fragment's verdict", r)
	}
	// Same low 16 bits of the id, another datagram.
	if r := cl.Classify(frag(later, 50, false, 0x20001)); r.Verdict != Drop {
		t.Errorf("later fragment of another datagram: %+v, want a drop", r)
	}
	if r := cl.Classify(frag(first, 0, false, 0x30001)); r.Verdict != Accept {
		t.Fatalf("atomic fragment: %+v, want accepted", r)
	}
	if r := cl.Classify(frag(later, 50, false, 0x30001)); r.Verdict != Drop {
		t.Errorf("later fragment after an atomic one: %+v, want a drop (nothing remembered)", r)
	}
}

func TestLocateIPv6(t *testing.T) {
	c := refConfig6()
	testLocate(t, c, refClient6, []locateFlow{{refVIP6, layers.IPProtocolTCP, 80}, {refVIP6, layers.IPProtocolTCP, 443}, {refVIP6b, layers.IPProtocolUDP, 53}, {refVIP6b, layers.IPProtocolUDP, 54}})
	if _, _, ok := c.Locate(refVIP6, ProtoTCP, refClient, 1, 80); ok {
		t.Error("Locate of an IPv4 client on an IPv6 VIP: ok")
	}
	if _, _, ok := c.Locate(refVIP, ProtoTCP, refClient6, 1, 80); ok {
		t.Error("Locate of an IPv6 client on an IPv4 VIP: ok")
	}
	// A dual-stack socket names an IPv4 client IPv4-mapped.
	id, b, ok := c.Locate(refVIP, ProtoTCP, netip.AddrFrom16(refClient.As16()), 1, 80)
	if wid, wb, _ := c.Locate(refVIP, ProtoTCP, refClient, 1, 80); !ok || id != wid || b != wb {
		t.Errorf("Locate of an IPv4-mapped client = %d, %d, %v; want %d, %d as IPv4", id, b, ok, wid, wb)
	}
}
