//go:build linux

package filter

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"
	"github.com/google/gopacket/layers"
)

// realConn opens, in the current (test) namespace, a listener on vip:80 and
// one established connection to it from client; it returns the
// connection's 4-tuple as the server sees it (client, vip).
func realConn(t *testing.T, vip, client netip.Addr) (conn [2]netip.AddrPort, listener netip.AddrPort) {
	t.Helper()
	network := "tcp4"
	if vip.Is6() {
		network = "tcp6"
	}
	ln, err := net.Listen(network, netip.AddrPortFrom(vip, 80).String())
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(client, 0))}
	c, err := d.Dial(network, netip.AddrPortFrom(vip, 80).String())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if s, ok := <-accepted; ok {
		t.Cleanup(func() { s.Close() })
	} else {
		t.Fatal("accept failed")
	}
	cl := c.LocalAddr().(*net.TCPAddr).AddrPort()
	return [2]netip.AddrPort{netip.AddrPortFrom(cl.Addr().Unmap(), cl.Port()), netip.AddrPortFrom(vip, 80)}, netip.AddrPortFrom(vip, 80)
}

// isIPv6Frame reports whether frame carries IPv6 (behind one VLAN tag at most).
func isIPv6Frame(frame []byte) bool {
	et := binary.BigEndian.Uint16(frame[12:14])
	if et == uint16(layers.EthernetTypeDot1Q) && len(frame) >= 18 {
		et = binary.BigEndian.Uint16(frame[16:18])
	}
	return et == uint16(layers.EthernetTypeIPv6)
}

// lookNoZero drops the rules that counted nothing, so two sets of counters
// compare by what they counted.
func noZero(c Counters) Counters {
	out := Counters{}
	for id, rc := range c {
		if rc != (RuleCounters{}) {
			out[id] = rc
		}
	}
	return out
}

func sub(a, b Counters) Counters {
	out := Counters{}
	for id, rc := range a {
		o := b[id]
		rc.Accepted -= o.Accepted
		rc.HandedOver -= o.HandedOver
		rc.HandedIn -= o.HandedIn
		rc.HandedRefused -= o.HandedRefused
		rc.Forwarded -= o.Forwarded
		for i := range rc.Dropped {
			rc.Dropped[i] -= o.Dropped[i]
		}
		out[id] = rc
	}
	return noZero(out)
}

