package filter

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/google/gopacket/layers"
)

var (
	refVIP    = netip.MustParseAddr("198.18.0.1")
	refVIP2   = netip.MustParseAddr("198.18.0.2")
	refClient = netip.MustParseAddr("198.18.5.77")
)

// refConfig has an all-VIP all-ports rule (1, affinity none), a rule for
// refVIP port 80 TCP (2, single), one for refVIP2 port 53 UDP (3,
// network) and a disabled rule (4) on port 9.
func refConfig() *Config {
	return &Config{Seed: 0xfeed, VIPs: []netip.Addr{refVIP, refVIP2}, Rules: []Rule{
		{ID: 1, PortLo: 0, PortHi: 65535, Proto: ProtoTCP, Affinity: AffinityNone},
		{ID: 2, VIP: refVIP, PortLo: 80, PortHi: 80, Proto: ProtoTCP, Affinity: AffinitySingle},
		{ID: 3, VIP: refVIP2, PortLo: 53, PortHi: 53, Proto: ProtoUDP, Affinity: AffinityNetwork},
		{ID: 4, VIP: refVIP, PortLo: 9, PortHi: 9, Proto: ProtoUDP, Mode: ModeDisabled},
	}}
}

// allIn returns tables where every bucket of every rule is in state s.
func allIn(c *Config, s BucketState) *Tables {
	t := &Tables{Config: c, States: map[RuleID]*[NumBuckets]BucketState{}}
	for _, id := range c.RuleIDs() {
		st := new([NumBuckets]BucketState)
		for b := range st {
			st[b] = s
		}
		t.States[id] = st
	}
	return t
}

func u32(a netip.Addr) uint32 { b := a.As4(); return binary.BigEndian.Uint32(b[:]) }

