package announce

import (
	"encoding/binary"
	"net"
	"net/netip"

	"github.com/mdlayher/arp"

	"github.com/shoalnet/shoal/rules"
)

// ClusterMAC is the multicast MAC that a VIP's ARP replies (and Neighbor
// Advertisements) carry in the cluster's MAC mode, as NLB's: in multicast
// mode 03:bf followed by an IPv4 VIP's four bytes (03:be and an IPv6 VIP's
// last four), which switches flood to every port; in igmp mode, for an
// IPv4 VIP, the MAC of its group (rules.IGMPGroup), which every node joins,
// so a snooping switch forwards it only to the nodes.
func ClusterMAC(vip netip.Addr, mode rules.MACMode) net.HardwareAddr {
	return mode.ClusterMAC(vip)
}

// vipSet is the VIPs the host answers for and the MAC mode they resolve
// in; both come from the replicated rules.
type vipSet struct {
	vips []netip.Addr
	mode rules.MACMode
}

const (
	etherTypeARP  = 0x0806
	etherTypeVLAN = 0x8100
	ethHeaderLen  = 14
)

var broadcastMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// arpReply answers an ARP request for one of vips. The reply frame's
// Ethernet source is the node's own MAC while the ARP sender is the cluster
// MAC: a frame with a multicast source would be dropped by every bridge and
// switch, so the client would never learn the VIP.
func arpReply(frame []byte, ownMAC net.HardwareAddr, vips []netip.Addr, mode rules.MACMode) ([]byte, replyVerdict) {
	if len(frame) < ethHeaderLen || binary.BigEndian.Uint16(frame[12:14]) != etherTypeARP {
		return nil, malformed
	}
	var req arp.Packet
	if err := req.UnmarshalBinary(frame[ethHeaderLen:]); err != nil {
		return nil, malformed
	}
	if req.Operation != arp.OperationRequest || !isVIP(req.TargetIP, vips) {
		return nil, notForVIP
	}
	if !saneSender(req.SenderHardwareAddr, req.SenderIP, vips) {
		return nil, badSender
	}
	rep, err := arp.NewPacket(arp.OperationReply, ClusterMAC(req.TargetIP, mode), req.TargetIP, req.SenderHardwareAddr, req.SenderIP)
	if err != nil {
		return nil, malformed
	}
	return ethernetFrame(req.SenderHardwareAddr, ownMAC, rep), replied
}

// gratuitousARP announces vip at the cluster MAC to the whole segment, so
// clients and routers that cached another MAC learn the right one.
func gratuitousARP(ownMAC net.HardwareAddr, vip netip.Addr, mode rules.MACMode) []byte {
	p, err := arp.NewPacket(arp.OperationRequest, ClusterMAC(vip, mode), vip, broadcastMAC, vip)
	if err != nil {
		panic(err) // only on a bad MAC or non-IPv4 VIP, which config validation rules out
	}
	return ethernetFrame(broadcastMAC, ownMAC, p)
}

func ethernetFrame(dst, src net.HardwareAddr, p *arp.Packet) []byte {
	body, err := p.MarshalBinary()
	if err != nil {
		panic(err)
	}
	f := make([]byte, ethHeaderLen, ethHeaderLen+len(body))
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:14], etherTypeARP)
	return append(f, body...)
}

// saneSender reports whether a reply may go to the asker: a unicast MAC
// (a reply to a multicast or broadcast sender would flood the segment, and
// the other nodes' gratuitous ARPs carry the multicast cluster MAC) and an
// IPv4 host address that is not a VIP. ARP probes (sender 0.0.0.0) get no
// answer: the VIP is the cluster's, not a host's address to defend.
func saneSender(mac net.HardwareAddr, ip netip.Addr, vips []netip.Addr) bool {
	if len(mac) != 6 || mac[0]&1 != 0 || isZeroMAC(mac) {
		return false
	}
	if !ip.Is4() || ip.IsUnspecified() || ip.IsMulticast() || ip.IsLoopback() ||
		ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}) || isVIP(ip, vips) {
		return false
	}
	return true
}

func isZeroMAC(mac net.HardwareAddr) bool {
	for _, b := range mac {
		if b != 0 {
			return false
		}
	}
	return true
}

func isVIP(a netip.Addr, vips []netip.Addr) bool {
	for _, v := range vips {
		if v == a {
			return true
		}
	}
	return false
}