// TestDifferential runs random frames through the XDP program, its tc build
// and the Go reference under random tables, in a namespace holding a real
// listener and a real connection on a VIP, and wants the same action, the
// same output frame and the same counters (the tc build keeps an accepted
// frame's destination MAC and redirects a handed-over SYN).
func TestDifferential(t *testing.T) {
	vip0, client := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2")
	vip6, client6 := netip.MustParseAddr("2001:db8:1::1"), netip.MustParseAddr("2001:db8:1::2")
	ns := enterNetnsWith(t, vip0, client, vip6, client6)
	fw := newForwarding(t, ns)
	x := loadXDP(t)
	tc := tcBuild(t, x)
	conn, listener := realConn(t, vip0, client)
	conn6, _ := realConn(t, vip6, client6)
	held := &countingConns{conns: conns{conn: true, conn6: true}}
	// IPv6 frames' verdicts, apart, so that the generator's IPv6 paths are
	// known to be reached.
	verdicts6 := map[Verdict]int{}
	reasons6 := map[DropReason]int{}
	fragHits6 := 0

	const tableSets, framesPerSet = 14, 10_000
	rng := rand.New(rand.NewPCG(1, 2))
	out := make([]byte, 4096)
	verdicts := map[Verdict]int{}
	reasons := map[DropReason]int{}
	failures, fragHits := 0, 0
	prevKept, prevHanded := 0, 0 // remapped SYNs taken, handed over under Prev
	for set := 0; set < tableSets; set++ {
		g := &gen{rng: rng, conn: conn, listener: listener, vips: []netip.Addr{vip0}, idBase: uint16(set) << 12}
		if set >= 16 {
			t.Fatal("IP ids of the sets would collide")
		}
		if rng.IntN(2) == 0 {
			// A VIP sharing vip0's last octet: the program's VIP
			// directory groups VIPs by it.
			g.vips = append(g.vips, netip.MustParseAddr("198.18.2.1"))
		}
		for n := rng.IntN(4); n > 0; n-- {
			g.vips = append(g.vips, netip.AddrFrom4([4]byte{198, 18, 1, byte(rng.IntN(256))}))
		}
		if set%2 == 0 {
			// IPv6 VIPs: the real connection's, one sharing its last
			// byte (the IPv6 VIP directory groups by it), and others.
			g.vips = append(g.vips, vip6, netip.MustParseAddr("2001:db8:2::1"))
			for n := rng.IntN(3); n > 0; n-- {
				g.vips = append(g.vips, netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 15: byte(rng.IntN(8))}))
			}
			slices.SortFunc(g.vips, netip.Addr.Compare)
			g.vips = slices.Compact(g.vips)
			g.conn6 = conn6
		}
		routed := set%4 == 2 || set == 9
		tb := g.tables()
		for (set%2 == 1 || routed) && tb.HandTo == nil {
			tb = g.tables() // hand-overs for a rules change (below), pending buckets for routed mode
		}
		// Routed mode: frames come to this node's MAC, and none is a
		// hand-over.
		tb.Routed = routed
		if tb.Routed {
			fw.tables(tb, rng)
			if err := x.SetMembers(fw.members); err != nil {
				t.Fatal(err)
			}
		}
		if set%2 == 1 {
			// After a rules change: remapped SYNs are judged under Prev
			// first, whose copy the program keeps.
			tb.Prev = g.prevOf(tb)
			for len(tb.Remapped()) == 0 {
				tb.Prev = g.prevOf(tb)
			}
			if err := x.Update(tb.Prev, nodeMAC); err != nil {
				t.Fatalf("Update prev: %v", err)
			}
		}
		if err := x.Update(tb, nodeMAC); err != nil {
			t.Fatalf("Update: %v", err)
		}
		remapped := tb.Remapped()
		expired := set%3 == 2
		lease := time.Hour
		if expired {
			lease = -time.Second
		}
		if err := x.RenewLease(lease); err != nil {
			t.Fatal(err)
		}
		switch set % 3 {
		case 0:
			g.hbSelf = netip.MustParseAddrPort("198.18.5.5:7946")
		case 1:
			g.hbSelf = netip.MustParseAddrPort("0.0.0.0:7946")
		}
		g.hbPeers = []netip.AddrPort{netip.MustParseAddrPort("198.18.5.6:7946"), netip.MustParseAddrPort("198.18.5.7:7000")}
		if err := x.SetHeartbeatPeers(g.hbSelf, g.hbPeers); err != nil {
			t.Fatal(err)
		}
		hbBefore, err := x.HeartbeatDrops()
		if err != nil {
			t.Fatal(err)
		}
		before, err := x.Counters()
		if err != nil {
			t.Fatalf("Counters: %v", err)
		}
		ref := NewClassifier(tb, nodeMAC, held)
		ref.SetMembers(fw.members)
		ref.SetLeaseExpired(expired)
		ref.SetHeartbeatPeers(g.hbSelf, g.hbPeers)
		want := Counters{}
		wantHB := uint64(0)
		for i := 0; i < framesPerSet; i++ {
			frame := g.frame()
			if rng.IntN(10) == 0 && len(frame) >= 14 {
				copy(frame[0:6], nodeMAC) // handed over by another node
			}
			if tb.Forwarding() && rng.IntN(3) == 0 {
				frame = fw.wrap(frame, rng, g.hbSelf.Port())
			}
			res, refFrame := ref.ClassifyFrame(append([]byte(nil), frame...))
			if tb.Routed && res.Handed && !res.From.IsValid() {
				t.Fatalf("set %d (routed): a frame judged a hand-over by its MAC", set)
			}
			judged := 1 // builds that judge the frame
			if tcRunnable(frame) {
				judged = 2
			}
			for range judged {
				want.Count(res)
			}
			if remapped[res.Rule] && !res.Handed && !res.State.TakesSYNs() {
				switch res.Verdict {
				case Accept:
					prevKept++
				case HandOver:
					prevHanded++
				}
			}
			if res.Reason == DropNotPeer {
				wantHB += uint64(judged)
			}
			verdicts[res.Verdict]++
			reasons[res.Reason]++
			if res.From.IsValid() {
				fw.decapped++
			}
			if res.Second {
				fw.second++
			}
			if res.Handed && res.From.IsValid() {
				fw.handedIn++
			}
			if isIPv6Frame(frame) {
				verdicts6[res.Verdict]++
				reasons6[res.Reason]++
			}
			// check runs the frame through one build and compares its
			// action and output frame with the reference's.
			check := func(build string, prog *ebpf.Program, wantAct uint32, wantFrame []byte) {
				opts := ebpf.RunOptions{Data: frame, DataOut: out, Context: fw.context(build, len(frame))}
				act, err := prog.Run(&opts)
				if err != nil {
					t.Fatalf("%s prog.Run, frame %d of %d bytes: %v", build, i, len(frame), err)
				}
				if act != wantAct || wantFrame != nil && !bytes.Equal(opts.DataOut, wantFrame) {
					failures++
					t.Errorf("set %d frame %d: %s action %d, reference %+v (want action %d); output equal: %v\nframe %s",
						set, i, build, act, res, wantAct, bytes.Equal(opts.DataOut, wantFrame), hex.EncodeToString(frame))
					if failures > 10 {
						t.FailNow()
					}
				}
			}
			check("xdp", x.Program(), res.Verdict.XDPAction(), refFrame)
			if judged == 2 {
				// The tc build: an accepted frame keeps its MAC.
				wantFrame := refFrame
				if res.Verdict == Accept {
					wantFrame = append([]byte(nil), refFrame...)
					copy(wantFrame[0:6], frame[0:6])
				}
				if res.Verdict == Drop && res.From.IsValid() {
					// A frame too short for the kernel to take its outer
					// header off is dropped with it.
					wantFrame = nil
				}
				check("tc", tc, res.Verdict.tcAction(), wantFrame)
			}
		}
		after, err := x.Counters()
		if err != nil {
			t.Fatalf("Counters: %v", err)
		}
		if diff := cmp.Diff(noZero(want), sub(after, before)); diff != "" {
			t.Errorf("set %d counters (-want +got):\n%s", set, diff)
		}
		hbAfter, err := x.HeartbeatDrops()
		if err != nil {
			t.Fatal(err)
		}
		if hbAfter-hbBefore != wantHB {
			t.Errorf("set %d: %d heartbeats from strangers dropped, reference %d", set, hbAfter-hbBefore, wantHB)
		}
		fragHits += g.fragHits
		fragHits6 += g.fragHits6
	}
	t.Logf("verdicts %v, reasons %v, real connection found %d times", verdicts, reasons, held.found)
	// The generator must reach every path the comparison is meant to cover.
	if fragHits < 200 {
		t.Errorf("only %d later fragments of a datagram whose first fragment was seen", fragHits)
	}
	for _, r := range []DropReason{NoReason, DropNotOwned, DropDirtyNoConn, DropDrainNoConn, DropDisabled, DropMalformed, DropNotPeer} {
		if reasons[r] < 50 {
			t.Errorf("only %d frames with reason %v: the generator misses a path", reasons[r], r)
		}
	}
	if held.found < 50 {
		t.Errorf("only %d frames found the real connection", held.found)
	}
	t.Logf("remapped SYNs that Prev takes: %d kept, %d handed over", prevKept, prevHanded)
	if prevKept < 30 || prevHanded < 20 {
		t.Errorf("remapped SYNs that Prev takes: %d kept, %d handed over: the generator misses the path", prevKept, prevHanded)
	}
	t.Logf("IPv6: verdicts %v, reasons %v, real connection found %d times, %d later fragments of a seen datagram", verdicts6, reasons6, held.found6, fragHits6)
	if fragHits6 < 100 {
		t.Errorf("only %d later IPv6 fragments of a datagram whose first fragment was seen", fragHits6)
	}
	for _, r := range []DropReason{NoReason, DropNotOwned, DropDirtyNoConn, DropDrainNoConn, DropDisabled, DropMalformed} {
		if reasons6[r] < 30 {
			t.Errorf("only %d IPv6 frames with reason %v: the generator misses a path", reasons6[r], r)
		}
	}
	if held.found6 < 30 {
		t.Errorf("only %d IPv6 frames found the real IPv6 connection", held.found6)
	}
	if verdicts6[Pass] < 500 || verdicts6[Accept] < 500 || verdicts6[Drop] < 500 || verdicts6[HandOver] < 30 {
		t.Errorf("IPv6 verdict mix %v too thin", verdicts6)
	}
	if verdicts[Pass] < 1000 || verdicts[Accept] < 1000 || verdicts[Drop] < 1000 || verdicts[HandOver] < 50 {
		t.Errorf("verdict mix %v too thin", verdicts)
	}
	t.Logf("routed: %d forwarded (%d second chances), %d decapsulated (%d SYNs handed in), %d foreign",
		verdicts[Forward], fw.second, fw.decapped, fw.handedIn, reasons[DropForeign])
	if verdicts[Forward] < 500 || fw.second < 50 || fw.decapped < 500 || fw.handedIn < 5 || reasons[DropForeign] < 50 {
		t.Errorf("routed forwarding: %d forwarded, %d second chances, %d decapsulated, %d handed in, %d foreign: the generator misses a path",
			verdicts[Forward], fw.second, fw.decapped, fw.handedIn, reasons[DropForeign])
	}
}

