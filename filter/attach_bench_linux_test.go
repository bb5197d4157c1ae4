//go:build linux

package filter

import (
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// BenchmarkVethAttach compares the attach points a veth can use for the
// same program: generic XDP and tc ingress (tcx, the shoal_tc build, which
// marks accepted skbs as the host's with bpf_skb_change_type instead of
// rewriting the MAC; the agent's choice), against no program. A
// client namespace sends 64-byte UDP datagrams to an owned VIP port over
// the veth pair; ns/op is one send, which on veth includes the receive
// path up to the server socket (the peer's softirq runs in the sender's
// syscall), so the difference between modes is what the attach point
// costs per packet. delivered is the share the server read. The drop
// cases send to a second port whose buckets are all NotOwned, the fate of
// most VIP frames on every node (N-1 of N); with no program they would be
// delivered, so they have no "none" case.
func BenchmarkVethAttach(b *testing.B) {
	vip, clientIP := netip.MustParseAddr("198.18.0.100"), netip.MustParseAddr("198.18.0.1")
	client, x, mac := vethNode(b, vip, clientIP)
	c := &Config{Seed: 0x5ea3, VIPs: []netip.Addr{vip},
		Rules: []Rule{
			{ID: 9, VIP: vip, PortLo: 9000, PortHi: 9000, Proto: ProtoUDP, Affinity: AffinityNone},
			{ID: 10, VIP: vip, PortLo: 9001, PortHi: 9001, Proto: ProtoUDP, Affinity: AffinityNone},
		}}
	tb := allIn(c, Owned)
	for bk := range tb.States[10] {
		tb.States[10][bk] = NotOwned
	}
	if err := x.Update(tb, mac); err != nil {
		b.Fatal(err)
	}
	ifname := ifnameOf(b, mac)
	x.mu.Lock()
	tc, err := x.tcProgram()
	x.mu.Unlock()
	if err != nil {
		b.Fatal(err)
	}
	srv, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(vip, 9000)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Close() })
	srv.SetReadBuffer(8 << 20)
	var got atomic.Int64
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, err := srv.Read(buf); err != nil {
				return
			}
			got.Add(1)
		}
	}()
	send := func(b *testing.B, port uint16) {
		got.Store(0)
		payload := make([]byte, 64)
		err := inNetns(client, func() error {
			conn, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(clientIP, 31000)), net.UDPAddrFromAddrPort(netip.AddrPortFrom(vip, port)))
			if err != nil {
				return err
			}
			defer conn.Close()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				conn.Write(payload)
			}
			b.StopTimer()
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		// Let the server drain what is queued.
		for last, deadline := int64(-1), time.Now().Add(2*time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			n := got.Load()
			if n == last {
				break
			}
			last = n
		}
		b.ReportMetric(float64(got.Load())/float64(b.N), "delivered")
	}
	// Attach and detach here, in the node namespace this goroutine is in;
	// b.Run runs each mode on a goroutine of its own, in no namespace of
	// the test's.
	idx := ifIndex(b, ifname)
	for _, m := range []struct {
		name   string
		attach func() (link.Link, error)
	}{
		{"none", func() (link.Link, error) { return nil, nil }},
		{"generic-xdp", func() (link.Link, error) {
			return link.AttachXDP(link.XDPOptions{Program: x.Program(), Interface: idx, Flags: link.XDPGenericMode})
		}},
		{"tcx-ingress", func() (link.Link, error) {
			return link.AttachTCX(link.TCXOptions{Program: tc, Interface: idx, Attach: ebpf.AttachTCXIngress})
		}},
	} {
		l, err := m.attach()
		if err != nil {
			b.Fatalf("attach %s: %v", m.name, err)
		}
		b.Run(m.name, func(b *testing.B) {
			before, err := x.Counters()
			if err != nil {
				b.Fatal(err)
			}
			send(b, 9000)
			after, err := x.Counters()
			if err != nil {
				b.Fatal(err)
			}
			if acc := after[9].Accepted - before[9].Accepted; (l != nil) != (acc > 0) {
				b.Fatalf("%s: the program accepted %d packets", m.name, acc)
			}
		})
		if l != nil {
			b.Run("drop-"+m.name, func(b *testing.B) {
				before, err := x.Counters()
				if err != nil {
					b.Fatal(err)
				}
				send(b, 9001)
				after, err := x.Counters()
				if err != nil {
					b.Fatal(err)
				}
				if got.Load() != 0 || after[10].Dropped[DropNotOwned] == before[10].Dropped[DropNotOwned] {
					b.Fatalf("%s: datagrams to a port this node owns no bucket of: %d read, drop count unchanged at %d", m.name, got.Load(), after[10].Dropped[DropNotOwned])
				}
			})
		}
		if l != nil {
			l.Close()
		}
	}
}

// ifnameOf returns the name of the interface with MAC mac.
func ifnameOf(b *testing.B, mac net.HardwareAddr) string {
	ifs, err := net.Interfaces()
	if err != nil {
		b.Fatal(err)
	}
	for _, i := range ifs {
		if i.HardwareAddr.String() == mac.String() {
			return i.Name
		}
	}
	b.Fatalf("no interface with mac %s", mac)
	return ""
}

func ifIndex(b *testing.B, name string) int {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		b.Fatal(err)
	}
	return ifc.Index
}
