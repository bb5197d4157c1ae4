//go:build linux

package filter

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestForwardVeth forwards for real, in the attach mode the agent picks on
// veth (tc ingress): a client's route sends the VIP to node A, which owns
// nothing and forwards every packet, encapsulated, over a bridge to node
// B, which owns every bucket, takes the packets out and answers the
// client directly. A TCP connection opens, uploads 4 MB in full-size
// segments (the MSS B's SYN-ACK advertised leaves room for the
// encapsulation) and gets the digest of what B received; the counters
// show the forwarding on both sides. IPv4 and IPv6 clients (IPv6 in IPv4
// between the nodes).
func TestForwardVeth(t *testing.T) {
	for _, fam := range []struct {
		name        string
		vip, client netip.Addr
		mss         int
	}{
		{"ipv4", netip.MustParseAddr("198.18.61.1"), netip.MustParseAddr("198.18.60.10"), 1500 - 20 - 40},
		{"ipv6", netip.MustParseAddr("2001:db8:61::1"), netip.MustParseAddr("2001:db8:60::10"), 1500 - 20 - 60},
	} {
		t.Run(fam.name, func(t *testing.T) { testForwardVeth(t, fam.vip, fam.client, fam.mss) })
	}
}

func testForwardVeth(t *testing.T, vip, clientIP netip.Addr, wantMSS int) {
	sw, cli, na, nb := newNetns(t), newNetns(t), newNetns(t), newNetns(t)
	run(t, "ip", "-n", sw, "link", "add", "br0", "type", "bridge")
	run(t, "ip", "-n", sw, "link", "set", "br0", "up")
	link := func(ns, ifname string) {
		peer := uniqueName("swp")
		run(t, "ip", "link", "add", ifname, "netns", ns, "type", "veth", "peer", "name", peer, "netns", sw)
		run(t, "ip", "-n", sw, "link", "set", peer, "master", "br0")
		run(t, "ip", "-n", sw, "link", "set", peer, "up")
		run(t, "ip", "-n", ns, "link", "set", ifname, "up")
	}
	link(cli, "eth0")
	// Full-size segments, one a frame, as from a physical NIC: no TSO or
	// GSO super-frames, which the kernel would cut to fit after the
	// encapsulation by itself.
	run(t, "ip", "-n", cli, "link", "set", "eth0", "gso_max_segs", "1")
	link(na, "eth0")
	link(nb, "eth0")
	addrA, addrB := netip.MustParseAddr("198.18.60.1"), netip.MustParseAddr("198.18.60.2")
	run(t, "ip", "-n", na, "addr", "add", addrA.String()+"/24", "dev", "eth0")
	run(t, "ip", "-n", nb, "addr", "add", addrB.String()+"/24", "dev", "eth0")
	if vip.Is4() {
		run(t, "ip", "-n", cli, "addr", "add", clientIP.String()+"/24", "dev", "eth0")
		run(t, "ip", "-n", cli, "route", "add", vip.String()+"/32", "via", addrA.String())
		for _, ns := range []string{na, nb} {
			run(t, "ip", "-n", ns, "addr", "add", vip.String()+"/32", "dev", "lo")
		}
	} else {
		// The client reaches A at its IPv6 address; the nodes answer
		// from theirs.
		run(t, "ip", "-n", cli, "addr", "add", clientIP.String()+"/64", "dev", "eth0", "nodad")
		run(t, "ip", "-n", na, "addr", "add", "2001:db8:60::1/64", "dev", "eth0", "nodad")
		run(t, "ip", "-n", nb, "addr", "add", "2001:db8:60::2/64", "dev", "eth0", "nodad")
		run(t, "ip", "-n", cli, "route", "add", vip.String()+"/128", "via", "2001:db8:60::1")
		for _, ns := range []string{na, nb} {
			run(t, "ip", "-n", ns, "addr", "add", vip.String()+"/128", "dev", "lo", "nodad")
		}
	}
	macOf := func(ns string) (mac [6]byte) {
		if err := inNetns(ns, func() error {
			ifc, err := net.InterfaceByName("eth0")
			if err == nil {
				copy(mac[:], ifc.HardwareAddr)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return mac
	}
	macA, macB := macOf(na), macOf(nb)

	c := &Config{Seed: 0x5ea1, VIPs: []netip.Addr{vip},
		Rules: []Rule{{ID: 7, VIP: vip, PortLo: 80, PortHi: 80, Proto: ProtoTCP, Affinity: AffinityNone}}}
	node := func(ns string, self, peer netip.Addr, peerMAC [6]byte, st BucketState) *XDP {
		var x *XDP
		if err := inNetns(ns, func() error {
			var err error
			if x, err = LoadXDP(); err != nil {
				return err
			}
			states, fwd := new([NumBuckets]BucketState), new([NumBuckets]uint8)
			for b := range states {
				states[b], fwd[b] = st, 1
			}
			tb := &Tables{Config: c, States: map[RuleID]*[NumBuckets]BucketState{7: states}, Routed: true,
				Self: self, Forward: map[RuleID]*[NumBuckets]uint8{7: fwd}, MTU: 1500}
			tb.Peers[1], tb.PeerMACs[1] = peer, peerMAC
			ifc, err := net.InterfaceByName("eth0")
			if err != nil {
				return err
			}
			if err := x.Attach("eth0"); err != nil {
				return err
			}
			if err := x.SetMembers([]netip.Addr{peer}); err != nil {
				return err
			}
			return x.Update(tb, ifc.HardwareAddr)
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { x.Close() })
		return x
	}
	xa := node(na, addrA, addrB, macB, NotOwned)
	xb := node(nb, addrB, addrA, macA, Owned)
	if xa.Mode() != AttachTC {
		t.Errorf("attach mode on veth: %q, want tc", xa.Mode())
	}

	// B: sha256 of what the client sends, until it closes its side.
	var ln net.Listener
	if err := inNetns(nb, func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(vip, 80).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				h := sha256.New()
				io.Copy(h, conn)
				conn.Write(h.Sum(nil))
			}()
		}
	}()

	payload := bytes.Repeat([]byte("shoal forwards "), 4<<20/15)
	want := sha256.Sum256(payload)
	var mss int
	if err := inNetns(cli, func() error {
		conn, err := net.DialTimeout("tcp", netip.AddrPortFrom(vip, 80).String(), 5*time.Second)
		if err != nil {
			return fmt.Errorf("dial through A: %w", err)
		}
		defer conn.Close()
		tc := conn.(*net.TCPConn)
		raw, _ := tc.SyscallConn()
		raw.Control(func(fd uintptr) { mss, _ = unix.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, unix.TCP_MAXSEG) })
		conn.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := conn.Write(payload); err != nil {
			return fmt.Errorf("upload: %w", err)
		}
		tc.CloseWrite()
		got, err := io.ReadAll(conn)
		if err != nil {
			return fmt.Errorf("read digest: %w", err)
		}
		if !bytes.Equal(got, want[:]) {
			return fmt.Errorf("digest %x, want %x: B did not receive what was sent", got, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if mss > wantMSS || mss < 500 {
		t.Errorf("client's MSS %d, want at most %d (B's SYN-ACK clamped)", mss, wantMSS)
	}
	fa, err := xa.ForwardCounters()
	if err != nil {
		t.Fatal(err)
	}
	fb, err := xb.ForwardCounters()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("MSS %d; A: %+v; B: %+v", mss, fa, fb)
	if fa.Peers[addrB].Forwarded < 50 || fb.Peers[addrA].Received < 50 {
		t.Errorf("A forwarded %d to B, B received %d from A: want the whole upload's packets", fa.Peers[addrB].Forwarded, fb.Peers[addrA].Received)
	}
	if fa.TooBig+fa.NoRoute+fa.HopLimit+fb.Foreign != 0 {
		t.Errorf("forwarding drops: A %+v, B %+v", fa, fb)
	}
}
