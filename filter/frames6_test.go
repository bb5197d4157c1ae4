package filter

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// IPv6 test frames: gopacket builds the Ethernet, IPv6 and transport
// headers; extension headers are written by hand (gopacket serializes
// only some of them), so that a test can make any chain.

// ext6 is an extension header to put before the transport header.
type ext6 struct {
	nh    uint8 // nhHopByHop, nhRouting, nhDestOpts or nhFragment
	units uint8 // length in 8-byte units beyond the first (not for fragments)
	// A fragment header's offset (8-byte units) and M flag, and id.
	fragOff uint16
	more    bool
	id      uint32
}

// pkt6 describes an IPv6 frame to build.
type pkt6 struct {
	vlan     bool
	src, dst netip.Addr
	proto    layers.IPProtocol // the transport after the extension headers
	sport    uint16
	dport    uint16
	syn, ack bool
	icmpType uint8
	exts     []ext6
	payload  []byte
	inner    []byte // ICMPv6 payload after the 4 unused bytes (a quoted packet), when set
}

// later reports whether p is a later fragment: what follows its
// fragment header is opaque.
func (p pkt6) later() bool {
	for _, e := range p.exts {
		if e.nh == nhFragment && e.fragOff != 0 {
			return true
		}
	}
	return false
}

// chain serializes the extension headers of p followed by rest, and
// returns the first header's protocol number.
func (p pkt6) chain(rest []byte) (uint8, []byte) {
	var b []byte
	for i, e := range p.exts {
		next := uint8(p.proto)
		if i+1 < len(p.exts) {
			next = p.exts[i+1].nh
		}
		if e.nh == nhFragment {
			h := make([]byte, 8)
			h[0] = next
			fo := e.fragOff << 3
			if e.more {
				fo |= 1
			}
			binary.BigEndian.PutUint16(h[2:], fo)
			binary.BigEndian.PutUint32(h[4:], e.id)
			b = append(b, h...)
			continue
		}
		h := make([]byte, 8*(int(e.units)+1)) // Pad1 options
		h[0], h[1] = next, e.units
		b = append(b, h...)
	}
	first := uint8(p.proto)
	if len(p.exts) > 0 {
		first = p.exts[0].nh
	}
	return first, append(b, rest...)
}

// transport returns the serialized transport header and payload of p.
func (p pkt6) transport() []byte {
	if b := segment(p.proto, p.sport, p.dport, p.syn, p.ack, 1, p.payload); b != nil {
		return b
	}
	if p.proto == layers.IPProtocolICMPv6 {
		h := []byte{p.icmpType, 0, 0, 0, 0, 0, 0, 0}
		if p.inner != nil {
			return append(h, p.inner...)
		}
		return append(h, p.payload...)
	}
	return append([]byte(nil), p.payload...)
}

// build serializes p into an Ethernet frame to the cluster MAC.
func (p pkt6) build() []byte {
	rest := p.transport()
	if p.later() {
		rest = append([]byte{1, 2, 3, 4, 5, 6, 7, 8}, p.payload...)
	}
	nh, body := p.chain(rest)
	eth := &layers.Ethernet{SrcMAC: clientMAC, DstMAC: clusterMAC, EthernetType: layers.EthernetTypeIPv6}
	ls := []gopacket.SerializableLayer{eth}
	if p.vlan {
		eth.EthernetType = layers.EthernetTypeDot1Q
		ls = append(ls, &layers.Dot1Q{VLANIdentifier: 42, Type: layers.EthernetTypeIPv6})
	}
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocol(nh), SrcIP: p.src.AsSlice(), DstIP: p.dst.AsSlice()}
	ls = append(ls, ip, gopacket.Payload(body))
	return serializeNoSum(ls...)
}

// embedded6 returns the start of a packet as an ICMPv6 error quotes it:
// the IPv6 header, its extension headers and the first 8 bytes of the
// transport header, with the payload length of a longer packet.
func embedded6(p pkt6) []byte {
	rest := p.transport()
	if p.later() {
		rest = []byte{1, 2, 3, 4, 5, 6, 7, 8}
	}
	if len(rest) > 8 {
		rest = rest[:8]
	}
	nh, body := p.chain(rest)
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocol(nh), SrcIP: p.src.AsSlice(), DstIP: p.dst.AsSlice()}
	b := serializeNoSum(ip, gopacket.Payload(body))
	binary.BigEndian.PutUint16(b[4:6], uint16(len(body)+100))
	return b
}

// addr6 returns a random IPv6 address: mostly from 2001:db8::/32 and
// near the VIPs, sometimes anything, sometimes IPv4-mapped.
func (g *gen) addr6() netip.Addr {
	var b [16]byte
	switch g.rng.IntN(8) {
	case 0:
		for i := range b {
			b[i] = byte(g.rng.IntN(256))
		}
	case 1:
		b = netip.AddrFrom4([4]byte{198, 18, 0, byte(g.rng.IntN(4))}).As16() // ::ffff:198.18.0.x
	default:
		b = [16]byte{0x20, 0x01, 0x0d, 0xb8, 0, byte(g.rng.IntN(3))}
		for i := 8; i < 16; i++ {
			if g.rng.IntN(3) == 0 {
				b[i] = byte(g.rng.IntN(256))
			}
		}
		b[15] = byte(g.rng.IntN(8))
	}
	return netip.AddrFrom16(b)
}

// vip6 returns one of the generator's IPv6 VIPs.
func (g *gen) vip6() netip.Addr {
	var v6 []netip.Addr
	for _, v := range g.vips {
		if v.Is6() {
			v6 = append(v6, v)
		}
	}
	return v6[g.rng.IntN(len(v6))]
}

