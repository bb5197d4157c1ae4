//go:build linux

package filter

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/google/gopacket/layers"
)

// bareXDP returns a program that only returns action: the floor a
// prog.Benchmark figure is read against.
func bareXDP(b *testing.B, action int32) *ebpf.Program {
	b.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.XDP,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, action), asm.Return()},
		License:      "MIT",
	})
	if err != nil {
		b.Fatalf("load bare program: %v", err)
	}
	b.Cleanup(func() { p.Close() })
	return p
}

// BenchmarkXDP measures the program per packet with prog.Benchmark (the
// kernel's test run loop), beside bare XDP_PASS and XDP_DROP programs
// measured in the same run. The socket lookup runs in a namespace of its own.
func BenchmarkXDP(b *testing.B) {
	x := loadXDP(b)
	vip := netip.MustParseAddr("198.18.0.1")
	client := netip.MustParseAddr("198.18.7.7")
	vip6, client6 := netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8:7::7")
	c := &Config{Seed: 42, VIPs: []netip.Addr{vip, netip.MustParseAddr("198.18.0.9"), vip6, netip.MustParseAddr("2001:db8::9")}, Rules: []Rule{
		{ID: 1, VIP: vip, PortLo: 80, PortHi: 80, Proto: ProtoTCP, Affinity: AffinityNone},  // owned
		{ID: 2, VIP: vip, PortLo: 81, PortHi: 81, Proto: ProtoTCP, Affinity: AffinityNone},  // not owned
		{ID: 3, VIP: vip, PortLo: 82, PortHi: 82, Proto: ProtoTCP, Affinity: AffinityNone},  // dirty
		{ID: 4, PortLo: 1000, PortHi: 2000, Proto: ProtoBoth, Affinity: AffinitySingle},     // unused, to make the tables real
		{ID: 5, VIP: vip6, PortLo: 80, PortHi: 80, Proto: ProtoTCP, Affinity: AffinityNone}, // IPv6 owned
		{ID: 6, VIP: vip6, PortLo: 81, PortHi: 81, Proto: ProtoTCP, Affinity: AffinityNone}, // IPv6 not owned
	}}
	t := allIn(c, NotOwned)
	for b := range t.States[1] {
		t.States[1][b] = Owned
		t.States[3][b] = OwnedDirty
		t.States[5][b] = Owned
	}
	if err := x.Update(t, nodeMAC); err != nil {
		b.Fatal(err)
	}
	ack := func(port uint16) []byte {
		return (&pkt{src: client, sport: 40000, dst: vip, dport: port, proto: layers.IPProtocolTCP, ack: true, payload: make([]byte, 64)}).build()
	}
	nonVIP := (&pkt{src: client, sport: 40000, dst: netip.MustParseAddr("198.18.0.5"), dport: 80, proto: layers.IPProtocolTCP, ack: true, payload: make([]byte, 64)}).build()
	bench := func(p *ebpf.Program, frame []byte, want uint32) func(*testing.B) {
		return func(b *testing.B) {
			ret, d, err := p.Benchmark(frame, b.N, b.ResetTimer)
			if err != nil {
				b.Fatal(err)
			}
			if ret != want {
				b.Fatalf("action %d, want %d", ret, want)
			}
			b.ReportMetric(float64(d.Nanoseconds()), "ns/packet")
		}
	}
	pass, drop := bareXDP(b, xdpPass), bareXDP(b, xdpDrop)
	b.Run("bare-pass", bench(pass, ack(80), xdpPass))
	b.Run("bare-drop", bench(drop, ack(80), xdpDrop))
	b.Run("owned-tcp", bench(x.Program(), ack(80), xdpPass))
	b.Run("not-owned-drop", bench(x.Program(), ack(81), xdpDrop))
	b.Run("dirty-lookup-no-socket", func(b *testing.B) {
		ns := newNetns(b)
		enterNetns(b, ns)
		bench(x.Program(), ack(82), xdpDrop)(b)
	})
	b.Run("non-vip-pass", bench(x.Program(), nonVIP, xdpPass))
	// IPv6: the same TCP ACK (64 bytes of payload) to an IPv6 VIP, with
	// and without a hop-by-hop and a destination-options header.
	ack6 := func(port uint16, exts ...ext6) []byte {
		return pkt6{src: client6, sport: 40000, dst: vip6, dport: port, proto: layers.IPProtocolTCP, ack: true, exts: exts, payload: make([]byte, 64)}.build()
	}
	b.Run("ipv6-owned-tcp", bench(x.Program(), ack6(80), xdpPass))
	b.Run("ipv6-not-owned-drop", bench(x.Program(), ack6(81), xdpDrop))
	b.Run("ipv6-owned-two-ext-headers", bench(x.Program(), ack6(80, ext6{nh: nhHopByHop}, ext6{nh: nhDestOpts}), xdpPass))
	nonVIP6 := pkt6{src: client6, sport: 40000, dst: netip.MustParseAddr("2001:db8::5"), dport: 80, proto: layers.IPProtocolTCP, ack: true, payload: make([]byte, 64)}.build()
	b.Run("ipv6-non-vip-pass", bench(x.Program(), nonVIP6, xdpPass))
	// The heartbeat filter: UDP to this node's heartbeat socket.
	if err := x.SetHeartbeatPeers(netip.MustParseAddrPort("198.18.0.5:7946"), []netip.AddrPort{netip.MustParseAddrPort("198.18.0.6:7946")}); err != nil {
		b.Fatal(err)
	}
	hb := func(src string) []byte {
		ap := netip.MustParseAddrPort(src)
		return (&pkt{src: ap.Addr(), sport: ap.Port(), dst: netip.MustParseAddr("198.18.0.5"), dport: 7946, proto: layers.IPProtocolUDP, payload: make([]byte, 64)}).build()
	}
	b.Run("heartbeat-from-peer-pass", bench(x.Program(), hb("198.18.0.6:7946"), xdpPass))
	b.Run("heartbeat-from-stranger-drop", bench(x.Program(), hb("198.18.0.7:7946"), xdpDrop))
	// Fragments: a first fragment (judged, verdict stored in the LRU) and a
	// later one (verdict read from it).
	frag := func(first bool) []byte {
		p := pkt{src: client, sport: 40000, dst: vip, dport: 80, proto: layers.IPProtocolTCP, ack: true, id: 99, payload: make([]byte, 64)}
		if first {
			p.mf = true
		} else {
			p.fragOff = 11
		}
		return p.build()
	}
	b.Run("first-fragment-owned", bench(x.Program(), frag(true), xdpPass))
	b.Run("later-fragment-remembered", bench(x.Program(), frag(false), xdpPass))
	b.Run("bare-pass-again", bench(pass, ack(80), xdpPass))
}