// forwarding is the routed mode's part of TestDifferential: an interface
// in the test's namespace with this node's forwarding address, neighbours
// with known MACs (so the program's route lookup finds them), a target
// with no route, and frames forwarded to this node by members and
// strangers.
type forwarding struct {
	ifindex  int
	mac      [6]byte
	self     netip.Addr
	peers    []netip.Addr // 0: none; one with no route; one is self
	neigh    map[netip.Addr][6]byte
	members  []netip.Addr
	stranger netip.Addr
	decapped int
	second   int
	handedIn int // SYNs forwarded by a pending bucket's target, taken
}

func newForwarding(t *testing.T, ns string) *forwarding {
	fw := &forwarding{self: netip.MustParseAddr("198.18.9.1"), neigh: map[netip.Addr][6]byte{},
		stranger: netip.MustParseAddr("198.18.9.9")}
	run(t, "ip", "-n", ns, "link", "add", "fwd0", "type", "veth", "peer", "name", "fwd1")
	run(t, "ip", "-n", ns, "addr", "add", "198.18.9.1/24", "dev", "fwd0")
	run(t, "ip", "-n", ns, "link", "set", "fwd1", "up")
	run(t, "ip", "-n", ns, "link", "set", "fwd0", "up")
	for i, a := range []string{"198.18.9.2", "198.18.9.3", "198.18.9.5"} {
		mac := [6]byte{0x02, 0, 0, 0, 9, byte(2 + i)}
		run(t, "ip", "-n", ns, "neigh", "add", a, "lladdr", net.HardwareAddr(mac[:]).String(), "dev", "fwd0", "nud", "permanent")
		fw.neigh[netip.MustParseAddr(a)] = mac
	}
	ifc, err := net.InterfaceByName("fwd0")
	if err != nil {
		t.Fatal(err)
	}
	fw.ifindex = ifc.Index
	copy(fw.mac[:], ifc.HardwareAddr)
	fw.peers = []netip.Addr{{}, netip.MustParseAddr("198.18.9.2"), netip.MustParseAddr("198.18.9.3"),
		netip.MustParseAddr("198.18.9.5"), netip.MustParseAddr("198.19.200.1"), fw.self}
	fw.members = []netip.Addr{netip.MustParseAddr("198.18.9.2"), netip.MustParseAddr("198.18.9.3"), fw.self}
	return fw
}

