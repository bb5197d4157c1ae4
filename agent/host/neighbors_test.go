package host

import (
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestNeighborsReadsTheTableOnlyWhenOldOrMissing: lookups within a second
// of a read are answered from it; an address it did not hold reads the
// table again, but not more often than every 100 ms; past a second any
// lookup reads it again, and sees a MAC that changed.
func TestNeighborsReadsTheTableOnlyWhenOldOrMissing(t *testing.T) {
	a, b := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2")
	table := map[netip.Addr]net.HardwareAddr{a: {2, 0, 0, 0, 0, 1}}
	reads := 0
	n := NewNeighbors(func() map[netip.Addr]net.HardwareAddr {
		reads++
		out := map[netip.Addr]net.HardwareAddr{}
		for k, v := range table {
			out[k] = v
		}
		return out
	})
	now := time.Unix(1000, 0)
	n.now = func() time.Time { return now }
	step := func(d time.Duration, addr netip.Addr, wantMAC string, wantReads int) {
		t.Helper()
		now = now.Add(d)
		got := n.MAC(addr)
		if got.String() != wantMAC || reads != wantReads {
			t.Fatalf("after %v: MAC(%v) = %q with %d reads, want %q with %d", d, addr, got, reads, wantMAC, wantReads)
		}
	}
	step(0, a, "02:00:00:00:00:01", 1)
	step(500*time.Millisecond, a, "02:00:00:00:00:01", 1)
	step(0, b, "", 2) // not held: read again
	table[b] = net.HardwareAddr{2, 0, 0, 0, 0, 2}
	step(50*time.Millisecond, b, "", 2) // missing again within 100 ms: no read
	step(50*time.Millisecond, b, "02:00:00:00:00:02", 3)
	table[a] = net.HardwareAddr{2, 0, 0, 0, 0, 3}
	step(900*time.Millisecond, a, "02:00:00:00:00:01", 3) // stale within the second
	step(100*time.Millisecond, a, "02:00:00:00:00:03", 4)
	// An IPv4-mapped address is the IPv4 one.
	step(0, netip.AddrFrom16(a.As16()), "02:00:00:00:00:03", 4)
}