func TestClassifyRulesAndKeys(t *testing.T) {
	c := refConfig()
	cl := u32(refClient)
	tcp := func(dst netip.Addr, dport uint16) pkt {
		return pkt{src: refClient, sport: 40000, dst: dst, dport: dport, proto: layers.IPProtocolTCP, ack: true}
	}
	withVLAN := tcp(refVIP, 443)
	withVLAN.vlan = true
	withOpts := tcp(refVIP, 443)
	withOpts.ipOpts, withOpts.tcpOpts = true, true
	firstFrag := tcp(refVIP, 80)
	firstFrag.mf = true
	laterFrag := pkt{src: refClient, dst: refVIP, proto: layers.IPProtocolUDP, fragOff: 100, payload: make([]byte, 16)}
	icmpFrag := pkt{src: refClient, dst: refVIP, proto: layers.IPProtocolICMPv4, mf: true, payload: make([]byte, 16)}
	echo := pkt{src: refClient, dst: refVIP, proto: layers.IPProtocolICMPv4, icmpType: 8}
	fragNeeded := pkt{src: netip.MustParseAddr("198.18.9.1"), dst: refVIP, proto: layers.IPProtocolICMPv4, icmpType: 3,
		inner: embedded(pkt{src: refVIP, sport: 443, dst: refClient, dport: 5555, proto: layers.IPProtocolTCP})}
	aboutUDP := pkt{src: netip.MustParseAddr("198.18.9.1"), dst: refVIP, proto: layers.IPProtocolICMPv4, icmpType: 11,
		inner: embedded(pkt{src: refVIP2, sport: 53, dst: refClient, dport: 5555, proto: layers.IPProtocolUDP})}
	aboutLaterFrag := pkt{src: netip.MustParseAddr("198.18.9.1"), dst: refVIP, proto: layers.IPProtocolICMPv4, icmpType: 3,
		inner: embedded(pkt{src: refVIP, dst: refClient, fragOff: 9, proto: layers.IPProtocolTCP})}
	aboutEcho := pkt{src: netip.MustParseAddr("198.18.9.1"), dst: refVIP, proto: layers.IPProtocolICMPv4, icmpType: 3,
		inner: embedded(pkt{src: refVIP, dst: refClient, proto: layers.IPProtocolICMPv4})}
	aboutOther := pkt{src: netip.MustParseAddr("198.18.9.1"), dst: refVIP, proto: layers.IPProtocolICMPv4, icmpType: 3,
		inner: embedded(pkt{src: netip.MustParseAddr("10.1.1.1"), sport: 443, dst: refClient, dport: 5555, proto: layers.IPProtocolTCP})}
	gre := pkt{src: refClient, dst: refVIP, proto: layers.IPProtocol(47), payload: make([]byte, 8)}
	b := func(aff Affinity, ip uint32, port uint16) uint16 { return Bucket(c.Seed, aff, ip, port) }

	testClassify(t, c, []classifyCase{
		{"tcp to the all-vip rule", tcp(refVIP, 443).build(), Result{Verdict: Accept, Rule: 1, Bucket: b(AffinityNone, cl, 40000), State: Owned}},
		{"vip rule beats all-vip rule", tcp(refVIP, 80).build(), Result{Verdict: Accept, Rule: 2, Bucket: b(AffinitySingle, cl, 0), State: Owned}},
		{"other vip keeps the all-vip rule", tcp(refVIP2, 80).build(), Result{Verdict: Accept, Rule: 1, Bucket: b(AffinityNone, cl, 40000), State: Owned}},
		{"vlan tag", withVLAN.build(), Result{Verdict: Accept, Rule: 1, Bucket: b(AffinityNone, cl, 40000), State: Owned}},
		{"ip and tcp options", withOpts.build(), Result{Verdict: Accept, Rule: 1, Bucket: b(AffinityNone, cl, 40000), State: Owned}},
		{"udp uncovered port: default rule", pkt{src: refClient, sport: 1, dst: refVIP, dport: 123, proto: layers.IPProtocolUDP}.build(),
			Result{Verdict: Accept, Rule: DefaultRule, Bucket: b(AffinitySingle, cl, 0), State: Owned}},
		{"network affinity", pkt{src: refClient, sport: 1, dst: refVIP2, dport: 53, proto: layers.IPProtocolUDP}.build(),
			Result{Verdict: Accept, Rule: 3, Bucket: b(AffinityNetwork, cl, 0), State: Owned}},
		{"first fragment: judged by its ports", firstFrag.build(), Result{Verdict: Accept, Rule: 2, Bucket: b(AffinitySingle, cl, 0), State: Owned}},
		{"later udp fragment: default rule", laterFrag.build(), Result{Verdict: Accept, Rule: DefaultRule, Bucket: b(AffinitySingle, cl, 0), State: Owned}},
		{"icmp fragment", icmpFrag.build(), Result{Verdict: Accept, Rule: DefaultRule, Bucket: b(AffinitySingle, cl, 0), State: Owned}},
		{"echo request", echo.build(), Result{Verdict: Accept, Rule: DefaultRule, Bucket: b(AffinitySingle, cl, 0), State: Owned}},
		{"frag needed about a tcp flow", fragNeeded.build(), Result{Verdict: Accept, Rule: 1, Bucket: b(AffinityNone, cl, 5555), State: Owned}},
		{"time exceeded about a udp flow", aboutUDP.build(), Result{Verdict: Accept, Rule: 3, Bucket: b(AffinityNetwork, cl, 0), State: Owned}},
		{"error about a later fragment", aboutLaterFrag.build(), Result{Verdict: Accept, Rule: 1, Bucket: b(AffinitySingle, cl, 0), State: Owned}},
		{"error about an echo reply", aboutEcho.build(), Result{Verdict: Accept, Rule: DefaultRule, Bucket: b(AffinitySingle, cl, 0), State: Owned}},
		{"error not about a vip flow", aboutOther.build(), Result{Verdict: Accept, Rule: DefaultRule, Bucket: b(AffinitySingle, u32(netip.MustParseAddr("198.18.9.1")), 0), State: Owned}},
		{"other protocol", gre.build(), Result{Verdict: Accept, Rule: DefaultRule, Bucket: b(AffinitySingle, cl, 0), State: Owned}},
		{"disabled rule", pkt{src: refClient, sport: 1, dst: refVIP, dport: 9, proto: layers.IPProtocolUDP}.build(),
			Result{Verdict: Drop, Reason: DropDisabled, Rule: 4, Bucket: b(AffinityNone, cl, 1), State: Owned}},
		{"not a vip", tcp(netip.MustParseAddr("198.18.0.3"), 80).build(), Result{Verdict: Pass}},
	})
}