// tables makes tb forward: random targets per bucket, an MTU that some
// frames exceed now and then.
func (fw *forwarding) tables(tb *Tables, rng *rand.Rand) {
	tb.Self = fw.self
	copy(tb.Peers[:], fw.peers)
	for i, p := range fw.peers {
		tb.PeerMACs[i] = fw.neigh[p]
	}
	tb.MTU = []int{0, 1500, 90}[rng.IntN(3)]
	tb.Forward = map[RuleID]*[NumBuckets]uint8{}
	for id, st := range tb.States {
		f := new([NumBuckets]uint8)
		h := tb.HandTo[id]
		for b := range f {
			f[b] = uint8(rng.IntN(len(fw.peers)))
			if h != nil && h[b] == HandPending {
				// Acquiring: from a member, which is the one that forwards
				// the SYNs handed over here; mostly draining meanwhile.
				f[b] = uint8(1 + rng.IntN(2))
				if rng.IntN(2) == 0 {
					st[b] = Draining
				}
			}
		}
		tb.Forward[id] = f
	}
}

// wrap returns frame as a member (or a stranger) forwarded it here, if it
// can be (untagged IP, not a heartbeat, which the program would count
// apart), else frame.
func (fw *forwarding) wrap(frame []byte, rng *rand.Rand, hbPort uint16) []byte {
	if len(frame) < 34 {
		return frame
	}
	et := binary.BigEndian.Uint16(frame[12:14])
	proto := layers.IPProtocolIPv4
	switch {
	case et == 0x86dd:
		proto = layers.IPProtocolIPv6
	case et != 0x0800:
		return frame
	case frame[23] == byte(layers.IPProtocolUDP):
		ihl := int(frame[14]&0x0f) * 4
		if len(frame) >= 14+ihl+4 && binary.BigEndian.Uint16(frame[14+ihl+2:]) == hbPort {
			return frame
		}
	}
	from := fw.members[rng.IntN(2)]
	if rng.IntN(8) == 0 {
		from = fw.stranger
	}
	out := make([]byte, len(frame)+EncapOverhead)
	copy(out[0:6], nodeMAC)
	copy(out[6:12], frame[6:12])
	binary.BigEndian.PutUint16(out[12:14], 0x0800)
	OuterHeader(out[14:34], from, fw.self, proto, len(frame)-14, uint8(rng.IntN(MaxHops+1)))
	if rng.IntN(20) == 0 {
		out[18] = 0x12 // not the forwarding mark: another tunnel's
	}
	copy(out[34:], frame[14:])
	return out
}