// BenchmarkUpdate measures one atomic table swap (write the inactive copy,
// flip, wait for running programs) for 4 VIPs and 16 port rules.
func BenchmarkUpdate(b *testing.B) {
	x := loadXDP(b)
	c := &Config{Seed: 1}
	for i := 0; i < 4; i++ {
		c.VIPs = append(c.VIPs, netip.AddrFrom4([4]byte{198, 18, 0, byte(i + 1)}))
	}
	for i := 0; i < 16; i++ {
		r := Rule{ID: RuleID(i + 1), PortLo: uint16(1000 * i), PortHi: uint16(1000*i + 999), Proto: ProtoBoth}
		if i%2 == 0 {
			r.VIP = c.VIPs[i%4]
		}
		c.Rules = append(c.Rules, r)
	}
	t := allIn(c, Owned)
	for b.Loop() {
		if err := x.Update(t, nodeMAC); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkXDPForward measures routed mode's paths per packet, one packet a
// test run: a packet
// this node owns, one it forwards to the owner (encapsulated, XDP_TX), one
// forwarded here that it takes (outer header off), and one forwarded here
// that it forwards on (outer header rewritten), beside a bare XDP_PASS
// program and the multicast modes' owned path in the same run.
func BenchmarkXDPForward(b *testing.B) {
	vip, client := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.7.7")
	self, peer := netip.MustParseAddr("198.18.9.1"), netip.MustParseAddr("198.18.9.2")
	c := &Config{Seed: 42, VIPs: []netip.Addr{vip}, Rules: []Rule{
		{ID: 1, VIP: vip, PortLo: 80, PortHi: 80, Proto: ProtoTCP, Affinity: AffinityNone}, // owned
		{ID: 2, VIP: vip, PortLo: 81, PortHi: 81, Proto: ProtoTCP, Affinity: AffinityNone}, // the peer's
	}}
	tables := func(routed bool) *Tables {
		t := allIn(c, NotOwned)
		for b := range t.States[1] {
			t.States[1][b] = Owned
		}
		if routed {
			t.Routed, t.Self, t.MTU = true, self, 1500
			t.Peers[1], t.PeerMACs[1] = peer, [6]byte{2, 0, 0, 0, 9, 2}
			t.Forward = map[RuleID]*[NumBuckets]uint8{}
			for _, id := range []RuleID{1, 2} {
				f := new([NumBuckets]uint8)
				for b := range f {
					f[b] = 1
				}
				t.Forward[id] = f
			}
		}
		return t
	}
	multicast, routed := loadXDP(b), loadXDP(b)
	if err := multicast.Update(tables(false), nodeMAC); err != nil {
		b.Fatal(err)
	}
	if err := routed.Update(tables(true), nodeMAC); err != nil {
		b.Fatal(err)
	}
	if err := routed.SetMembers([]netip.Addr{peer}); err != nil {
		b.Fatal(err)
	}
	ack := func(port uint16) []byte {
		return (&pkt{src: client, sport: 40000, dst: vip, dport: port, proto: layers.IPProtocolTCP, ack: true, payload: make([]byte, 64)}).build()
	}
	encap := func(frame []byte) []byte {
		out := make([]byte, len(frame)+EncapOverhead)
		copy(out[0:6], nodeMAC)
		copy(out[6:12], []byte{2, 0, 0, 0, 9, 2})
		out[12], out[13] = 0x08, 0x00
		OuterHeader(out[14:34], peer, self, layers.IPProtocolIPv4, len(frame)-14, 1)
		copy(out[34:], frame[14:])
		return out
	}
	// One packet a test run: the program rewrites the frame it forwards or
	// takes off the outer header of, and a run of many repeats would judge
	// the rewritten frame from the second on. The kernel times each run
	// itself (the syscall is not in ns/packet, which every path here,
	// the bare program's included, is measured the same way).
	bench := func(p *ebpf.Program, frame []byte, want uint32) func(*testing.B) {
		return func(b *testing.B) {
			var sum time.Duration
			n := 0
			for b.Loop() {
				ret, d, err := p.Benchmark(frame, 1, nil)
				if err != nil {
					b.Fatal(err)
				}
				if ret != want {
					b.Fatalf("action %d, want %d", ret, want)
				}
				sum += d
				n++
			}
			b.ReportMetric(float64(sum.Nanoseconds())/float64(n), "ns/packet")
		}
	}
	pass := bareXDP(b, xdpPass)
	b.Run("bare-pass", bench(pass, ack(80), xdpPass))
	b.Run("multicast-owned", bench(multicast.Program(), ack(80), xdpPass))
	b.Run("routed-owned", bench(routed.Program(), ack(80), xdpPass))
	b.Run("routed-forwarded", bench(routed.Program(), ack(81), xdpTx))
	b.Run("routed-decapsulated-taken", bench(routed.Program(), encap(ack(80)), xdpPass))
	b.Run("routed-forwarded-on", bench(routed.Program(), encap(ack(81)), xdpTx))
	b.Run("bare-pass-again", bench(pass, ack(80), xdpPass))
}