func TestClassifyPassAndMalformed(t *testing.T) {
	c := refConfig()
	good := (&pkt{src: refClient, sport: 40000, dst: refVIP, dport: 443, proto: layers.IPProtocolTCP}).build()
	set := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	doubleTag := serialize(
		&layers.Ethernet{SrcMAC: clientMAC, DstMAC: clusterMAC, EthernetType: layers.EthernetTypeDot1Q},
		&layers.Dot1Q{Type: layers.EthernetTypeDot1Q}, &layers.Dot1Q{Type: layers.EthernetTypeIPv4})
	shortQuote := pkt{src: refClient, dst: refVIP, proto: layers.IPProtocolICMPv4, icmpType: 3, inner: make([]byte, 12)}
	badQuote := pkt{src: refClient, dst: refVIP, proto: layers.IPProtocolICMPv4, icmpType: 3,
		inner: embedded(pkt{src: refVIP, sport: 443, dst: refClient, dport: 5555, proto: layers.IPProtocolTCP})[:22]}
	malformed := Result{Verdict: Drop, Reason: DropMalformed, Rule: DefaultRule}
	testClassify(t, c, []classifyCase{
		{"runt", good[:13], Result{Verdict: Pass}},
		{"ipv4 header cut before the addresses", good[:14+19], Result{Verdict: Pass}},
		{"two vlan tags", doubleTag, Result{Verdict: Pass}},
		{"bad version", set(func(b []byte) []byte { b[14] = 0x65; return b }), malformed},
		{"ihl 4", set(func(b []byte) []byte { b[14] = 0x44; return b }), malformed},
		{"total length past the frame", set(func(b []byte) []byte { binary.BigEndian.PutUint16(b[16:], uint16(len(b))); return b }), malformed},
		{"total length inside the header", set(func(b []byte) []byte { binary.BigEndian.PutUint16(b[16:], 19); return b }), malformed},
		{"tcp data offset 4", set(func(b []byte) []byte { b[14+20+12] = 0x40; return b }), malformed},
		{"tcp data offset past the segment", set(func(b []byte) []byte { b[14+20+12] = 0xf0; return b }), malformed},
		{"tcp cut short", set(func(b []byte) []byte {
			binary.BigEndian.PutUint16(b[16:], 20+19)
			return b[:14+20+19]
		}), malformed},
		{"icmp error with a short quote", shortQuote.build(), malformed},
		{"icmp error without the ports", badQuote.build(), malformed},
		{"ethernet padding is fine", set(func(b []byte) []byte { return append(b, 0, 0, 0, 0) }),
			Result{Verdict: Accept, Rule: 1, Bucket: Bucket(c.Seed, AffinityNone, u32(refClient), 40000), State: Owned}},
	})
}

// classifyCase is a frame and what Classify must make of it.
type classifyCase struct {
	name  string
	frame []byte
	want  Result
}

// testClassify classifies each case's frame with the rules of c and
// every bucket owned. An accepted frame must leave with the node's MAC as
// destination, any other with the cluster MAC it came with.
func testClassify(t *testing.T, c *Config, cases []classifyCase) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			frame := append([]byte(nil), tt.frame...)
			got := NewClassifier(allIn(c, Owned), nodeMAC, nil).Classify(frame)
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
				t.Errorf("Classify (-want +got):\n%s", diff)
			}
			wantDst := clusterMAC
			if tt.want.Verdict == Accept {
				wantDst = nodeMAC
			}
			if len(frame) >= 6 && !bytes.Equal(frame[:6], wantDst) {
				t.Errorf("destination mac %x, want %x", frame[:6], wantDst)
			}
		})
	}
}