// context is the test run's context for build ("xdp" or "tc") on a frame
// of n bytes: received on the forwarding interface.
func (fw *forwarding) context(build string, n int) any {
	if build == "xdp" {
		return xdpMD{DataEnd: uint32(n), IngressIfindex: uint32(fw.ifindex)}
	}
	return skbCtx{Ifindex: uint32(fw.ifindex)}
}

// xdpMD is struct xdp_md; skbCtx the head of struct __sk_buff, up to its
// ifindex (the kernel takes a shorter context).
type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

type skbCtx struct {
	_       [10]uint32
	Ifindex uint32
}

// tcBuild returns the tc build of x's program, over x's maps.
func tcBuild(t *testing.T, x *XDP) *ebpf.Program {
	t.Helper()
	x.mu.Lock()
	defer x.mu.Unlock()
	p, err := x.tcProgram()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// tcRunnable reports whether the kernel's test run of a tc program takes
// frame: one with an Ethernet header and, for IPv4 and IPv6, the whole IP
// header (it refuses shorter ones with EINVAL).
func tcRunnable(frame []byte) bool {
	if len(frame) < 14 {
		return false
	}
	switch binary.BigEndian.Uint16(frame[12:14]) {
	case 0x0800:
		return len(frame) >= 14+20
	case 0x86dd:
		return len(frame) >= 14+40
	}
	return true
}

// tcAction is what the tc build returns for v: TC_ACT_OK for pass and
// accept, TC_ACT_SHOT for drop, TC_ACT_REDIRECT (bpf_redirect) to hand over.
func (v Verdict) tcAction() uint32 {
	switch v {
	case Drop:
		return 2
	case HandOver, Forward:
		return 7
	}
	return 0
}

// TestHashAgreement runs the C hash (the shoal_hash_probe program) against
// filter.HashWords on random IPv4 (2-word) and IPv6 (5-word) keys under
// many seeds.
func TestHashAgreement(t *testing.T) {
	x := loadXDP(t)
	rng := rand.New(rand.NewPCG(3, 4))
	in := make([]byte, 32)
	out := make([]byte, 64)
	for i := 0; i < 20_000; i++ {
		seed := rng.Uint32()
		w := make([]uint32, 2+3*(i%2))
		for j := range w {
			w[j] = rng.Uint32()
		}
		switch i % 6 {
		case 2, 3:
			w[len(w)-1] = 0
		case 4, 5:
			clear(w[len(w)/2:])
		}
		clear(in)
		binary.NativeEndian.PutUint32(in[0:], seed)
		binary.NativeEndian.PutUint32(in[4:], uint32(len(w)))
		for j, v := range w {
			binary.NativeEndian.PutUint32(in[8+4*j:], v)
		}
		opts := ebpf.RunOptions{Data: in, DataOut: out}
		if _, err := x.objs.ShoalHashProbe.Run(&opts); err != nil {
			t.Fatalf("run hash probe: %v", err)
		}
		got := binary.NativeEndian.Uint32(opts.DataOut[28:])
		if want := HashWords(seed, w); got != want {
			t.Fatalf("HashWords(%#x, %#x): C %#x, Go %#x", seed, w, got, want)
		}
	}
}

// TestXDPIPv6 runs IPv6 frames through the program with known tables: an
// owned flow passes with the interface's MAC as destination, a flow in a
// bucket this node does not own is dropped, Neighbor Discovery and traffic
// to other addresses pass untouched, and the counters say so.
func TestXDPIPv6(t *testing.T) {
	x := loadXDP(t)
	c := refConfig6()
	other := netip.MustParseAddr("2001:db8:7::9")
	st := new([NumBuckets]BucketState) // rule 2 (single): refClient6 owned, other not
	mine, theirs := keyFor(AffinitySingle, refClient6, 0), keyFor(AffinitySingle, other, 0)
	if mine.Bucket(c.Seed) == theirs.Bucket(c.Seed) {
		t.Fatal("the two clients share a bucket; pick another")
	}
	st[mine.Bucket(c.Seed)] = Owned
	if err := x.Update(&Tables{Config: c, States: map[RuleID]*[NumBuckets]BucketState{2: st}}, nodeMAC); err != nil {
		t.Fatal(err)
	}
	before, err := x.Counters()
	if err != nil {
		t.Fatal(err)
	}
	tooMany := tcp6(refVIP6, 40000, 80)
	for range MaxExtHeaders + 1 {
		tooMany.exts = append(tooMany.exts, ext6{nh: nhDestOpts})
	}
	tests := []struct {
		name   string
		frame  []byte
		action uint32
		mac    net.HardwareAddr // the destination MAC the frame leaves with
	}{
		{"owned", tcp6(refVIP6, 40000, 80).build(), xdpPass, nodeMAC},
		{"owned, behind extension headers and a vlan tag",
			pkt6{vlan: true, src: refClient6, dst: refVIP6, sport: 40000, dport: 80, proto: layers.IPProtocolTCP, exts: []ext6{{nh: nhHopByHop}, {nh: nhRouting, units: 1}}}.build(), xdpPass, nodeMAC},
		{"not owned", pkt6{src: other, dst: refVIP6, sport: 40000, dport: 80, proto: layers.IPProtocolTCP}.build(), xdpDrop, clusterMAC},
		{"neighbour solicitation to the VIP", pkt6{src: other, dst: refVIP6, proto: layers.IPProtocolICMPv6, icmpType: 135, payload: make([]byte, 20)}.build(), xdpPass, clusterMAC},
		{"not a VIP", pkt6{src: other, dst: netip.MustParseAddr("2001:db8::99"), sport: 1, dport: 80, proto: layers.IPProtocolTCP}.build(), xdpPass, clusterMAC},
		{"too many extension headers", tooMany.build(), xdpDrop, clusterMAC},
	}
	out := make([]byte, 4096)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := ebpf.RunOptions{Data: tt.frame, DataOut: out}
			act, err := x.Program().Run(&opts)
			if err != nil {
				t.Fatal(err)
			}
			if act != tt.action {
				t.Errorf("action %d, want %d", act, tt.action)
			}
			want := append(append([]byte(nil), tt.mac...), tt.frame[6:]...)
			if !bytes.Equal(opts.DataOut, want) {
				t.Errorf("frame out %x\nwant          %x", opts.DataOut, want)
			}
		})
	}
	after, err := x.Counters()
	if err != nil {
		t.Fatal(err)
	}
	var want2, wantDefault RuleCounters
	want2.Accepted = 2
	want2.Dropped[DropNotOwned] = 1
	wantDefault.Dropped[DropMalformed] = 1
	if diff := cmp.Diff(Counters{2: want2, DefaultRule: wantDefault}, sub(after, before)); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}
}

