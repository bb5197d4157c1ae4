//go:build linux

package filter

import (
	"errors"
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
// IPv4 and IPv6, in the attach mode the agent uses on veth (tc ingress)
// and in the one it falls back to on a kernel without tcx (generic XDP).
func TestVeth(t *testing.T) {
	for _, mode := range []struct {
		want  AttachMode
		noTCX bool
	}{{AttachTC, false}, {AttachGeneric, true}} {
		for _, fam := range families {
			t.Run(string(mode.want)+"/"+fam.name, func(t *testing.T) {
				testVeth(t, fam.vip, fam.client, mode.want, mode.noTCX)
			})
		}
	}
}

func testVeth(t *testing.T, vip, clientIP netip.Addr, wantMode AttachMode, noTCX bool) {
	client, x, mac := vethNode(t, vip, clientIP)
	x.noTCX = noTCX

	// Client ports in known buckets: the first is owned, the second not.
	c := &Config{Seed: 0x5ea1, VIPs: []netip.Addr{vip},
		Rules: []Rule{{ID: 7, VIP: vip, PortLo: 8080, PortHi: 8080, Proto: ProtoTCP, Affinity: AffinityNone}}}
	bucket := func(port uint16) uint16 { k := KeyOf(AffinityNone, clientIP, port); return k.Bucket(c.Seed) }
	ownedPort, otherPort := uint16(20000), uint16(20001)
	for bucket(otherPort) == bucket(ownedPort) {
		otherPort++
	}
	st := new([NumBuckets]BucketState)
	st[bucket(ownedPort)] = Owned
	attach(t, x, mac, &Tables{Config: c, States: map[RuleID]*[NumBuckets]BucketState{7: st}})
	if got := x.Mode(); got != wantMode {
		t.Errorf("attach mode on veth: %q, want %q", got, wantMode)
	}
	echoServer(t, netip.AddrPortFrom(vip, 8080))

	if err := echo(client, clientIP, ownedPort, netip.AddrPortFrom(vip, 8080), 5*time.Second); err != nil {
		t.Errorf("connection from owned bucket (port %d): %v", ownedPort, err)
	}
	err := echo(client, clientIP, otherPort, netip.AddrPortFrom(vip, 8080), 1500*time.Millisecond)
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
