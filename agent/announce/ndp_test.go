package announce

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mdlayher/ndp"

	"github.com/shoalnet/shoal/rules"
)

var (
	ndpOwn    = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x11}
	ndpClient = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	ndpVIP    = netip.MustParseAddr("2001:db8:0:7::100")
	ndpAsker  = netip.MustParseAddr("2001:db8:0:7::1")
)

// solicitation frames a Neighbor Solicitation for target from src (with
// a source link-layer address option if slla is set) to dst.
func solicitation(t testing.TB, ethSrc net.HardwareAddr, src, dst, target netip.Addr, slla net.HardwareAddr) []byte {
	t.Helper()
	ns := &ndp.NeighborSolicitation{TargetAddress: target}
	if slla != nil {
		ns.Options = []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: slla}}
	}
	ethDst := ClusterMAC(target, rules.MACMulticast) // a unicast probe goes to the cached MAC
	if dst.IsMulticast() {
		g := dst.As16()
		ethDst = net.HardwareAddr{0x33, 0x33, g[12], g[13], g[14], g[15]}
	}
	f, err := ipv6Frame(ethDst, ethSrc, src, dst, ns)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// parseNA checks an advertisement frame's IPv6 header and checksum and
// returns the message.
func parseNA(t *testing.T, f []byte) (src, dst netip.Addr, na *ndp.NeighborAdvertisement) {
	t.Helper()
	if binary.BigEndian.Uint16(f[12:14]) != etherTypeIPv6 {
		t.Fatalf("ethertype %x", f[12:14])
	}
	ip := f[ethHeaderLen:]
	if ip[0]>>4 != 6 || ip[6] != protoICMPv6 || ip[7] != 255 || int(binary.BigEndian.Uint16(ip[4:6])) != len(ip)-ipv6HeaderLen {
		t.Fatalf("ipv6 header %x", ip[:8])
	}
	src, dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
	if !icmpv6ChecksumOK(src, dst, ip[ipv6HeaderLen:]) {
		t.Error("bad icmpv6 checksum")
	}
	m, err := ndp.ParseMessage(ip[ipv6HeaderLen:])
	if err != nil {
		t.Fatal(err)
	}
	na, ok := m.(*ndp.NeighborAdvertisement)
	if !ok {
		t.Fatalf("message %T, want a neighbor advertisement", m)
	}
	return src, dst, na
}

func tlla(na *ndp.NeighborAdvertisement) net.HardwareAddr {
	for _, o := range na.Options {
		if l, ok := o.(*ndp.LinkLayerAddress); ok && l.Direction == ndp.Target {
			return l.Addr
		}
	}
	return nil
}

func TestNDPReply(t *testing.T) {
	vips := []netip.Addr{netip.MustParseAddr("198.18.7.100"), ndpVIP}
	snm := solicitedNode(ndpVIP)
	if snm != netip.MustParseAddr("ff02::1:ff00:100") {
		t.Fatalf("solicited-node group %s", snm)
	}
	other := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x77}
	tests := []struct {
		name    string
		frame   []byte
		want    replyVerdict
		replyTo net.HardwareAddr
	}{
		{"multicast solicitation", solicitation(t, ndpClient, ndpAsker, snm, ndpVIP, ndpClient), replied, ndpClient},
		{"reply to the source link-layer address", solicitation(t, ndpClient, ndpAsker, snm, ndpVIP, other), replied, other},
		{"unicast probe without the option", solicitation(t, ndpClient, ndpAsker, ndpVIP, ndpVIP, nil), replied, ndpClient},
		{"link-local asker", solicitation(t, ndpClient, netip.MustParseAddr("fe80::1"), snm, ndpVIP, ndpClient), replied, ndpClient},
		{"not a vip", solicitation(t, ndpClient, ndpAsker, solicitedNode(ndpAsker), netip.MustParseAddr("2001:db8:0:7::11"), ndpClient), notForVIP, nil},
		{"duplicate address detection", solicitation(t, ndpClient, netip.IPv6Unspecified(), snm, ndpVIP, nil), badSender, nil},
		{"asker claims the vip", solicitation(t, ndpClient, ndpVIP, snm, ndpVIP, ndpClient), badSender, nil},
		{"multicast source link-layer address", solicitation(t, ndpClient, ndpAsker, snm, ndpVIP, ClusterMAC(ndpVIP, rules.MACMulticast)), badSender, nil},
		{"multicast ethernet source", solicitation(t, ClusterMAC(ndpVIP, rules.MACMulticast), ndpAsker, snm, ndpVIP, ndpClient), badSender, nil},
		{"another node's advertisement", unsolicitedNA(ndpOwn, ndpVIP, rules.MACMulticast), notForVIP, nil},
	}
	for _, tc := range tests {
		for _, mode := range macModes {
			t.Run(tc.name+" "+mode.String(), func(t *testing.T) { testNDPReply(t, tc.frame, tc.want, tc.replyTo, vips, mode) })
		}
	}
}