func TestUpdateCapacity(t *testing.T) {
	x := loadXDP(t)
	c := &Config{}
	for i := 0; i <= MaxVIPs; i++ {
		c.VIPs = append(c.VIPs, netip.AddrFrom4([4]byte{198, 18, 0, byte(i + 1)}))
	}
	if err := x.Update(&Tables{Config: c}, nodeMAC); !errors.Is(err, ErrCapacity) {
		t.Errorf("Update with %d VIPs: %v, want ErrCapacity", len(c.VIPs), err)
	}
	c.VIPs = c.VIPs[:1]
	for i := 0; i <= MaxRules; i++ {
		c.Rules = append(c.Rules, Rule{ID: RuleID(i + 1), PortLo: uint16(i), PortHi: uint16(i), Proto: ProtoTCP})
	}
	if err := x.Update(&Tables{Config: c}, nodeMAC); !errors.Is(err, ErrCapacity) {
		t.Errorf("Update with %d rules: %v, want ErrCapacity", len(c.Rules), err)
	}
	c.Rules = c.Rules[:MaxRules]
	if err := x.Update(&Tables{Config: c}, nodeMAC); err != nil {
		t.Errorf("Update with %d rules: %v", len(c.Rules), err)
	}
	if err := x.Update(&Tables{Config: c}, nodeMAC[:5]); err == nil {
		t.Error("Update with a 5-byte MAC: no error")
	}
}

