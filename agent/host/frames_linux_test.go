package host

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/mdlayher/arp"
	"github.com/mdlayher/ndp"
	"golang.org/x/time/rate"

	"github.com/shoalnet/shoal/agent/announce"
	"github.com/shoalnet/shoal/rules"
)

// Frames the host tests send and read, built here (with gopacket for the
// IPv6 header) rather than with the announcer's own encoders.

const (
	etherTypeARP  = 0x0806
	etherTypeIPv6 = 0x86dd
	ethHeaderLen  = 14
	ipv6HeaderLen = 40
	protoICMPv6   = 58
)

var broadcastMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// ClusterMAC is the MAC a VIP resolves to in mode.
func ClusterMAC(vip netip.Addr, mode rules.MACMode) net.HardwareAddr { return mode.ClusterMAC(vip) }

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

func solicitedNode(vip netip.Addr) netip.Addr {
	g, err := ndp.SolicitedNodeMulticast(vip)
	if err != nil {
		panic(err)
	}
	return g
}

// solicitation is a Neighbor Solicitation for target from src to dst, with
// slla as its source link-layer address option (nil: none).
func solicitation(t testing.TB, ethSrc net.HardwareAddr, src, dst, target netip.Addr, slla net.HardwareAddr) []byte {
	t.Helper()
	ns := &ndp.NeighborSolicitation{TargetAddress: target}
	if slla != nil {
		ns.Options = []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: slla}}
	}
	body, err := ndp.MarshalMessageChecksum(ns, src, dst)
	if err != nil {
		t.Fatal(err)
	}
	g := dst.As16()
	eth := &layers.Ethernet{SrcMAC: ethSrc, DstMAC: net.HardwareAddr{0x33, 0x33, g[12], g[13], g[14], g[15]}, EthernetType: layers.EthernetTypeIPv6}
	ip := &layers.IPv6{Version: 6, NextHeader: layers.IPProtocolICMPv6, HopLimit: 255, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, eth, ip, gopacket.Payload(body)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// tlla is an advertisement's target link-layer address option.
func tlla(na *ndp.NeighborAdvertisement) net.HardwareAddr {
	for _, o := range na.Options {
		if l, ok := o.(*ndp.LinkLayerAddress); ok && l.Direction == ndp.Target {
			return l.Addr
		}
	}
	return nil
}

// l2 opens the announcer the agent uses on hostTestIf, with the reply
// limits given (nil: the defaults).
func l2(arpLimit, ndpLimit *rate.Limiter) func(int, func() net.HardwareAddr) (Announcer, error) {
	return func(ifindex int, mac func() net.HardwareAddr) (Announcer, error) {
		return announce.ListenL2(announce.L2Config{Interface: hostTestIf, Index: ifindex, MAC: mac, ARPLimit: arpLimit, NDPLimit: ndpLimit})
	}
}
