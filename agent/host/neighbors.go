package host

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// Neighbors answers MAC lookups from the kernel's neighbour table, read at
// most once per NeighborsMaxAge, and again, at most once per
// NeighborsMissAge, for an address the last read did not hold (a peer that
// joined since). The reconciler asks for its peers' MACs in every push with
// hand-overs, and in a rule change that remaps a 32-node cluster a netlink
// dump of the table for each such push was 7% of what the change cost the
// agents (perf record). A peer's MAC that changes is used, stale, for up to
// NeighborsMaxAge. Safe for concurrent use.
type Neighbors struct {
	read func() map[netip.Addr]net.HardwareAddr
	now  func() time.Time

	mu   sync.Mutex
	at   time.Time // of the last read; zero: never read
	macs map[netip.Addr]net.HardwareAddr
}

// NeighborsMaxAge and NeighborsMissAge bound how old the table Neighbors
// answers from is: for any address, and for one it did not hold.
const (
	NeighborsMaxAge  = time.Second
	NeighborsMissAge = 100 * time.Millisecond
)

// NewNeighbors returns a Neighbors that reads the table with read.
func NewNeighbors(read func() map[netip.Addr]net.HardwareAddr) *Neighbors {
	return &Neighbors{read: read, now: time.Now}
}

// MAC returns a's MAC, or nil when the table does not hold one.
func (n *Neighbors) MAC(a netip.Addr) net.HardwareAddr {
	a = a.Unmap()
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.now()
	age := now.Sub(n.at)
	mac, ok := n.macs[a]
	if n.at.IsZero() || age >= NeighborsMaxAge || !ok && age >= NeighborsMissAge {
		n.macs, n.at = n.read(), now
		mac = n.macs[a]
	}
	return mac
}