// TestCountersFollowRules checks that a rule keeps its counts across
// updates, that a new rule starts at zero, and that a removed rule's counts
// do not show up under the rule that takes its place.
func TestCountersFollowRules(t *testing.T) {
	x := loadXDP(t)
	vip := netip.MustParseAddr("198.18.0.1")
	rule := func(id RuleID, port uint16) Rule {
		return Rule{ID: id, VIP: vip, PortLo: port, PortHi: port, Proto: ProtoTCP}
	}
	send := func(port uint16, n int) {
		frame := (&pkt{src: netip.MustParseAddr("198.18.3.3"), sport: 5000, dst: vip, dport: port, proto: layers.IPProtocolTCP, ack: true}).build()
		for i := 0; i < n; i++ {
			if _, _, err := x.Run(frame); err != nil {
				t.Fatal(err)
			}
		}
	}
	update := func(rs ...Rule) {
		c := &Config{VIPs: []netip.Addr{vip}, Rules: rs}
		if err := x.Update(allIn(c, Owned), nodeMAC); err != nil {
			t.Fatal(err)
		}
	}
	update(rule(1, 80), rule(2, 81))
	send(80, 3)
	send(81, 5)
	update(rule(2, 81), rule(3, 82)) // 1 leaves, 3 arrives
	send(82, 7)
	update(rule(2, 81), rule(3, 82), rule(4, 80)) // 4 may reuse 1's slot
	send(80, 1)
	got, err := x.Counters()
	if err != nil {
		t.Fatal(err)
	}
	want := Counters{2: {Accepted: 5}, 3: {Accepted: 7}, 4: {Accepted: 1}}
	if diff := cmp.Diff(want, noZero(got)); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}
}

