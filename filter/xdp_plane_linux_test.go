//go:build linux

package filter

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket/layers"
)

// TestUpdatePartialFailure makes an Update fail half way through the VIP
// directory and checks that the next Update clears what it half wrote: a
// VIP of the failed tables is not judged as a VIP afterwards.
func TestUpdatePartialFailure(t *testing.T) {
	x := loadXDP(t)
	a, b, c := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("198.18.0.3")
	tables := func(vips ...netip.Addr) *Tables { return allIn(&Config{VIPs: vips}, NotOwned) }
	toB := (&pkt{src: netip.MustParseAddr("198.18.9.9"), sport: 1000, dst: b, dport: 80, proto: layers.IPProtocolTCP, ack: true}).build()
	judge := func() uint32 {
		t.Helper()
		act, _, err := x.Run(toB)
		if err != nil {
			t.Fatal(err)
		}
		return act
	}
	// One version gets {a}, the next {c}; then the next is written.
	for _, vs := range [][]netip.Addr{{a}, {c}} {
		if err := x.Update(tables(vs...), nodeMAC); err != nil {
			t.Fatal(err)
		}
	}
	writes := 0
	put := x.putVIPs
	x.putVIPs = func(k uint32, vb *shoalVipBucket) error {
		if writes++; writes > 1 {
			return errors.New("injected failure")
		}
		return put(k, vb)
	}
	// {b, a} to the next version: b's entry is written first (keys in map order,
	// so try until the first write is b's), then the failure.
	failed := false
	for i := 0; i < 50 && !failed; i++ {
		writes = 0
		if err := x.Update(tables(b, a), nodeMAC); err == nil {
			t.Fatal("Update with an injected failure: no error")
		}
		var vb shoalVipBucket
		next := (x.version + 1) % tableVersions
		if err := x.objs.Vips.Lookup(next*vipDir+2, &vb); err != nil {
			t.Fatal(err)
		}
		failed = vb.N == 1
	}
	if !failed {
		t.Fatal("the failing Update never wrote b's entry first")
	}
	x.putVIPs = put
	if act := judge(); act != xdpPass {
		t.Fatalf("after the failed Update, a packet to %v: action %d, want pass (the active tables have no such VIP)", b, act)
	}
	// The next write of that version must clear b's half-written entry.
	if err := x.Update(tables(a), nodeMAC); err != nil {
		t.Fatal(err)
	}
	if act := judge(); act != xdpPass {
		t.Errorf("a packet to %v, a VIP only of the failed tables: action %d, want pass", b, act)
	}
}

// TestLease runs packets through the program with the lease in force and
// expired: once it has expired, owned and owned-dirty buckets behave as
// draining, so new connections are refused and held ones keep flowing.
func TestLease(t *testing.T) {
	vip, client := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2")
	ns := enterNetnsWith(t, vip, client)
	x := loadXDP(t)
	conn, _ := realConn(t, vip, client)
	est := pkt{src: conn[0].Addr(), sport: conn[0].Port(), dst: vip, dport: 80, proto: layers.IPProtocolTCP, ack: true}
	syn := pkt{src: netip.MustParseAddr("198.18.0.3"), sport: 40001, dst: vip, dport: 80, proto: layers.IPProtocolTCP, syn: true}
	udp := pkt{src: netip.MustParseAddr("198.18.0.3"), sport: 40001, dst: vip, dport: 80, proto: layers.IPProtocolUDP}
	tests := []struct {
		name  string
		state BucketState
		lease time.Duration
		p     pkt
		want  Verdict
	}{
		{"owned syn, lease held", Owned, time.Hour, syn, Accept},
		{"owned syn, lease expired", Owned, -time.Second, syn, Drop},
		{"owned udp, lease expired", Owned, -time.Second, udp, Drop},
		{"owned established, lease expired", Owned, -time.Second, est, Accept},
		{"dirty syn, lease held", OwnedDirty, time.Hour, syn, Accept},
		{"dirty syn, lease expired", OwnedDirty, -time.Second, syn, Drop},
		{"dirty established, lease expired", OwnedDirty, -time.Second, est, Accept},
		{"draining established, lease expired", Draining, -time.Second, est, Accept},
		{"not owned, lease held", NotOwned, time.Hour, syn, Drop},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			enterNetns(t, ns)
			c := &Config{Seed: 3, VIPs: []netip.Addr{vip}, Rules: []Rule{{ID: 1, PortLo: 1, PortHi: 65535, Proto: ProtoBoth}}}
			tb := allIn(c, tt.state)
			if err := x.Update(tb, nodeMAC); err != nil {
				t.Fatal(err)
			}
			if err := x.RenewLease(tt.lease); err != nil {
				t.Fatal(err)
			}
			frame := tt.p.build()
			ref := append([]byte(nil), frame...)
			cl := NewClassifier(tb, nodeMAC, conns{conn: true})
			cl.SetLeaseExpired(tt.lease < 0)
			if res := cl.Classify(ref); res.Verdict != tt.want {
				t.Errorf("reference: %+v, want %v", res, tt.want)
			}
			act, out, err := x.Run(frame)
			if err != nil {
				t.Fatal(err)
			}
			if act != tt.want.XDPAction() || !bytes.Equal(out, ref) {
				t.Errorf("xdp action %d (output equal %v), want %d", act, bytes.Equal(out, ref), tt.want.XDPAction())
			}
		})
	}
}