// exts makes a random extension-header chain: mostly none or a few,
// sometimes one too many or one too long.
func (g *gen) exts() []ext6 {
	rng := g.rng
	var es []ext6
	n := 0
	switch k := rng.IntN(20); {
	case k < 10:
	case k < 18:
		n = 1 + rng.IntN(3)
	case k < 19:
		n = MaxExtHeaders + rng.IntN(2) // at the bound, or one past it
	default:
		es = append(es, ext6{nh: nhDestOpts, units: uint8(120 + rng.IntN(10))}) // near MaxL4Offset
	}
	for i := 0; i < n; i++ {
		es = append(es, ext6{nh: []uint8{nhHopByHop, nhRouting, nhDestOpts}[rng.IntN(3)], units: uint8(rng.IntN(3))})
	}
	return es
}

// frame6 makes one random IPv6 frame, to one of the IPv6 VIPs mostly.
func (g *gen) frame6() []byte {
	rng := g.rng
	p := pkt6{vlan: rng.IntN(5) == 0, src: g.addr6(), dst: g.vip6(), sport: g.port(), dport: g.port(),
		exts: g.exts(), payload: make([]byte, rng.IntN(40))}
	if rng.IntN(10) == 0 {
		p.dst = g.addr6() // most likely not a VIP
	}
	switch k := rng.IntN(100); {
	case k < 40:
		p.proto = layers.IPProtocolTCP
		p.syn, p.ack = rng.IntN(2) == 0, rng.IntN(2) == 0
		if g.conn6[0].IsValid() && rng.IntN(4) == 0 {
			p.src, p.sport, p.dst, p.dport = g.conn6[0].Addr(), g.conn6[0].Port(), g.conn6[1].Addr(), g.conn6[1].Port()
			p.syn, p.ack = false, true
			if rng.IntN(3) == 0 {
				p.sport = uint16(rng.IntN(65536)) // finds the listener only
			}
		}
	case k < 60:
		p.proto = layers.IPProtocolUDP
	case k < 72:
		// Neighbor Discovery, echo, MLD and other informational ICMPv6.
		p.proto = layers.IPProtocolICMPv6
		p.icmpType = []uint8{128, 129, 130, 133, 134, 135, 136, 137, 143}[rng.IntN(9)]
	case k < 86:
		// An ICMPv6 error about a packet from a VIP (mostly) to a client.
		p.proto = layers.IPProtocolICMPv6
		p.icmpType = []uint8{1, 2, 3, 4}[rng.IntN(4)]
		q := pkt6{src: g.vip6(), dst: g.addr6(), sport: g.port(), dport: g.port(), exts: g.exts(),
			proto: []layers.IPProtocol{layers.IPProtocolTCP, layers.IPProtocolUDP, layers.IPProtocolICMPv6}[rng.IntN(3)]}
		if rng.IntN(8) == 0 {
			q.src = g.addr6()
		}
		if g.conn6[0].IsValid() && rng.IntN(4) == 0 {
			q.proto = layers.IPProtocolTCP
			q.src, q.sport, q.dst, q.dport = g.conn6[1].Addr(), g.conn6[1].Port(), g.conn6[0].Addr(), g.conn6[0].Port()
		}
		if rng.IntN(6) == 0 {
			q.exts = append(q.exts, ext6{nh: nhFragment, fragOff: uint16(rng.IntN(3) * 100), more: rng.IntN(2) == 0, id: rng.Uint32()})
		}
		p.inner = embedded6(q)
		if rng.IntN(10) == 0 {
			p.inner = p.inner[:rng.IntN(len(p.inner))] // a short quote
		}
	case k < 95:
		// A fragment, first or later, of a datagram seen before or not.
		p.proto = []layers.IPProtocol{layers.IPProtocolTCP, layers.IPProtocolUDP, layers.IPProtocolICMPv6}[rng.IntN(3)]
		fr := ext6{nh: nhFragment, id: uint32(g.idBase)<<16 | uint32(rng.IntN(4096)), more: rng.IntN(3) > 0}
		if p.proto == layers.IPProtocolTCP {
			p.syn, p.ack = rng.IntN(3) == 0, rng.IntN(2) == 0
			if g.conn6[0].IsValid() && rng.IntN(3) == 0 {
				p.src, p.sport, p.dst, p.dport = g.conn6[0].Addr(), g.conn6[0].Port(), g.conn6[1].Addr(), g.conn6[1].Port()
				p.syn, p.ack = false, true
			}
		}
		if !fr.more || rng.IntN(2) == 0 {
			fr.fragOff = uint16(1 + rng.IntN(1000))
			if len(g.datagrams6) > 0 && rng.IntN(3) > 0 {
				d := g.datagrams6[rng.IntN(len(g.datagrams6))]
				p.src, p.dst, p.proto, fr.id = d.src, d.dst, d.proto, d.id
				g.fragHits6++
			}
		} else {
			g.datagrams6 = append(g.datagrams6, datagram6{src: p.src, dst: p.dst, proto: p.proto, id: fr.id})
		}
		p.exts = append(p.exts, fr)
		if rng.IntN(4) == 0 {
			p.exts = append(p.exts, ext6{nh: nhDestOpts}) // options after the fragment header
		}
	default:
		p.proto = layers.IPProtocol([]uint8{50, 51, 59, 132}[rng.IntN(4)])
	}
	b := p.build()
	if rng.IntN(10) == 0 {
		b = g.mangle(b, p.vlan, fields6)
	}
	return b
}

// datagram6 names a fragmented IPv6 datagram the generator made.
type datagram6 struct {
	src, dst netip.Addr
	proto    layers.IPProtocol
	id       uint32
}
