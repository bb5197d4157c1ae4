package announce

import (
	"encoding/binary"
	"net"
	"net/netip"

	"github.com/mdlayher/ndp"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"

	"github.com/shoalnet/shoal/rules"
)

// IPv6 neighbour discovery for the VIPs: what ARP is to the IPv4 VIPs.
// Neighbor Solicitations for a VIP are answered with a Neighbor
// Advertisement whose target link-layer address is the cluster MAC, in a
// frame whose Ethernet source is the node's own MAC (a multicast source
// would be dropped by every bridge and switch).

const (
	etherTypeIPv6 = 0x86dd
	ipv6HeaderLen = 40
	protoICMPv6   = 58
	ndpHopLimit   = 255 // RFC 4861: anything else did not come from the link
)

// allNodes is ff02::1, where unsolicited advertisements go, and its MAC.
var (
	allNodes    = netip.MustParseAddr("ff02::1")
	allNodesMAC = net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}
)

// ndpReply answers a Neighbor Solicitation for one of vips. The
// advertisement comes from the VIP itself (an address of this host, on lo),
// is solicited, and overrides: every node answers alike, and a client that
// cached another MAC for the VIP must take the cluster MAC.
func ndpReply(frame []byte, ownMAC net.HardwareAddr, vips []netip.Addr, mode rules.MACMode) ([]byte, replyVerdict) {
	if len(frame) < ethHeaderLen+ipv6HeaderLen || binary.BigEndian.Uint16(frame[12:14]) != etherTypeIPv6 {
		return nil, malformed
	}
	ip := frame[ethHeaderLen:]
	plen := int(binary.BigEndian.Uint16(ip[4:6]))
	if ip[0]>>4 != 6 || ipv6HeaderLen+plen > len(ip) {
		return nil, malformed
	}
	if ip[6] != protoICMPv6 {
		return nil, notForVIP // NDP carries no extension headers
	}
	body := ip[ipv6HeaderLen : ipv6HeaderLen+plen]
	if len(body) < 4 || ipv6.ICMPType(body[0]) != ipv6.ICMPTypeNeighborSolicitation {
		return nil, notForVIP
	}
	src := netip.AddrFrom16([16]byte(ip[8:24]))
	dst := netip.AddrFrom16([16]byte(ip[24:40]))
	if ip[7] != ndpHopLimit || body[1] != 0 || !icmpv6ChecksumOK(src, dst, body) {
		return nil, malformed
	}
	m, err := ndp.ParseMessage(body)
	if err != nil {
		return nil, malformed
	}
	ns, ok := m.(*ndp.NeighborSolicitation)
	if !ok || !isVIP(ns.TargetAddress, vips) {
		return nil, notForVIP
	}
	// The reply goes to the source link-layer address the asker gave, else
	// to the frame's sender.
	mac := net.HardwareAddr(frame[6:12])
	for _, o := range ns.Options {
		if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Source {
			mac = lla.Addr
		}
	}
	if !saneNDPSender(mac, src, vips) || !saneNDPSender(frame[6:12], src, vips) {
		return nil, badSender
	}
	na := &ndp.NeighborAdvertisement{
		Solicited: true, Override: true, TargetAddress: ns.TargetAddress,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: ClusterMAC(ns.TargetAddress, mode)}},
	}
	f, err := ipv6Frame(mac, ownMAC, ns.TargetAddress, src, na)
	if err != nil {
		return nil, malformed
	}
	return f, replied
}

// unsolicitedNA announces vip at the cluster MAC to every node of the link
// (ff02::1), so clients and routers that cached another MAC learn the
// right one. Not solicited: RFC 4861 forbids the flag to a multicast
// destination.
func unsolicitedNA(ownMAC net.HardwareAddr, vip netip.Addr, mode rules.MACMode) []byte {
	na := &ndp.NeighborAdvertisement{
		Override: true, TargetAddress: vip,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: ClusterMAC(vip, mode)}},
	}
	f, err := ipv6Frame(allNodesMAC, ownMAC, vip, allNodes, na)
	if err != nil {
		panic(err) // only for a non-IPv6 VIP, which the callers rule out
	}
	return f
}

// ipv6Frame frames an NDP message from src to dst with hop limit 255.
func ipv6Frame(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, m ndp.Message) ([]byte, error) {
	body, err := ndp.MarshalMessageChecksum(m, src, dst)
	if err != nil {
		return nil, err
	}
	f := make([]byte, ethHeaderLen+ipv6HeaderLen, ethHeaderLen+ipv6HeaderLen+len(body))
	copy(f[0:6], dstMAC)
	copy(f[6:12], srcMAC)
	binary.BigEndian.PutUint16(f[12:14], etherTypeIPv6)
	ip := f[ethHeaderLen:]
	ip[0] = 6 << 4
	binary.BigEndian.PutUint16(ip[4:6], uint16(len(body)))
	ip[6], ip[7] = protoICMPv6, ndpHopLimit
	s, d := src.As16(), dst.As16()
	copy(ip[8:24], s[:])
	copy(ip[24:40], d[:])
	return append(f, body...), nil
}

// icmpv6ChecksumOK verifies an ICMPv6 message's checksum (RFC 4443 2.3):
// the one's complement sum over the pseudo-header and the message is all
// ones.
func icmpv6ChecksumOK(src, dst netip.Addr, body []byte) bool {
	psh := icmp.IPv6PseudoHeader(src.AsSlice(), dst.AsSlice())
	binary.BigEndian.PutUint32(psh[32:36], uint32(len(body)))
	var sum uint32
	add := func(b []byte) {
		for len(b) >= 2 {
			sum += uint32(binary.BigEndian.Uint16(b))
			b = b[2:]
		}
		if len(b) == 1 {
			sum += uint32(b[0]) << 8
		}
	}
	add(psh)
	add(body)
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return sum == 0xffff
}

// saneNDPSender reports whether a reply may go to the asker, as for ARP: a
// unicast MAC and a unicast host address that is not a VIP. Duplicate
// address detection (source ::) gets no answer: the VIP is the cluster's,
// not a host's address to defend.
func saneNDPSender(mac net.HardwareAddr, ip netip.Addr, vips []netip.Addr) bool {
	if len(mac) != 6 || mac[0]&1 != 0 || isZeroMAC(mac) {
		return false
	}
	return ip.Is6() && !ip.Is4In6() && !ip.IsUnspecified() && !ip.IsMulticast() && !ip.IsLoopback() && !isVIP(ip, vips)
}

// solicitedNode returns the solicited-node multicast group of an IPv6 VIP,
// where Neighbor Solicitations for it are sent.
func solicitedNode(vip netip.Addr) netip.Addr {
	g, err := ndp.SolicitedNodeMulticast(vip)
	if err != nil {
		panic(err) // only for a non-IPv6 VIP, which the callers rule out
	}
	return g
}