// TestFragmentsFollowFlow sends the fragments of TCP segments through a
// draining bucket: those of the node's own connection get through, the
// first fragment by its socket and the later ones by its remembered
// verdict; those of another flow in the same bucket do not. A later
// fragment of a datagram whose first fragment was never seen is judged by
// the rule for port 0.
func TestFragmentsFollowFlow(t *testing.T) {
	vip, client := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2")
	enterNetnsWith(t, vip, client)
	x := loadXDP(t)
	conn, _ := realConn(t, vip, client)
	// Affinity single: every flow of the client shares its bucket.
	c := &Config{Seed: 5, VIPs: []netip.Addr{vip}, Rules: []Rule{{ID: 1, PortLo: 1, PortHi: 65535, Proto: ProtoTCP, Affinity: AffinitySingle}}}
	tb := allIn(c, Draining)
	if err := x.Update(tb, nodeMAC); err != nil {
		t.Fatal(err)
	}
	ref := NewClassifier(tb, nodeMAC, conns{conn: true})
	frag := func(sport uint16, id uint16, first bool) []byte {
		p := pkt{src: conn[0].Addr(), sport: sport, dst: vip, dport: 80, proto: layers.IPProtocolTCP, ack: true, id: id, payload: make([]byte, 64)}
		if first {
			p.mf = true
		} else {
			p.fragOff = 11
		}
		return p.build()
	}
	held, other := conn[0].Port(), conn[0].Port()+1
	tests := []struct {
		name  string
		frame []byte
		want  Verdict
	}{
		{"first fragment of the held connection", frag(held, 100, true), Accept},
		{"its later fragment", frag(held, 100, false), Accept},
		{"its later fragment again", frag(held, 100, false), Accept},
		{"first fragment of another flow", frag(other, 101, true), Drop},
		{"its later fragment", frag(other, 101, false), Drop},
		{"a later fragment never introduced", frag(held, 102, false), Drop},
	}
	for _, tt := range tests {
		rf := append([]byte(nil), tt.frame...)
		if res := ref.Classify(rf); res.Verdict != tt.want {
			t.Errorf("%s: reference %+v, want %v", tt.name, res, tt.want)
		}
		act, out, err := x.Run(tt.frame)
		if err != nil {
			t.Fatal(err)
		}
		if act != tt.want.XDPAction() || !bytes.Equal(out, rf) {
			t.Errorf("%s: xdp action %d (output equal %v), want %d", tt.name, act, bytes.Equal(out, rf), tt.want.XDPAction())
		}
	}
}

