//go:build linux

package filter

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// inNetns runs f on a goroutine locked to a thread in namespace name. The
// thread is discarded afterwards.
func inNetns(name string, f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		h, err := netns.GetFromName(name)
		if err != nil {
			done <- err
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			done <- err
			return
		}
		done <- f()
	}()
	return <-done
}

// TestVeth attaches the program to the node side of a veth pair, as the
// agent does, and connects from a client namespace to a VIP whose cluster
// MAC the client has as a static neighbour: a connection from a client
// port in an owned bucket reaches the TCP server behind the VIP and
// exchanges data; one from a port in a not-owned bucket never connects.
func TestVeth(t *testing.T) {
	client, node := newNetns(t), newNetns(t)
	va, vb := uniqueName("sva"), uniqueName("svb")
	run(t, "ip", "link", "add", va, "netns", client, "type", "veth", "peer", "name", vb, "netns", node)
	vip := netip.MustParseAddr("198.18.0.100")
	clientIP := netip.MustParseAddr("198.18.0.1")
	cluster := net.HardwareAddr{0x03, 0xbf, 198, 18, 0, 100}
	run(t, "ip", "-n", client, "addr", "add", "198.18.0.1/24", "dev", va)
	run(t, "ip", "-n", client, "link", "set", va, "up")
	run(t, "ip", "-n", client, "neigh", "add", vip.String(), "lladdr", cluster.String(), "dev", va, "nud", "permanent")
	run(t, "ip", "-n", node, "addr", "add", "198.18.0.2/24", "dev", vb)
	run(t, "ip", "-n", node, "addr", "add", vip.String()+"/32", "dev", "lo")
	run(t, "ip", "-n", node, "maddr", "add", cluster.String(), "dev", vb)
	run(t, "ip", "netns", "exec", node, "sysctl", "-q", "-w", "net.ipv4.conf."+vb+".arp_ignore=1", "net.ipv4.conf."+vb+".arp_announce=2")
	run(t, "ip", "-n", node, "link", "set", vb, "up")

	enterNetns(t, node)
	ifc, err := net.InterfaceByName(vb)
	if err != nil {
		t.Fatal(err)
	}
	x := loadXDP(t)

	// Client ports in known buckets: the first is owned, the second not.
	c := &Config{Seed: 0x5ea1, VIPs: []netip.Addr{vip},
		Rules: []Rule{{ID: 7, VIP: vip, PortLo: 8080, PortHi: 8080, Proto: ProtoTCP, Affinity: AffinityNone}}}
	cip := uint32(198)<<24 | 18<<16 | 1
	ownedPort, otherPort := uint16(20000), uint16(20001)
	for Bucket(c.Seed, AffinityNone, cip, otherPort) == Bucket(c.Seed, AffinityNone, cip, ownedPort) {
		otherPort++
	}
	st := new([NumBuckets]BucketState)
	st[Bucket(c.Seed, AffinityNone, cip, ownedPort)] = Owned
	if err := x.Update(&Tables{Config: c, States: map[RuleID]*[NumBuckets]BucketState{7: st}}, ifc.HardwareAddr); err != nil {
		t.Fatalf("Update: %v", err)
	}
	if err := x.Attach(vb); err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if got := x.Mode(); got != AttachGeneric {
		t.Errorf("attach mode on veth: %q, want %q", got, AttachGeneric)
	}

	ln, err := net.Listen("tcp4", netip.AddrPortFrom(vip, 8080).String())
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

	dial := func(port uint16, timeout time.Duration) error {
		return inNetns(client, func() error {
			d := net.Dialer{Timeout: timeout, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(clientIP, port))}
			conn, err := d.Dial("tcp4", netip.AddrPortFrom(vip, 8080).String())
			if err != nil {
				return err
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			msg := []byte("shoal says hello")
			if _, err := conn.Write(msg); err != nil {
				return err
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(conn, got); err != nil {
				return fmt.Errorf("read echo: %w", err)
			}
			if string(got) != string(msg) {
				return fmt.Errorf("echo %q, want %q", got, msg)
			}
			return nil
		})
	}
	if err := dial(ownedPort, 5*time.Second); err != nil {
		t.Errorf("connection from owned bucket (port %d): %v", ownedPort, err)
	}
	err = dial(otherPort, 1500*time.Millisecond)
	var ne net.Error
	if err == nil || !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("connection from not-owned bucket (port %d): %v, want a timeout", otherPort, err)
	}
	cs, err := x.Counters()
	if err != nil {
		t.Fatal(err)
	}
	rc := cs[7]
	if rc.Accepted < 3 || rc.Dropped[DropNotOwned] < 1 {
		t.Errorf("rule 7 counters %+v: want >= 3 accepted (handshake, data) and the SYN dropped", rc)
	}
	t.Logf("rule 7: accepted %d, dropped not-owned %d", rc.Accepted, rc.Dropped[DropNotOwned])
	if err := x.Detach(); err != nil {
		t.Errorf("Detach: %v", err)
	}
	if x.Mode() != AttachNone {
		t.Errorf("mode after Detach: %q", x.Mode())
	}
}