func TestClassifyStates(t *testing.T) {
	c := refConfig()
	held := netip.MustParseAddr("198.18.5.1")
	cs := conns{{netip.AddrPortFrom(held, 1000), netip.AddrPortFrom(refVIP, 443)}: true}
	tcp := func(src netip.Addr, syn, ack bool) []byte {
		return (&pkt{src: src, sport: 1000, dst: refVIP, dport: 443, proto: layers.IPProtocolTCP, syn: syn, ack: ack}).build()
	}
	udp := (&pkt{src: refClient, sport: 1000, dst: refVIP, dport: 443, proto: layers.IPProtocolUDP}).build()
	icmpHeld := (&pkt{src: refClient, dst: refVIP, proto: layers.IPProtocolICMPv4, icmpType: 3,
		inner: embedded(pkt{src: refVIP, sport: 443, dst: held, dport: 1000, proto: layers.IPProtocolTCP})}).build()
	frag := (&pkt{src: refClient, dst: refVIP, proto: layers.IPProtocolTCP, fragOff: 3, payload: make([]byte, 8)}).build()
	type want struct {
		v Verdict
		r DropReason
	}
	acc := want{Accept, NoReason}
	tests := []struct {
		name  string
		frame []byte
		want  map[BucketState]want
	}{
		{"syn", tcp(refClient, true, false), map[BucketState]want{Owned: acc, NotOwned: {Drop, DropNotOwned}, OwnedDirty: acc, Draining: {Drop, DropDrainNoConn}}},
		{"syn-ack", tcp(refClient, true, true), map[BucketState]want{Owned: acc, NotOwned: {Drop, DropNotOwned}, OwnedDirty: {Drop, DropDirtyNoConn}, Draining: {Drop, DropDrainNoConn}}},
		{"ack, no connection", tcp(refClient, false, true), map[BucketState]want{Owned: acc, NotOwned: {Drop, DropNotOwned}, OwnedDirty: {Drop, DropDirtyNoConn}, Draining: {Drop, DropDrainNoConn}}},
		{"ack, held connection", tcp(held, false, true), map[BucketState]want{Owned: acc, NotOwned: {Drop, DropNotOwned}, OwnedDirty: acc, Draining: acc}},
		{"icmp error about a held connection", icmpHeld, map[BucketState]want{Owned: acc, NotOwned: {Drop, DropNotOwned}, OwnedDirty: acc, Draining: acc}},
		{"udp", udp, map[BucketState]want{Owned: acc, NotOwned: {Drop, DropNotOwned}, OwnedDirty: acc, Draining: {Drop, DropDrainNoConn}}},
		{"tcp fragment", frag, map[BucketState]want{Owned: acc, NotOwned: {Drop, DropNotOwned}, OwnedDirty: acc, Draining: {Drop, DropDrainNoConn}}},
	}
	for _, tt := range tests {
		for st, w := range tt.want {
			t.Run(tt.name+"/"+st.String(), func(t *testing.T) {
				got := NewClassifier(allIn(c, st), nodeMAC, cs).Classify(append([]byte(nil), tt.frame...))
				if got.Verdict != w.v || got.Reason != w.r || got.State != st {
					t.Errorf("got %v %v in %v, want %v %v", got.Verdict, got.Reason, got.State, w.v, w.r)
				}
			})
		}
	}
	t.Run("rule without states", func(t *testing.T) {
		got := NewClassifier(&Tables{Config: c}, nodeMAC, nil).Classify(udp)
		if got.Verdict != Drop || got.Reason != DropNotOwned {
			t.Errorf("got %+v, want a not-owned drop", got)
		}
	})
}

func TestLocate(t *testing.T) {
	c := refConfig()
	testLocate(t, c, refClient, []locateFlow{{refVIP, layers.IPProtocolTCP, 80}, {refVIP, layers.IPProtocolTCP, 443}, {refVIP2, layers.IPProtocolUDP, 53}, {refVIP2, layers.IPProtocolUDP, 54}})
	if _, _, ok := c.Locate(netip.MustParseAddr("198.18.0.3"), ProtoTCP, refClient, 1, 80); ok {
		t.Error("Locate of a non-VIP: ok")
	}
}

// locateFlow is a flow's VIP, protocol and port, for testLocate.
type locateFlow struct {
	vip   netip.Addr
	proto layers.IPProtocol
	port  uint16
}

// testLocate checks that Locate names the rule and bucket Classify judges
// a packet by, from client port 31337 to each flow's VIP and port (an IPv4
// or IPv6 frame as the VIP is), every bucket owned.
func testLocate(t *testing.T, c *Config, client netip.Addr, flows []locateFlow) {
	t.Helper()
	cl := NewClassifier(allIn(c, Owned), nodeMAC, nil)
	for _, f := range flows {
		var frame []byte
		if f.vip.Is4() {
			frame = pkt{src: client, sport: 31337, dst: f.vip, dport: f.port, proto: f.proto}.build()
		} else {
			frame = pkt6{src: client, sport: 31337, dst: f.vip, dport: f.port, proto: f.proto}.build()
		}
		res := cl.Classify(frame)
		id, b, ok := c.Locate(f.vip, protoOf(f.proto), client, 31337, f.port)
		if !ok || id != res.Rule || b != res.Bucket {
			t.Errorf("Locate(%v, %v, %d) = %d, %d, %v; Classify says rule %d bucket %d", f.vip, f.proto, f.port, id, b, ok, res.Rule, res.Bucket)
		}
	}
}