// vethNode builds a client namespace and a node namespace joined by a veth
// pair, the node holding vip on lo and the program attached to its side
// (generic mode, as the agent attaches on veth). The client has the VIP's
// cluster MAC as a static neighbour; for an IPv6 VIP the addresses are in
// 2001:db8::/64. It returns the client namespace, the loaded program and
// the node's interface MAC; the caller's goroutine is in the node
// namespace.
func vethNode(t testing.TB, vip, clientIP netip.Addr) (client string, x *XDP, mac net.HardwareAddr) {
	t.Helper()
	client, node := newNetns(t), newNetns(t)
	va, vb := uniqueName("sva"), uniqueName("svb")
	run(t, "ip", "link", "add", va, "netns", client, "type", "veth", "peer", "name", vb, "netns", node)
	cluster := testClusterMAC(vip)
	if vip.Is6() {
		run(t, "ip", "-n", client, "addr", "add", clientIP.String()+"/64", "dev", va, "nodad")
		run(t, "ip", "-n", client, "link", "set", va, "up")
		run(t, "ip", "-n", client, "neigh", "add", vip.String(), "lladdr", cluster.String(), "dev", va, "nud", "permanent")
		run(t, "ip", "-n", node, "addr", "add", "2001:db8::2/64", "dev", vb, "nodad")
		run(t, "ip", "-n", node, "addr", "add", vip.String()+"/128", "dev", "lo", "nodad")
	} else {
		run(t, "ip", "-n", client, "addr", "add", clientIP.String()+"/24", "dev", va)
		run(t, "ip", "-n", client, "link", "set", va, "up")
		run(t, "ip", "-n", client, "neigh", "add", vip.String(), "lladdr", cluster.String(), "dev", va, "nud", "permanent")
		run(t, "ip", "-n", node, "addr", "add", "198.18.0.2/24", "dev", vb)
		run(t, "ip", "-n", node, "addr", "add", vip.String()+"/32", "dev", "lo")
		run(t, "ip", "netns", "exec", node, "sysctl", "-q", "-w", "net.ipv4.conf."+vb+".arp_ignore=1", "net.ipv4.conf."+vb+".arp_announce=2")
	}
	run(t, "ip", "-n", node, "maddr", "add", cluster.String(), "dev", vb)
	run(t, "ip", "-n", node, "link", "set", vb, "up")
	enterNetns(t, node)
	ifc, err := net.InterfaceByName(vb)
	if err != nil {
		t.Fatal(err)
	}
	x = loadXDP(t)
	t.Cleanup(func() { x.Detach() })
	return client, x, ifc.HardwareAddr
}

// testClusterMAC is agent.ClusterMAC (which filter cannot import): 03:bf
// and an IPv4 VIP's bytes, 03:be and an IPv6 VIP's last four.
func testClusterMAC(vip netip.Addr) net.HardwareAddr {
	if vip.Is4() {
		b := vip.As4()
		return net.HardwareAddr{0x03, 0xbf, b[0], b[1], b[2], b[3]}
	}
	b := vip.As16()
	return net.HardwareAddr{0x03, 0xbe, b[12], b[13], b[14], b[15]}
}

// families are the VIP and client addresses the veth tests run with.
var families = []struct {
	name        string
	vip, client netip.Addr
}{
	{"ipv4", netip.MustParseAddr("198.18.0.100"), netip.MustParseAddr("198.18.0.1")},
	{"ipv6", netip.MustParseAddr("2001:db8::100"), netip.MustParseAddr("2001:db8::1")},
}

func attach(t *testing.T, x *XDP, mac net.HardwareAddr, tb *Tables) {
	t.Helper()
	if err := x.Update(tb, mac); err != nil {
		t.Fatalf("Update: %v", err)
	}
	ifname := ""
	ifs, _ := net.Interfaces()
	for _, i := range ifs {
		if bytes.Equal(i.HardwareAddr, mac) {
			ifname = i.Name
		}
	}
	if err := x.Attach(ifname); err != nil {
		t.Fatalf("Attach: %v", err)
	}
}

