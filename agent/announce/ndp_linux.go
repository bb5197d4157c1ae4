package announce

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/mdlayher/packet"
	"golang.org/x/net/bpf"
	"golang.org/x/net/ipv6"
	"golang.org/x/time/rate"
)

// nsFilter passes only ICMPv6 Neighbor Solicitations without extension
// headers to the responder's socket, so the node's IPv6 traffic is not
// copied to it.
var nsFilter = func() []bpf.RawInstruction {
	prog, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 12, Size: 2},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: etherTypeIPv6, SkipTrue: 5},
		bpf.LoadAbsolute{Off: ethHeaderLen + 6, Size: 1}, // next header
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: protoICMPv6, SkipTrue: 3},
		bpf.LoadAbsolute{Off: ethHeaderLen + ipv6HeaderLen, Size: 1}, // ICMPv6 type
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: uint32(ipv6.ICMPTypeNeighborSolicitation), SkipTrue: 1},
		bpf.RetConstant{Val: 0xffff},
		bpf.RetConstant{Val: 0},
	})
	if err != nil {
		panic(err)
	}
	return prog
}()

// ndpResponder answers Neighbor Solicitations for the IPv6 VIPs on the
// cluster interface. Its packet socket sees the solicitations sent to a
// VIP's solicited-node group and the unicast ones (a client's reachability
// probes, sent to the cluster MAC); a UDP socket holds the interface's
// membership of each VIP's solicited-node group (with MLD reports, so a
// snooping switch forwards the solicitations), which ends with the agent,
// however it ends.
type ndpResponder struct {
	*responder
	ifi    *net.Interface
	groups *ipv6.PacketConn // nil until an IPv6 VIP needs a group; owned by the host
	joined []netip.Addr     // solicited-node groups joined; owned by the host
}

// listenNDP opens the responder on ifi for vips and starts answering.
func listenNDP(ifi *net.Interface, vips vipSet, ownMAC func() net.HardwareAddr, limit *rate.Limiter, stats *replyStats) (*ndpResponder, error) {
	conn, err := packet.Listen(ifi, packet.Raw, etherTypeIPv6, &packet.Config{Filter: nsFilter})
	if err != nil {
		return nil, fmt.Errorf("open ndp socket on %s: %w", ifi.Name, err)
	}
	n := &ndpResponder{responder: newResponder(ndpProtocol, conn, ownMAC, limit, stats), ifi: ifi}
	if err := n.setVIPs(vips); err != nil {
		n.closeGroups()
		conn.Close()
		return nil, fmt.Errorf("%s: %w", ifi.Name, err)
	}
	n.start()
	return n, nil
}

// setVIPs makes the responder answer for the IPv6 VIPs of set, at their
// cluster MAC in its mode, and holds the membership of exactly their
// solicited-node groups. Not safe for concurrent use with itself.
func (n *ndpResponder) setVIPs(set vipSet) error {
	var v6 []netip.Addr
	var want []netip.Addr
	for _, v := range set.vips {
		if v.Is6() && !v.Is4In6() {
			v6 = append(v6, v)
			if g := solicitedNode(v); !slices.Contains(want, g) {
				want = append(want, g) // VIPs may share a group
			}
		}
	}
	var errs []error
	joined := n.joined[:0:0]
	for _, g := range n.joined {
		if slices.Contains(want, g) {
			joined = append(joined, g)
		} else if err := n.groups.LeaveGroup(n.ifi, &net.UDPAddr{IP: g.AsSlice()}); err != nil {
			errs = append(errs, fmt.Errorf("leave solicited-node group %s: %w", g, err))
			joined = append(joined, g)
		}
	}
	for _, g := range want {
		if slices.Contains(joined, g) {
			continue
		}
		if n.groups == nil {
			c, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6unspecified})
			if err != nil {
				errs = append(errs, fmt.Errorf("open a socket for the solicited-node groups (is IPv6 disabled?): %w", err))
				break
			}
			n.groups = ipv6.NewPacketConn(c)
		}
		if err := n.groups.JoinGroup(n.ifi, &net.UDPAddr{IP: g.AsSlice()}); err != nil {
			errs = append(errs, fmt.Errorf("join solicited-node group %s on %s (is IPv6 disabled on it?): %w", g, n.ifi.Name, err))
			continue
		}
		joined = append(joined, g)
	}
	n.joined = joined
	n.vips.Store(&vipSet{v6, set.mode})
	return errors.Join(errs...)
}

// groupMACs returns the MACs of the solicited-node groups the responder
// joined (33:33 and the group's last four bytes, RFC 2464).
func (n *ndpResponder) groupMACs() []string {
	var macs []string
	for _, g := range n.joined {
		b := g.As16()
		macs = append(macs, net.HardwareAddr{0x33, 0x33, b[12], b[13], b[14], b[15]}.String())
	}
	return macs
}

// closeGroups closes the groups' socket, which leaves them.
func (n *ndpResponder) closeGroups() {
	if n.groups != nil {
		n.groups.Close()
	}
}

// close closes the sockets (leaving the groups) and waits for serve.
func (n *ndpResponder) close() error {
	n.closeGroups()
	return n.responder.close()
}
