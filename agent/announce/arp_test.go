package announce

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

	"github.com/mdlayher/arp"

	"github.com/shoalnet/shoal/rules"
)

func TestClusterMAC(t *testing.T) {
	tests := []struct {
		vip  string
		mode rules.MACMode
		want string
	}{
		{"198.18.7.100", "", "03:bf:c6:12:07:64"},
		{"198.18.7.100", rules.MACMulticast, "03:bf:c6:12:07:64"},
		{"198.18.7.100", rules.MACIGMP, "01:00:5e:7f:07:64"},
		{"2001:db8::10", "", "03:be:00:00:00:10"},
		// The last four bytes of this IPv6 VIP are 198.18.7.100's: the
		// second byte still tells them apart.
		{"2001:db8::c612:764", "", "03:be:c6:12:07:64"},
		{"2001:db8::c612:764", rules.MACIGMP, "33:33:ef:ff:07:64"}, // of the MLD group ff05::efff:764
	}
	for _, tt := range tests {
		if got := ClusterMAC(netip.MustParseAddr(tt.vip), tt.mode).String(); got != tt.want {
			t.Errorf("ClusterMAC(%s, %s) = %s, want %s", tt.vip, tt.mode, got, tt.want)
		}
	}
}

var macModes = []rules.MACMode{rules.MACMulticast, rules.MACIGMP}

func TestARPReply(t *testing.T) {
	for _, mode := range macModes {
		t.Run(mode.String(), func(t *testing.T) { testARPReply(t, mode) })
	}
}

func testARPReply(t *testing.T, mode rules.MACMode) {
	own := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x11}
	client := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	vip := netip.MustParseAddr("198.18.7.100")
	vips := []netip.Addr{vip}
	req, _ := arp.NewPacket(arp.OperationRequest, client, netip.MustParseAddr("198.18.7.1"), net.HardwareAddr{0, 0, 0, 0, 0, 0}, vip)
	frame := ethernetFrame(broadcastMAC, client, req)

	reply, v := arpReply(frame, own, vips, mode)
	if v != replied {
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
	if p.Operation != arp.OperationReply || p.SenderIP != vip || !bytes.Equal(p.SenderHardwareAddr, ClusterMAC(vip, mode)) {
		t.Errorf("reply says %s is at %s (op %d), want %s at %s", p.SenderIP, p.SenderHardwareAddr, p.Operation, vip, ClusterMAC(vip, mode))
	}
	if p.TargetIP != netip.MustParseAddr("198.18.7.1") || !bytes.Equal(p.TargetHardwareAddr, client) {
		t.Errorf("reply target %s/%s, want the asker", p.TargetIP, p.TargetHardwareAddr)
	}

	other, _ := arp.NewPacket(arp.OperationRequest, client, netip.MustParseAddr("198.18.7.1"), net.HardwareAddr{0, 0, 0, 0, 0, 0}, netip.MustParseAddr("198.18.7.11"))
	if _, v := arpReply(ethernetFrame(broadcastMAC, client, other), own, vips, mode); v != notForVIP {
		t.Errorf("request for a node address: verdict %d, want not-for-vip", v)
	}
	for name, f := range map[string][]byte{"empty": nil, "short": frame[:20], "not arp": append(append([]byte{}, frame[:12]...), 0x08, 0x00, 1, 2, 3)} {
		if _, v := arpReply(f, own, vips, mode); v != malformed {
			t.Errorf("%s frame: verdict %d, want malformed", name, v)
		}
	}
}

func TestGratuitousARP(t *testing.T) {
	for _, mode := range macModes {
		t.Run(mode.String(), func(t *testing.T) { testGratuitousARP(t, mode) })
	}
}

func testGratuitousARP(t *testing.T, mode rules.MACMode) {
	own := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x11}
	vip := netip.MustParseAddr("198.18.7.100")
	f := gratuitousARP(own, vip, mode)
	if !bytes.Equal(f[0:6], broadcastMAC) || !bytes.Equal(f[6:12], own) {
		t.Errorf("gratuitous arp ethernet header %x", f[:14])
	}
	var p arp.Packet
	if err := p.UnmarshalBinary(f[ethHeaderLen:]); err != nil {
		t.Fatal(err)
	}
	if p.SenderIP != vip || p.TargetIP != vip || !bytes.Equal(p.SenderHardwareAddr, ClusterMAC(vip, mode)) {
		t.Errorf("gratuitous arp announces %s at %s for %s", p.SenderIP, p.SenderHardwareAddr, p.TargetIP)
	}
}

func FuzzARPReply(f *testing.F) {
	own := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x11}
	vips := []netip.Addr{netip.MustParseAddr("198.18.7.100")}
	f.Add(gratuitousARP(own, vips[0], rules.MACMulticast))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		reply, v := arpReply(b, own, vips, rules.MACMulticast)
		if (v == replied) != (reply != nil) {
			t.Fatalf("verdict %d with reply %x", v, reply)
		}
	})
}

// TestARPReplySender: only a unicast sender with a host address gets an
// answer; another node's gratuitous ARP (sender: the multicast cluster MAC
// and the VIP) is not answered, nor is a probe, a broadcast or a forged
// multicast sender, whose reply would flood the segment.
func TestARPReplySender(t *testing.T) {
	own := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x11}
	vip := netip.MustParseAddr("198.18.7.100")
	vips := []netip.Addr{vip}
	unicast := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	asker := netip.MustParseAddr("198.18.7.1")
	tests := []struct {
		name string
		mac  net.HardwareAddr
		ip   netip.Addr
		want replyVerdict
	}{
		{"unicast host", unicast, asker, replied},
		{"multicast mac", ClusterMAC(vip, rules.MACMulticast), asker, badSender},
		{"broadcast mac", broadcastMAC, asker, badSender},
		{"zero mac", net.HardwareAddr{0, 0, 0, 0, 0, 0}, asker, badSender},
		{"probe (sender 0.0.0.0)", unicast, netip.IPv4Unspecified(), badSender},
		{"sender claims the vip", unicast, vip, badSender},
		{"multicast ip", unicast, netip.MustParseAddr("224.0.0.1"), badSender},
		{"broadcast ip", unicast, netip.MustParseAddr("255.255.255.255"), badSender},
		{"loopback ip", unicast, netip.MustParseAddr("127.0.0.1"), badSender},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := arp.NewPacket(arp.OperationRequest, tc.mac, tc.ip, net.HardwareAddr{0, 0, 0, 0, 0, 0}, vip)
			if err != nil {
				t.Fatal(err)
			}
			reply, v := arpReply(ethernetFrame(broadcastMAC, unicast, req), own, vips, rules.MACMulticast)
			if v != tc.want || (reply != nil) != (tc.want == replied) {
				t.Errorf("verdict %s (reply %v), want %s", v, reply != nil, tc.want)
			}
		})
	}
	if _, v := arpReply(gratuitousARP(own, vip, rules.MACMulticast), own, vips, rules.MACMulticast); v != badSender {
		t.Errorf("another node's gratuitous arp: verdict %s, want bad_sender", v)
	}
}
