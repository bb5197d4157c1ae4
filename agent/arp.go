package agent

import (
	"encoding/binary"
	"net"
	"net/netip"

	"github.com/mdlayher/arp"
)

// ClusterMAC is the multicast MAC that a VIP's ARP replies (and Neighbor
// Advertisements) carry, as NLB's multicast mode: 03:bf followed by an IPv4
// VIP's four bytes. An IPv6 VIP's is 03:be followed by its last four bytes:
// the other second byte keeps it from ever equalling an IPv4 VIP's (for
// 2001:db8::c612:1 and 198.18.0.1 alike). Switches flood frames for it to
// every port, so every node sees every packet for the VIP.
func ClusterMAC(vip netip.Addr) net.HardwareAddr {
	if vip.Is4() {
		b := vip.As4()
		return net.HardwareAddr{0x03, 0xbf, b[0], b[1], b[2], b[3]}
	}
	b := vip.As16()
	return net.HardwareAddr{0x03, 0xbe, b[12], b[13], b[14], b[15]}
}

const (
	etherTypeARP  = 0x0806
	etherTypeVLAN = 0x8100
	ethHeaderLen  = 14
)

var broadcastMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// arpVerdict says what the responder did with a frame, so tests and
// counters can tell the cases apart.
type arpVerdict uint8

const (
	arpReplied     arpVerdict = iota // a request for a VIP, answered
	arpNotForVIP                     // valid ARP, not asking for a VIP
	arpMalformed                     // not a parseable Ethernet+ARP frame
	arpBadSender                     // asks for a VIP, but from a sender no reply may go to
	arpRateLimited                   // would be answered, but over the reply rate
	numARPVerdicts
)

// String names the verdict as the counters do.
func (v arpVerdict) String() string {
	switch v {
	case arpReplied:
		return "replied"
	case arpNotForVIP:
		return "ignored"
	case arpMalformed:
		return "malformed"
	case arpBadSender:
		return "bad_sender"
	case arpRateLimited:
		return "rate_limited"
	}
	return "unknown"
}

// arpReply answers an ARP request for one of vips. The reply frame's
// Ethernet source is the node's own MAC while the ARP sender is the cluster
// MAC: a frame with a multicast source would be dropped by every bridge and
// switch, so the client would never learn the VIP.
func arpReply(frame []byte, ownMAC net.HardwareAddr, vips []netip.Addr) ([]byte, arpVerdict) {
	if len(frame) < ethHeaderLen || binary.BigEndian.Uint16(frame[12:14]) != etherTypeARP {
		return nil, arpMalformed
	}
	var req arp.Packet
	if err := req.UnmarshalBinary(frame[ethHeaderLen:]); err != nil {
		return nil, arpMalformed
	}
	if req.Operation != arp.OperationRequest || !isVIP(req.TargetIP, vips) {
		return nil, arpNotForVIP
	}
	if !saneSender(req.SenderHardwareAddr, req.SenderIP, vips) {
		return nil, arpBadSender
	}
	rep, err := arp.NewPacket(arp.OperationReply, ClusterMAC(req.TargetIP), req.TargetIP, req.SenderHardwareAddr, req.SenderIP)
	if err != nil {
		return nil, arpMalformed
	}
	return ethernetFrame(req.SenderHardwareAddr, ownMAC, rep), arpReplied
}

// gratuitousARP announces vip at the cluster MAC to the whole segment, so
// clients and routers that cached another MAC learn the right one.
func gratuitousARP(ownMAC net.HardwareAddr, vip netip.Addr) []byte {
	p, err := arp.NewPacket(arp.OperationRequest, ClusterMAC(vip), vip, broadcastMAC, vip)
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
