package rules

import (
	"fmt"
	"net"
	"net/netip"
)

// MACMode says which cluster MAC the VIPs resolve to, as NLB's cluster
// operation modes. It is a cluster-wide setting: every node answers ARP
// for every VIP with the same MAC, so a per-VIP mode would buy little and
// cost every VIP command a field.
type MACMode string

// MAC modes.
const (
	// MACMulticast: 03:bf and the VIP's four bytes. Not an IP multicast
	// MAC, so switches (snooping or not) flood it to every port.
	MACMulticast MACMode = "multicast"
	// MACIGMP: 01:00:5e:7f and the VIP's last two bytes, the MAC of the
	// group 239.255.<x>.<y> (x.y the VIP's last two bytes) that every node
	// joins, so an IGMP-snooping switch forwards the VIP's frames only to
	// the nodes' ports.
	MACIGMP MACMode = "igmp"
	// MACRouted: no cluster MAC. Every eligible node announces the VIPs
	// to its routers over BGP, and the routers spread the flows over the
	// nodes with ECMP; each node serves what it is sent.
	MACRouted MACMode = "routed"
)

// ParseMACMode parses "multicast", "igmp" or "routed".
func ParseMACMode(s string) (MACMode, error) {
	m := MACMode(s)
	if s == "" || !m.valid() {
		return "", fmt.Errorf("%w: mac mode %q: want multicast, igmp or routed", ErrInvalid, s)
	}
	return m, nil
}

func (m MACMode) valid() bool { return m == "" || m == MACMulticast || m == MACIGMP || m == MACRouted }

// normal returns the mode with "" as MACMulticast's stored form (""), so a
// cluster set back to multicast encodes as one that never changed.
func (m MACMode) normal() MACMode {
	if m == MACMulticast {
		return ""
	}
	return m
}

// String names the mode; "" is multicast.
func (m MACMode) String() string {
	if m == "" {
		return string(MACMulticast)
	}
	return string(m)
}

// ClusterMAC returns the MAC that a VIP resolves to in mode m. In
// multicast mode an IPv6 VIP's is 03:be and its last four bytes (03:be,
// not 03:bf, so it never equals an IPv4 VIP's); in igmp mode it is the MAC
// of its MLD group (IGMPGroup), 33:33 and the group's last four bytes.
func (m MACMode) ClusterMAC(vip netip.Addr) net.HardwareAddr {
	if !vip.Is4() {
		if m == MACIGMP {
			g := IGMPGroup(vip).As16()
			return net.HardwareAddr{0x33, 0x33, g[12], g[13], g[14], g[15]} // RFC 2464
		}
		a := vip.As16()
		return net.HardwareAddr{0x03, 0xbe, a[12], a[13], a[14], a[15]}
	}
	b := vip.As4()
	if m == MACIGMP {
		g := IGMPGroup(vip).As4()
		// RFC 1112: 01:00:5e and the group's low 23 bits (239.255.x.y has
		// 0x7f in the second byte once the top bit goes).
		return net.HardwareAddr{0x01, 0x00, 0x5e, g[1] & 0x7f, g[2], g[3]}
	}
	return net.HardwareAddr{0x03, 0xbf, b[0], b[1], b[2], b[3]}
}

// IGMPGroup returns the multicast group the nodes join for a VIP in igmp
// mode: for an IPv4 VIP 239.255 and its last two bytes, as NLB derives it;
// for an IPv6 VIP the MLD group ff05::efff:<its last two bytes>
// (site-local scope; the efff keeps its MAC, 33:33:ef:ff:x:y, out of the
// solicited-node range 33:33:ff). Two VIPs that share their last two bytes
// share the group (and the MAC), which only costs each node frames it
// drops anyway. It returns the zero Addr for an invalid address.
func IGMPGroup(vip netip.Addr) netip.Addr {
	if vip.Is6() && !vip.Is4In6() {
		a := vip.As16()
		return netip.AddrFrom16([16]byte{0: 0xff, 1: 0x05, 12: 0xef, 13: 0xff, 14: a[14], 15: a[15]})
	}
	if !vip.Is4() {
		return netip.Addr{}
	}
	b := vip.As4()
	return netip.AddrFrom4([4]byte{239, 255, b[2], b[3]})
}
