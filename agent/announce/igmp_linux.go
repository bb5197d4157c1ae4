package announce

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/shoalnet/shoal/rules"
)

// groupMember holds the node's membership of the igmp mode's groups on the
// cluster interface, through UDP sockets' IP_ADD_MEMBERSHIP (IPv4 VIPs'
// groups) and IPV6_JOIN_GROUP (IPv6 VIPs'): the kernel then sends the IGMP
// and MLD reports and answers the queriers, so a snooping switch keeps
// forwarding the cluster MAC to this port. Closing the sockets (the
// agent's end, however it ends) leaves every group.
type groupMember struct {
	conn4, conn6 net.PacketConn // conn6 nil where IPv6 is off
	pc4          *ipv4.PacketConn
	pc6          *ipv6.PacketConn
	ifindex      int          // the interface joined holds on
	joined       []netip.Addr // owned by the host goroutine
}

// listenGroups opens the sockets that hold the memberships. They bind an
// ephemeral port nobody sends to; what they receive is never read. A host
// without IPv6 gets no IPv6 socket (and fails to join an IPv6 VIP's group).
func listenGroups() (*groupMember, error) {
	c, err := net.ListenPacket("udp4", "0.0.0.0:0")
	if err != nil {
		return nil, fmt.Errorf("open igmp membership socket: %w", err)
	}
	g := &groupMember{conn4: c, pc4: ipv4.NewPacketConn(c)}
	if c6, err := net.ListenPacket("udp6", "[::]:0"); err == nil {
		g.conn6, g.pc6 = c6, ipv6.NewPacketConn(c6)
	}
	return g, nil
}

// join and leave join or leave group on ifi with the socket of its family.
func (g *groupMember) join(ifi *net.Interface, group netip.Addr) error {
	if group.Is4() {
		return g.pc4.JoinGroup(ifi, &net.UDPAddr{IP: group.AsSlice()})
	}
	if g.pc6 == nil {
		return errors.New("no IPv6 on this host")
	}
	return g.pc6.JoinGroup(ifi, &net.UDPAddr{IP: group.AsSlice()})
}

func (g *groupMember) leave(ifi *net.Interface, group netip.Addr) error {
	if group.Is4() {
		return g.pc4.LeaveGroup(ifi, &net.UDPAddr{IP: group.AsSlice()})
	}
	if g.pc6 == nil {
		return errors.New("no IPv6 on this host")
	}
	return g.pc6.LeaveGroup(ifi, &net.UDPAddr{IP: group.AsSlice()})
}

// groupsOf returns the groups the node joins for set: those of its VIPs
// (IGMP for IPv4, MLD for IPv6) in igmp mode, none in multicast mode.
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
		} else if err := g.leave(ifi, gr); err != nil {
			errs = append(errs, fmt.Errorf("leave group %s on %s: %w", gr, ifi.Name, err))
			joined = append(joined, gr)
		}
	}
	for _, gr := range groups {
		if slices.Contains(joined, gr) {
			continue
		}
		if err := g.join(ifi, gr); err != nil {
			errs = append(errs, fmt.Errorf("join group %s on %s: %w", gr, ifi.Name, err))
			continue
		}
		joined = append(joined, gr)
	}
	g.joined = joined
	return errors.Join(errs...)
}

// close leaves every group.
func (g *groupMember) close() error {
	err := g.conn4.Close()
	if g.conn6 != nil {
		err = errors.Join(err, g.conn6.Close())
	}
	return err
}
