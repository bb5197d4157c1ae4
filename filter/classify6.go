package filter

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/gopacket/layers"
)

// Bounds of the IPv6 extension-header walk, the same in filter/xdp/shoal.c
// (the verifier wants every loop and every packet offset bounded). A VIP
// packet whose chain is longer, or whose transport header starts further
// in, is dropped as malformed.
const (
	MaxExtHeaders = 8    // extension headers before the transport header
	MaxL4Offset   = 1024 // bytes from the IPv6 header's start to the transport header
)

// IPv6 extension headers the walk steps over.
const (
	nhHopByHop = 0
	nhRouting  = 43
	nhFragment = 44
	nhDestOpts = 60
)

// walk6 is the result of walking an IPv6 packet's extension headers.
type walk6 struct {
	nh  uint8 // the protocol after the last extension header
	off int   // where its header starts
	// A fragment header that makes the packet a fragment: its next
	// header, identification, and whether it is a later fragment (offset
	// not 0; the walk stops there, what follows is not a header).
	frag     bool
	later    bool
	fragID   uint32
	fragNext uint8
}

// walkIPv6 steps over the extension headers of the IPv6 packet p (its
// header and what follows, p cut to the packet's or the quote's length).
// ok is false when a header runs past p or the bounds are exceeded.
func walkIPv6(p []byte) (w walk6, ok bool) {
	w.nh, w.off = p[6], 40
	for i := 0; ; i++ {
		switch w.nh {
		case nhHopByHop, nhRouting, nhDestOpts, nhFragment:
		default:
			return w, true
		}
		if i == MaxExtHeaders || w.off+8 > len(p) {
			return w, false
		}
		h := p[w.off:]
		if w.nh == nhFragment {
			fo := binary.BigEndian.Uint16(h[2:4])
			w.nh = h[0]
			w.off += 8
			if fo&0xfff9 != 0 { // an offset or more fragments: a fragment
				w.frag, w.fragID, w.fragNext = true, binary.BigEndian.Uint32(h[4:8]), h[0]
				if fo&0xfff8 != 0 {
					w.later = true
					return w, true
				}
			}
		} else {
			w.nh = h[0]
			w.off += (int(h[1]) + 1) * 8
		}
		if w.off > len(p) || w.off > MaxL4Offset {
			return w, false
		}
	}
}

// classify6 judges the IPv6 packet ip of frame. The rules, identical in
// filter/xdp/shoal.c:
//   - A header shorter than 40 bytes passes, as does a packet whose
//     destination is not a VIP (no heartbeat check: heartbeats are IPv4).
//   - To a VIP: version 6, a payload length that is not 0 (no jumbograms)
//     and within the frame, else malformed. Hop-by-hop, routing,
//     destination options and fragment headers are stepped over, at most
//     MaxExtHeaders of them, the transport header within MaxL4Offset bytes;
//     a chain that breaks either bound or runs past the packet is malformed.
//   - A fragment header with an offset or the M flag makes a fragment, its
//     datagram named by source, destination, the header's next header and
//     its 32-bit identification, in the same memory as IPv4's: the first
//     fragment (offset 0) is judged by its ports and remembered, a later
//     one takes the remembered verdict, or without it the rule for port 0
//     of its protocol and key (client /128, 0).
//   - TCP, UDP: as for IPv4, keyed by affinity (/128 and port, /128, /64).
//   - ICMPv6 (at least 8 bytes): Neighbor Discovery (router and neighbour
//     solicitations and advertisements, redirects: types 133-137) passes
//     untouched. Errors (destination unreachable, packet too big, time
//     exceeded, parameter problem: types 1-4) quoting a packet sent from a
//     VIP are judged as that packet's flow, its extension headers walked
//     within the quote; other ICMPv6 (echo requests...) and other
//     protocols: DefaultRule, key (client /128, 0).
func (c *Classifier) classify6(frame, ip []byte) Result {
	if len(ip) < 40 {
		return Result{Verdict: Pass}
	}
	dst := addr16(ip[24:40])
	if !c.isVIP(dst) {
		return Result{Verdict: Pass}
	}
	malformed := Result{Verdict: Drop, Reason: DropMalformed, Rule: DefaultRule}
	plen := int(binary.BigEndian.Uint16(ip[4:6]))
	if ip[0]>>4 != 6 || plen == 0 || 40+plen > len(ip) {
		return malformed
	}
	p := ip[:40+plen]
	c.pkt.l3, c.pkt.ipLen = len(frame)-len(ip), 40+plen
	w, ok := walkIPv6(p)
	if !ok {
		return malformed
	}
	src := addr16(p[8:24])
	var fr fragment
	if w.frag {
		fr = fragment{key: fragKey{src: src, dst: dst, id: w.fragID, proto: w.fragNext}, first: !w.later, later: w.later}
	}
	if w.later {
		if res, ok := c.remembered(frame, fr.key); ok {
			return res
		}
		f := c.noPorts(dst, protoOf(layers.IPProtocol(w.fragNext)), src)
		return c.decide(frame, &f, fr)
	}
	f, pass, ok := c.parse6(p, w, src, dst)
	switch {
	case pass:
		return Result{Verdict: Pass}
	case !ok:
		return malformed
	}
	return c.decide(frame, &f, fr)
}

// parse6 reads the flow of the IPv6 packet p to VIP dst from its transport
// header, which w found. pass is set for Neighbor Discovery.
func (c *Classifier) parse6(p []byte, w walk6, src, dst netip.Addr) (f flow, pass, ok bool) {
	l4 := p[w.off:]
	switch layers.IPProtocol(w.nh) {
	case layers.IPProtocolTCP, layers.IPProtocolUDP:
		f, ok = c.ports(l4, protoOf(layers.IPProtocol(w.nh)), src, dst)
		return f, false, ok
	case layers.IPProtocolICMPv6:
		if len(l4) < 8 {
			return f, false, false
		}
		switch t := l4[0]; {
		case t >= 133 && t <= 137:
			return f, true, true
		case t >= 1 && t <= 4:
			f, ok = c.parseEmbedded6(l4[8:], src)
			return f, false, ok
		}
	}
	f.rule, f.key = DefaultRule, keyFor(AffinitySingle, src, 0)
	return f, false, true
}

// parseEmbedded6 reads the flow of the IPv6 packet an ICMPv6 error quotes
// (e, as much of it as the error carries). The quoted packet went from a
// VIP to a client; an error quoting a packet not sent from a VIP is keyed
// like any other ICMPv6, by the sender (outerSrc).
func (c *Classifier) parseEmbedded6(e []byte, outerSrc netip.Addr) (f flow, ok bool) {
	if len(e) < 40 || e[0]>>4 != 6 {
		return f, false
	}
	vip := addr16(e[8:24])
	if !c.isVIP(vip) {
		f.rule, f.key = DefaultRule, keyFor(AffinitySingle, outerSrc, 0)
		return f, true
	}
	client := addr16(e[24:40])
	w, ok := walkIPv6(e)
	if !ok {
		return f, false
	}
	return c.quotedPorts(e, w.off, w.later, protoOf(layers.IPProtocol(w.nh)), vip, client)
}

func addr16(b []byte) netip.Addr { return netip.AddrFrom16([16]byte(b)) }
