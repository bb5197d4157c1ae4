package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"golang.org/x/net/ipv4"

	"github.com/shoalnet/shoal/rules"
)

// groupMember holds the node's membership of the igmp mode's groups on the
// cluster interface, through a UDP socket's IP_ADD_MEMBERSHIP: the kernel
// then sends the IGMP reports and answers the queriers, so a snooping
// switch keeps forwarding the cluster MAC to this port. Closing the socket
// (the agent's end, however it ends) leaves every group.
type groupMember struct {
	conn    net.PacketConn
	pc      *ipv4.PacketConn
	ifindex int          // the interface joined holds on
	joined  []netip.Addr // owned by the host goroutine
}

// listenGroups opens the socket that holds the memberships. It binds an
// ephemeral port nobody sends to; what it receives is never read.
func listenGroups() (*groupMember, error) {
	c, err := net.ListenPacket("udp4", "0.0.0.0:0")
	if err != nil {
		return nil, fmt.Errorf("open igmp membership socket: %w", err)
	}
	return &groupMember{conn: c, pc: ipv4.NewPacketConn(c)}, nil
}

// groupsOf returns the groups the node joins for set: those of its IPv4
// VIPs in igmp mode, none in multicast mode.
func groupsOf(set vipSet) []netip.Addr {
	if set.mode != rules.MACIGMP {
		return nil
	}
	var gs []netip.Addr
	for _, v := range set.vips {
		if g := rules.IGMPGroup(v); g.IsValid() && !slices.Contains(gs, g) {
			gs = append(gs, g)
		}
	}
	return gs
}

// set makes the memberships on interface ifindex exactly groups. The
// memberships of a vanished interface went with it, so after a change of
// ifindex every group is joined afresh.
func (g *groupMember) set(ifindex int, groups []netip.Addr) error {
	if ifindex != g.ifindex {
		g.joined, g.ifindex = nil, ifindex
	}
	ifi, err := net.InterfaceByIndex(ifindex)
	if err != nil {
		return fmt.Errorf("igmp groups: interface %d: %w", ifindex, err)
	}
	var errs []error
	joined := g.joined[:0:0]
	for _, gr := range g.joined {
		if slices.Contains(groups, gr) {
			joined = append(joined, gr)
		} else if err := g.pc.LeaveGroup(ifi, &net.UDPAddr{IP: gr.AsSlice()}); err != nil {
			errs = append(errs, fmt.Errorf("leave igmp group %s on %s: %w", gr, ifi.Name, err))
			joined = append(joined, gr)
		}
	}
	for _, gr := range groups {
		if slices.Contains(joined, gr) {
			continue
		}
		if err := g.pc.JoinGroup(ifi, &net.UDPAddr{IP: gr.AsSlice()}); err != nil {
			errs = append(errs, fmt.Errorf("join igmp group %s on %s: %w", gr, ifi.Name, err))
			continue
		}
		joined = append(joined, gr)
	}
	g.joined = joined
	return errors.Join(errs...)
}

// close leaves every group.
func (g *groupMember) close() error { return g.conn.Close() }