func TestClassifyNoAllocs(t *testing.T) {
	c := refConfig()
	cs := conns{}
	frames := [][]byte{
		(&pkt{src: refClient, sport: 40000, dst: refVIP, dport: 443, proto: layers.IPProtocolTCP, ack: true}).build(),
		(&pkt{src: refClient, sport: 40000, dst: refVIP2, dport: 53, proto: layers.IPProtocolUDP}).build(),
		(&pkt{src: refClient, dst: refVIP, proto: layers.IPProtocolICMPv4, icmpType: 3,
			inner: embedded(pkt{src: refVIP, sport: 443, dst: refClient, dport: 5555, proto: layers.IPProtocolTCP})}).build(),
		(&pkt{src: refClient, sport: 1, dst: netip.MustParseAddr("10.0.0.1"), dport: 1, proto: layers.IPProtocolUDP}).build(),
		(&pkt{src: refClient, sport: 40000, dst: refVIP, dport: 443, proto: layers.IPProtocolTCP, ack: true, mf: true, id: 5}).build(),
		(&pkt{src: refClient, dst: refVIP, proto: layers.IPProtocolTCP, fragOff: 20, id: 5}).build(),
	}
	for _, st := range []BucketState{Owned, NotOwned, OwnedDirty, Draining} {
		tb := allIn(c, st)
		if n := testing.AllocsPerRun(200, func() { Classify(tb, frames[0], nodeMAC, cs) }); n != 0 {
			t.Errorf("Classify, state %v: %v allocations per run, want 0", st, n)
		}
		cl := NewClassifier(tb, nodeMAC, cs)
		if n := testing.AllocsPerRun(200, func() {
			for _, f := range frames {
				cl.Classify(f)
			}
		}); n != 0 {
			t.Errorf("state %v: %v allocations per run, want 0", st, n)
		}
	}
}

func BenchmarkClassify(b *testing.B) {
	c := refConfig()
	frame := (&pkt{src: refClient, sport: 40000, dst: refVIP, dport: 443, proto: layers.IPProtocolTCP, ack: true}).build()
	for _, st := range []BucketState{Owned, NotOwned} {
		b.Run(st.String(), func(b *testing.B) {
			cl := NewClassifier(allIn(c, st), nodeMAC, nil)
			b.ReportAllocs()
			for b.Loop() {
				cl.Classify(frame)
			}
		})
	}
}

func BenchmarkAssign(b *testing.B) {
	for _, n := range []int{8, 32, 64} {
		b.Run(fmt.Sprintf("%d-nodes", n), func(b *testing.B) {
			w := make([]int, n)
			for i := range w {
				w[i] = DefaultWeight
			}
			c := testConfig(w...)
			elig := ids(n)
			b.ReportAllocs()
			for b.Loop() {
				Assign(c, elig)
			}
		})
	}
}

// TestFragMemoryLRU checks the model of the program's fragment LRU: it
// forgets the least recently used datagram first, a lookup counting as a
// use, and a repeated first fragment replaces the verdict.
func TestFragMemoryLRU(t *testing.T) {
	key := func(id uint32) fragKey { return fragKey{src: refClient, dst: refVIP, id: id, proto: 6} }
	m := newFragMemory(2)
	m.put(key(1), fragVerdict{Result: Result{Verdict: Accept}})
	m.put(key(2), fragVerdict{Result: Result{Verdict: Drop}})
	if _, ok := m.get(key(1)); !ok { // 1 is now newer than 2
		t.Fatal("datagram 1 forgotten early")
	}
	m.put(key(3), fragVerdict{Result: Result{Verdict: Accept}}) // forgets 2
	m.put(key(1), fragVerdict{Result: Result{Verdict: Drop}})   // replaces 1's verdict
	for id, want := range map[uint32]Verdict{1: Drop, 3: Accept} {
		if r, ok := m.get(key(id)); !ok || r.Verdict != want {
			t.Errorf("datagram %d: %v %v, want %v", id, r.Verdict, ok, want)
		}
	}
	if _, ok := m.get(key(2)); ok {
		t.Error("datagram 2 not forgotten")
	}
}
