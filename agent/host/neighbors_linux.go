package host

import (
	"log/slog"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// NeighborMACs returns the kernel's neighbour entries on ifname that hold
// a MAC (IPv4 ARP and IPv6 neighbour discovery alike), by address. The
// agent heartbeats every peer, so the peers' heartbeat addresses are
// among them (unless a peer is reached through a router, which has no
// business with a VIP's frames anyway). Errors are logged and give none.
func NeighborMACs(ifname string, log *slog.Logger) map[netip.Addr]net.HardwareAddr {
	link, err := netlink.LinkByName(ifname)
	if err != nil {
		log.Warn("neighbour table for hand-overs", "err", err)
		return nil
	}
	neighs, err := netlink.NeighList(link.Attrs().Index, netlink.FAMILY_ALL)
	if err != nil {
		log.Warn("neighbour table for hand-overs", "err", err)
		return nil
	}
	out := make(map[netip.Addr]net.HardwareAddr, len(neighs))
	for _, n := range neighs {
		a, ok := netip.AddrFromSlice(n.IP)
		if !ok || len(n.HardwareAddr) != 6 || n.State&(netlink.NUD_FAILED|netlink.NUD_INCOMPLETE) != 0 {
			continue
		}
		out[a.Unmap()] = n.HardwareAddr
	}
	return out
}

// NextHopMACs returns, for each address, the MAC a packet to it leaves
// with: its own neighbour entry's, or, when the route to it goes through a
// gateway, the gateway's, as neigh answers (Neighbors.MAC: the table read
// at most once a second, not once for every push). Addresses whose MAC is
// not known are missing (the peers' heartbeats keep their entries known).
func NextHopMACs(addrs []netip.Addr, neigh func(netip.Addr) net.HardwareAddr) map[netip.Addr]net.HardwareAddr {
	out := make(map[netip.Addr]net.HardwareAddr, len(addrs))
	for _, a := range addrs {
		routes, err := netlink.RouteGet(a.AsSlice())
		if err != nil || len(routes) == 0 {
			continue
		}
		hop := a
		if gw, ok := netip.AddrFromSlice(routes[0].Gw); ok && gw.IsValid() && !gw.IsUnspecified() {
			hop = gw.Unmap()
		}
		if mac := neigh(hop); mac != nil {
			out[a] = mac
		}
	}
	return out
}

// LinkMTU returns ifname's MTU, 0 when it cannot be read.
func LinkMTU(ifname string) int {
	link, err := netlink.LinkByName(ifname)
	if err != nil {
		return 0
	}
	return link.Attrs().MTU
}
