package announce

import (
	"errors"
	"maps"
	"net/netip"
	"sync/atomic"

	"github.com/shoalnet/shoal/rules"
)

// Claimer is what Modes needs of each way of claiming the VIPs.
type Claimer interface {
	Follow(vips []netip.Addr, mode rules.MACMode, eligible bool) error
	Announce(vips []netip.Addr)
	Relink(ifindex int)
	Health() error
	Counters() map[string]map[string]uint64
	Memberships() []string
	Close() error
}

// Modes claims the VIPs the way the cluster's mode says: through L2 (ARP,
// NDP, IGMP with the cluster MAC) in the multicast and igmp modes, through
// BGP in routed mode. The other one follows no VIP, so switching the mode
// at run time moves every VIP from one to the other. BGP is nil on a node
// without a bgp section: in routed mode it claims nothing and says why.
type Modes struct {
	L2, BGP Claimer
	routed  atomic.Bool // set by Follow, read by Health from any goroutine
}

// errNoBGP: the cluster is in routed mode and this node has no speaker.
var errNoBGP = errors.New("the cluster is in routed mode and this node has no bgp section in its config: it cannot announce the vips")

// Follow hands the VIPs to the claimer of mode and none to the other.
func (m *Modes) Follow(vips []netip.Addr, mode rules.MACMode, eligible bool) error {
	wasRouted := m.routed.Swap(mode == rules.MACRouted)
	l2vips := vips
	if mode == rules.MACRouted {
		l2vips = nil
	}
	errs := []error{m.L2.Follow(l2vips, mode, eligible)}
	if wasRouted && mode != rules.MACRouted {
		m.L2.Announce(vips) // back from routed mode: tell the segment the cluster MAC at once
	}
	if m.BGP != nil {
		errs = append(errs, m.BGP.Follow(vips, mode, eligible))
	}
	return errors.Join(errs...)
}

// Announce announces vips through the claimer in use.
func (m *Modes) Announce(vips []netip.Addr) {
	if !m.routed.Load() {
		m.L2.Announce(vips)
	}
}

// Relink moves both to a recreated interface.
func (m *Modes) Relink(ifindex int) {
	m.L2.Relink(ifindex)
	if m.BGP != nil {
		m.BGP.Relink(ifindex)
	}
}

// Health is the claimer in use's.
func (m *Modes) Health() error {
	if !m.routed.Load() {
		return m.L2.Health()
	}
	if m.BGP == nil {
		return errNoBGP
	}
	return m.BGP.Health()
}

// Counters are both claimers' counters.
func (m *Modes) Counters() map[string]map[string]uint64 {
	c := m.L2.Counters()
	if m.BGP != nil {
		maps.Copy(c, m.BGP.Counters())
	}
	return c
}

// Memberships are L2's (BGP holds none).
func (m *Modes) Memberships() []string { return m.L2.Memberships() }

// Close closes both.
func (m *Modes) Close() error {
	errs := []error{m.L2.Close()}
	if m.BGP != nil {
		errs = append(errs, m.BGP.Close())
	}
	return errors.Join(errs...)
}
