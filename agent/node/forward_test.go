package node

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/rules"
)

// TestRoutedForwardTargets runs three nodes in routed mode with forwarding:
// every bucket is taken by exactly one node (ownership, not "everything
// the router sends"), and every other node forwards it to that node, by
// its address and with its MAC, from its own address.
func TestRoutedForwardTargets(t *testing.T) {
	c := newTestCluster(t, 3, 20*time.Millisecond)
	c.forward = &Forwarding{
		MTU: func() int { return 1500 },
		NextHops: func(addrs []netip.Addr) map[netip.Addr]net.HardwareAddr {
			out := map[netip.Addr]net.HardwareAddr{}
			for _, a := range addrs {
				out[a] = testMAC(int(a.As4()[3]))
			}
			return out
		},
	}
	c.rules.set(func(st *rules.State) { st.Settings.MACMode = rules.MACRouted })
	for i := 1; i <= 3; i++ {
		c.start(i)
	}
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{127, 0, 0, byte(i)}) }
	check := func() error {
		for b := range filter.NumBuckets {
			owner := 0
			for i, tn := range c.nodes {
				t := tn.dp.kernel.Load()
				if t == nil || !t.Forwarding() || t.States[1] == nil {
					return errString("node tables not forwarding yet")
				}
				if t.States[1][b] == filter.Owned {
					if owner != 0 {
						return errString("a bucket owned twice")
					}
					owner = i + 1
				}
			}
			if owner == 0 {
				return errString("a bucket owned by nobody")
			}
			for i, tn := range c.nodes {
				if i+1 == owner {
					continue
				}
				t := tn.dp.kernel.Load()
				to := t.ForwardTarget(1, uint16(b))
				if to != addr(owner) {
					return errString("a node forwards a bucket elsewhere than its owner")
				}
				idx := t.Forward[1][b]
				if net.HardwareAddr(t.PeerMACs[idx][:]).String() != testMAC(owner).String() {
					return errString("a forward target without its MAC")
				}
			}
		}
		return nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for err := check(); err != nil; err = check() {
		if time.Now().After(deadline) {
			t.Fatalf("routed tables: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i, tn := range c.nodes {
		if got := tn.dp.kernel.Load().Self; got != addr(i+1) {
			t.Errorf("node %d forwards from %s, want %s", i+1, got, addr(i+1))
		}
	}

}

type errString string

func (e errString) Error() string { return string(e) }
