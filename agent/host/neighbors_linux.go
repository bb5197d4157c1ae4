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
