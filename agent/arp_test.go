package agent

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

	"github.com/mdlayher/arp"
)

func TestClusterMAC(t *testing.T) {
	got := ClusterMAC(netip.MustParseAddr("198.18.7.100")).String()
	if got != "03:bf:c6:12:07:64" {
		t.Errorf("cluster mac %s, want 03:bf:c6:12:07:64", got)
	}
}

func TestARPReply(t *testing.T) {
	own := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x11}
	client := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	vip := netip.MustParseAddr("198.18.7.100")
	vips := []netip.Addr{vip}
	req, _ := arp.NewPacket(arp.OperationRequest, client, netip.MustParseAddr("198.18.7.1"), net.HardwareAddr{0, 0, 0, 0, 0, 0}, vip)
	frame := ethernetFrame(broadcastMAC, client, req)

	reply, v := arpReply(frame, own, vips)
	if v != arpReplied {
		t.Fatalf("verdict %d, want replied", v)
	}
	if !bytes.Equal(reply[0:6], client) {
		t.Errorf("ethernet destination %s, want the asker %s", net.HardwareAddr(reply[0:6]), client)
	}
	if !bytes.Equal(reply[6:12], own) {
		t.Errorf("ethernet source %s, want the node's own MAC %s (a multicast source is dropped by switches)", net.HardwareAddr(reply[6:12]), own)
	}
	var p arp.Packet
	if err := p.UnmarshalBinary(reply[ethHeaderLen:]); err != nil {
		t.Fatal(err)
	}
	if p.Operation != arp.OperationReply || p.SenderIP != vip || !bytes.Equal(p.SenderHardwareAddr, ClusterMAC(vip)) {
		t.Errorf("reply says %s is at %s (op %d), want %s at %s", p.SenderIP, p.SenderHardwareAddr, p.Operation, vip, ClusterMAC(vip))
	}
	if p.TargetIP != netip.MustParseAddr("198.18.7.1") || !bytes.Equal(p.TargetHardwareAddr, client) {
		t.Errorf("reply target %s/%s, want the asker", p.TargetIP, p.TargetHardwareAddr)
	}

	other, _ := arp.NewPacket(arp.OperationRequest, client, netip.MustParseAddr("198.18.7.1"), net.HardwareAddr{0, 0, 0, 0, 0, 0}, netip.MustParseAddr("198.18.7.11"))
	if _, v := arpReply(ethernetFrame(broadcastMAC, client, other), own, vips); v != arpNotForVIP {
		t.Errorf("request for a node address: verdict %d, want not-for-vip", v)
	}
	for name, f := range map[string][]byte{"empty": nil, "short": frame[:20], "not arp": append(append([]byte{}, frame[:12]...), 0x08, 0x00, 1, 2, 3)} {
		if _, v := arpReply(f, own, vips); v != arpMalformed {
			t.Errorf("%s frame: verdict %d, want malformed", name, v)
		}
	}
}

func TestGratuitousARP(t *testing.T) {
	own := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x11}
	vip := netip.MustParseAddr("198.18.7.100")
	f := gratuitousARP(own, vip)
	if !bytes.Equal(f[0:6], broadcastMAC) || !bytes.Equal(f[6:12], own) {
		t.Errorf("gratuitous arp ethernet header %x", f[:14])
	}
	var p arp.Packet
	if err := p.UnmarshalBinary(f[ethHeaderLen:]); err != nil {
		t.Fatal(err)
	}
	if p.SenderIP != vip || p.TargetIP != vip || !bytes.Equal(p.SenderHardwareAddr, ClusterMAC(vip)) {
		t.Errorf("gratuitous arp announces %s at %s for %s", p.SenderIP, p.SenderHardwareAddr, p.TargetIP)
	}
}

func FuzzARPReply(f *testing.F) {
	own := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x11}
	vips := []netip.Addr{netip.MustParseAddr("198.18.7.100")}
	f.Add(gratuitousARP(own, vips[0]))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		reply, v := arpReply(b, own, vips)
		if (v == arpReplied) != (reply != nil) {
			t.Fatalf("verdict %d with reply %x", v, reply)
		}
	})
}