// TestPrevHeldAcrossPushes pushes tables that name the same Prev several
// times in a row, as a rules change's keeping and hand-over do, and then
// tables without it: the program must judge remapped SYNs by Prev's copy
// as pushed every time (the round-robin of table versions alone would
// overwrite it on the second push), and by the new tables alone after.
func TestPrevHeldAcrossPushes(t *testing.T) {
	vip0, client := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2")
	enterNetnsWith(t, vip0, client)
	x := loadXDP(t)
	conn, listener := realConn(t, vip0, client)
	rng := rand.New(rand.NewPCG(3, 4))
	g := &gen{rng: rng, conn: conn, listener: listener, vips: []netip.Addr{vip0}}
	base := g.tables()
	prev := g.prevOf(base)
	prev.Config.Seed = base.Config.Seed + 1 // every rule remapped
	if err := x.Update(prev, nodeMAC); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 4096)
	// One reference throughout: it remembers first fragments across
	// pushes as the program's LRU does.
	ref := NewClassifier(prev, nodeMAC, conns{conn: true})
	check := func(step string, tb *Tables) (kept int) {
		ref.SetTables(tb)
		remapped := tb.Remapped()
		for i := range 3000 {
			frame := g.frame()
			refFrame := append([]byte(nil), frame...)
			res := ref.Classify(refFrame)
			if remapped[res.Rule] && res.Verdict == Accept && !res.State.TakesSYNs() && !res.Handed {
				kept++
			}
			opts := ebpf.RunOptions{Data: frame, DataOut: out}
			act, err := x.Program().Run(&opts)
			if err != nil {
				t.Fatal(err)
			}
			if act != res.Verdict.XDPAction() || !bytes.Equal(opts.DataOut, refFrame) {
				t.Fatalf("%s, frame %d: xdp action %d, reference %+v\nframe %s", step, i, act, res, hex.EncodeToString(frame))
			}
		}
		return kept
	}
	total := 0
	for push := range 5 {
		tb := &Tables{Config: base.Config, States: map[RuleID]*[NumBuckets]BucketState{},
			HandTo: map[RuleID]*[NumBuckets]uint8{}, Prev: prev}
		tb.HandMACs[1] = [6]byte{0x02, 0, 0, 0, 1, 1}
		for _, id := range base.Config.RuleIDs() {
			st, h := new([NumBuckets]BucketState), new([NumBuckets]uint8)
			for b := range st {
				st[b] = BucketState(rng.IntN(4))
				h[b] = []uint8{0, 1, HandKeep, HandPending}[rng.IntN(4)]
			}
			tb.States[id], tb.HandTo[id] = st, h
		}
		if err := x.Update(tb, nodeMAC); err != nil {
			t.Fatal(err)
		}
		total += check(fmt.Sprintf("push %d with prev", push), tb)
	}
	if total < 50 {
		t.Errorf("only %d remapped SYNs kept under prev over five pushes: the frames miss the path", total)
	}
	for push := range 3 {
		tb := g.tables()
		if err := x.Update(tb, nodeMAC); err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("push %d without prev", push), tb)
	}
}