// TestSynCookie completes real handshakes through an owned-dirty bucket
// with the node answering every SYN with a cookie (tcp_syncookies=2): the
// handshake's ACK finds only the listener, and gets through because its
// cookie is valid, as does the data after it. IPv4 and IPv6.
func TestSynCookie(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			vip, clientIP := fam.vip, fam.client
			client, x, mac := vethNode(t, vip, clientIP)
			run(t, "sysctl", "-q", "-w", "net.ipv4.tcp_syncookies=2") // in the node namespace: the thread is there (IPv6 too)
			c := &Config{Seed: 0x5ea1, VIPs: []netip.Addr{vip},
				Rules: []Rule{{ID: 7, VIP: vip, PortLo: 8080, PortHi: 8080, Proto: ProtoTCP, Affinity: AffinityNone}}}
			port := uint16(20000)
			st := new([NumBuckets]BucketState)
			k := KeyOf(AffinityNone, clientIP, port)
			st[k.Bucket(c.Seed)] = OwnedDirty
			attach(t, x, mac, &Tables{Config: c, States: map[RuleID]*[NumBuckets]BucketState{7: st}})
			echoServer(t, netip.AddrPortFrom(vip, 8080))
			if err := echo(client, clientIP, port, netip.AddrPortFrom(vip, 8080), 5*time.Second); err != nil {
				t.Errorf("connection through a dirty bucket with SYN cookies: %v", err)
			}
			cs, err := x.Counters()
			if err != nil {
				t.Fatal(err)
			}
			if rc := cs[7]; rc.Accepted < 3 || rc.Dropped[DropDirtyNoConn] != 0 {
				t.Errorf("rule 7 counters %+v: want the SYN, the cookie ACK and the data accepted, nothing dropped", rc)
			}
		})
	}
}

// TestLargeUDP sends UDP datagrams larger than the link's MTU (so the
// client fragments them) to a UDP rule: the first fragment is judged by
// its ports in an owned bucket, the others follow it, and the server
// receives whole datagrams. Later fragments judged on their own would fall
// to the rule for port 0, here the default rule, which this node does not
// own. IPv4 and IPv6 (whose fragments carry a fragment header).
func TestLargeUDP(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			vip, clientIP := fam.vip, fam.client
			client, x, mac := vethNode(t, vip, clientIP)
			c := &Config{Seed: 0x5ea2, VIPs: []netip.Addr{vip},
				Rules: []Rule{{ID: 8, VIP: vip, PortLo: 9000, PortHi: 9000, Proto: ProtoUDP, Affinity: AffinityNone}}}
			port := uint16(21000)
			st := new([NumBuckets]BucketState)
			k := KeyOf(AffinityNone, clientIP, port)
			st[k.Bucket(c.Seed)] = Owned
			attach(t, x, mac, &Tables{Config: c, States: map[RuleID]*[NumBuckets]BucketState{8: st}})
			srv, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(vip, 9000)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Close() })
			const size = 4000
			err = inNetns(client, func() error {
				conn, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(clientIP, port)), net.UDPAddrFromAddrPort(netip.AddrPortFrom(vip, 9000)))
				if err != nil {
					return err
				}
				defer conn.Close()
				for i := 0; i < 3; i++ {
					if _, err := conn.Write(bytes.Repeat([]byte{byte(i)}, size)); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatalf("send: %v", err)
			}
			srv.SetReadDeadline(time.Now().Add(3 * time.Second))
			buf := make([]byte, 2*size)
			got := 0
			for got < 3 {
				n, err := srv.Read(buf)
				if err != nil {
					break
				}
				if n != size {
					t.Errorf("datagram of %d bytes, want %d", n, size)
				}
				got++
			}
			if got != 3 {
				t.Errorf("server received %d of 3 fragmented datagrams", got)
			}
			cs, err := x.Counters()
			if err != nil {
				t.Fatal(err)
			}
			if rc := cs[8]; rc.Accepted < 9 || cs[DefaultRule].Accepted != 0 {
				t.Errorf("counters %+v: want 3 fragments a datagram accepted under rule 8", cs)
			}
		})
	}
}

func echoServer(t *testing.T, at netip.AddrPort) {
	t.Helper()
	ln, err := net.Listen("tcp", at.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			s, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer s.Close(); io.Copy(s, s) }()
		}
	}()
}

// echo connects from the client namespace and expects its message back.
func echo(ns string, from netip.Addr, port uint16, to netip.AddrPort, timeout time.Duration) error {
	return inNetns(ns, func() error {
		d := net.Dialer{Timeout: timeout, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, port))}
		conn, err := d.Dial("tcp", to.String())
		if err != nil {
			return err
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(timeout))
		msg := []byte("shoal says hello")
		if _, err := conn.Write(msg); err != nil {
			return err
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(conn, got); err != nil {
			return fmt.Errorf("read echo: %w", err)
		}
		if !bytes.Equal(got, msg) {
			return fmt.Errorf("echo %q, want %q", got, msg)
		}
		return nil
	})
}