// testNDPReply checks ndpReply's verdict on frame in mode and, for a
// reply, its framing and the cluster MAC it advertises.
func testNDPReply(t *testing.T, frame []byte, want replyVerdict, replyTo net.HardwareAddr, vips []netip.Addr, mode rules.MACMode) {
	reply, v := ndpReply(frame, ndpOwn, vips, mode)
	if v != want || (reply != nil) != (want == replied) {
		t.Fatalf("verdict %s (reply %v), want %s", v, reply != nil, want)
	}
	if reply == nil {
		return
	}
	if !bytes.Equal(reply[0:6], replyTo) || !bytes.Equal(reply[6:12], ndpOwn) {
		t.Errorf("ethernet %s -> %s, want %s -> %s (a multicast source is dropped by switches)", net.HardwareAddr(reply[6:12]), net.HardwareAddr(reply[0:6]), ndpOwn, replyTo)
	}
	src, dst, na := parseNA(t, reply)
	asker := netip.AddrFrom16([16]byte(frame[ethHeaderLen+8 : ethHeaderLen+24]))
	if src != ndpVIP || dst != asker {
		t.Errorf("ipv6 %s -> %s, want %s -> %s", src, dst, ndpVIP, asker)
	}
	wantNA := &ndp.NeighborAdvertisement{Solicited: true, Override: true, TargetAddress: ndpVIP,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: ClusterMAC(ndpVIP, mode)}}}
	if diff := cmp.Diff(wantNA, na, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("advertisement (-want +got):\n%s", diff)
	}
}

// TestNDPReplyMalformed: frames that are not a valid solicitation from the
// link are dropped and counted as malformed.
func TestNDPReplyMalformed(t *testing.T) {
	vips := []netip.Addr{ndpVIP}
	good := solicitation(t, ndpClient, ndpAsker, solicitedNode(ndpVIP), ndpVIP, ndpClient)
	mod := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	tests := map[string][]byte{
		"empty":         nil,
		"short":         good[:50],
		"not ipv6":      mod(func(b []byte) []byte { b[12], b[13] = 0x08, 0x00; return b }),
		"version 4":     mod(func(b []byte) []byte { b[ethHeaderLen] = 4 << 4; return b }),
		"routed":        mod(func(b []byte) []byte { b[ethHeaderLen+7] = 64; return b }), // hop limit below 255
		"bad checksum":  mod(func(b []byte) []byte { b[len(b)-1] ^= 1; return b }),
		"code 1":        mod(func(b []byte) []byte { b[ethHeaderLen+ipv6HeaderLen+1] = 1; return b }),
		"length beyond": mod(func(b []byte) []byte { binary.BigEndian.PutUint16(b[ethHeaderLen+4:], 200); return b }),
		"truncated ns": mod(func(b []byte) []byte {
			binary.BigEndian.PutUint16(b[ethHeaderLen+4:], 8)
			return b[:ethHeaderLen+ipv6HeaderLen+8]
		}),
	}
	for name, f := range tests {
		if _, v := ndpReply(f, ndpOwn, vips, rules.MACMulticast); v != malformed {
			t.Errorf("%s: verdict %s, want malformed", name, v)
		}
	}
	if _, v := ndpReply(good, ndpOwn, vips, rules.MACMulticast); v != replied {
		t.Errorf("the unmodified frame: verdict %s", v)
	}
}

func TestUnsolicitedNA(t *testing.T) {
	f := unsolicitedNA(ndpOwn, ndpVIP, rules.MACMulticast)
	if !bytes.Equal(f[0:6], allNodesMAC) || !bytes.Equal(f[6:12], ndpOwn) {
		t.Errorf("ethernet header %x", f[:14])
	}
	src, dst, na := parseNA(t, f)
	if src != ndpVIP || dst != allNodes {
		t.Errorf("ipv6 %s -> %s", src, dst)
	}
	if na.Solicited || !na.Override || na.TargetAddress != ndpVIP || !bytes.Equal(tlla(na), ClusterMAC(ndpVIP, rules.MACMulticast)) {
		t.Errorf("advertisement %+v (target link-layer address %s)", na, tlla(na))
	}
}

func FuzzNDPReply(f *testing.F) {
	vips := []netip.Addr{ndpVIP}
	f.Add(solicitation(f, ndpClient, ndpAsker, solicitedNode(ndpVIP), ndpVIP, ndpClient))
	f.Add(unsolicitedNA(ndpOwn, ndpVIP, rules.MACMulticast))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		reply, v := ndpReply(b, ndpOwn, vips, rules.MACMulticast)
		if (v == replied) != (reply != nil) {
			t.Fatalf("verdict %s with reply %x", v, reply)
		}
	})
}
