package filter

import (
	"encoding/binary"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// Test frames are built with gopacket; gen makes random ones for the
// differential tests and the helpers below make exact ones for table tests.

var (
	clientMAC  = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	nodeMAC    = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
	clusterMAC = net.HardwareAddr{0x03, 0xbf, 198, 18, 0, 1}
)

// pkt describes a frame to build.
type pkt struct {
	vlan     bool
	src, dst netip.Addr
	proto    layers.IPProtocol
	sport    uint16
	dport    uint16
	syn, ack bool
	fin      bool
	icmpType uint8
	mf       bool
	fragOff  uint16 // in 8-byte units
	id       uint16 // IP id; 0 means 7
	ipOpts   bool
	tcpOpts  bool
	payload  []byte
	inner    []byte // ICMP payload (an embedded header), when set
}

// build serializes p into an Ethernet frame to the cluster MAC.
func (p pkt) build() []byte {
	eth := &layers.Ethernet{SrcMAC: clientMAC, DstMAC: clusterMAC, EthernetType: layers.EthernetTypeIPv4}
	ls := []gopacket.SerializableLayer{eth}
	if p.vlan {
		eth.EthernetType = layers.EthernetTypeDot1Q
		ls = append(ls, &layers.Dot1Q{VLANIdentifier: 42, Type: layers.EthernetTypeIPv4})
	}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: p.proto, SrcIP: p.src.AsSlice(), DstIP: p.dst.AsSlice(), FragOffset: p.fragOff, Id: cmpOr(p.id, 7)}
	if p.mf {
		ip.Flags |= layers.IPv4MoreFragments
	}
	if p.ipOpts {
		ip.Options = []layers.IPv4Option{{OptionType: 1}, {OptionType: 1}, {OptionType: 1}, {OptionType: 0}}
	}
	ls = append(ls, ip)
	switch {
	case p.mf || p.fragOff != 0:
		// A fragment's payload is opaque bytes; a first fragment starts
		// with the transport header anyway.
		b := p.transport(ip)
		ls = append(ls, gopacket.Payload(b))
	case p.proto == layers.IPProtocolTCP:
		tcp := &layers.TCP{SrcPort: layers.TCPPort(p.sport), DstPort: layers.TCPPort(p.dport), SYN: p.syn, ACK: p.ack, FIN: p.fin, Seq: 1, Window: 512}
		if p.tcpOpts {
			tcp.Options = []layers.TCPOption{{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{5, 0xb4}}}
		}
		tcp.SetNetworkLayerForChecksum(ip)
		ls = append(ls, tcp, gopacket.Payload(p.payload))
	case p.proto == layers.IPProtocolUDP:
		udp := &layers.UDP{SrcPort: layers.UDPPort(p.sport), DstPort: layers.UDPPort(p.dport)}
		udp.SetNetworkLayerForChecksum(ip)
		ls = append(ls, udp, gopacket.Payload(p.payload))
	case p.proto == layers.IPProtocolICMPv4:
		ls = append(ls, &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(p.icmpType, 0), Id: 1, Seq: 1})
		if p.inner != nil {
			ls = append(ls, gopacket.Payload(p.inner))
		} else {
			ls = append(ls, gopacket.Payload(p.payload))
		}
	default:
		ls = append(ls, gopacket.Payload(p.payload))
	}
	return serialize(ls...)
}

// transport returns the serialized transport header and payload of p.
func (p pkt) transport(ip *layers.IPv4) []byte {
	if b := segment(p.proto, p.sport, p.dport, p.syn, p.ack, 0, p.payload); b != nil {
		return b
	}
	return append([]byte{8, 0, 0, 0, 0, 1, 0, 1}, p.payload...)
}

// segment serializes a TCP header (flags syn and ack, sequence number
// seq) or a UDP header, without checksum, and the payload; nil for any
// other protocol.
func segment(proto layers.IPProtocol, sport, dport uint16, syn, ack bool, seq uint32, payload []byte) []byte {
	switch proto {
	case layers.IPProtocolTCP:
		tcp := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), SYN: syn, ACK: ack, Seq: seq, Window: 512}
		return serializeNoSum(tcp, gopacket.Payload(payload))
	case layers.IPProtocolUDP:
		udp := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}
		return serializeNoSum(udp, gopacket.Payload(payload))
	}
	return nil
}

// embedded returns the start of a packet as an ICMP error quotes it: the
// IPv4 header and the first 8 bytes of the transport header.
func embedded(p pkt) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: p.proto, SrcIP: p.src.AsSlice(), DstIP: p.dst.AsSlice(), FragOffset: p.fragOff}
	if p.mf {
		ip.Flags |= layers.IPv4MoreFragments
	}
	var rest []byte
	if p.fragOff != 0 {
		rest = []byte{1, 2, 3, 4, 5, 6, 7, 8}
	} else {
		rest = p.transport(ip)
	}
	if len(rest) > 8 {
		rest = rest[:8]
	}
	b := serialize(ip, gopacket.Payload(rest))
	// The quoted packet was longer than what is quoted.
	binary.BigEndian.PutUint16(b[2:4], uint16(len(b)+100))
	return b
}

func serialize(ls ...gopacket.SerializableLayer) []byte {
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		panic(err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

func serializeNoSum(ls ...gopacket.SerializableLayer) []byte {
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, ls...); err != nil {
		panic(err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

// otherFrame builds a frame that is not IPv4: ARP, IPv6 or something else.
func otherFrame(rng *rand.Rand) []byte {
	switch rng.IntN(3) {
	case 0:
		return serialize(
			&layers.Ethernet{SrcMAC: clientMAC, DstMAC: layers.EthernetBroadcast, EthernetType: layers.EthernetTypeARP},
			&layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
				Operation: layers.ARPRequest, SourceHwAddress: clientMAC, SourceProtAddress: []byte{198, 18, 0, 9},
				DstHwAddress: make([]byte, 6), DstProtAddress: []byte{198, 18, 0, 1}})
	case 1:
		return serialize(
			&layers.Ethernet{SrcMAC: clientMAC, DstMAC: clusterMAC, EthernetType: layers.EthernetTypeIPv6},
			&layers.IPv6{Version: 6, NextHeader: layers.IPProtocolUDP, HopLimit: 64, SrcIP: net.ParseIP("2001:db8::1"), DstIP: net.ParseIP("2001:db8::2")},
			gopacket.Payload([]byte{1, 2, 3, 4, 5, 6, 7, 8}))
	}
	b := serialize(&layers.Ethernet{SrcMAC: clientMAC, DstMAC: clusterMAC, EthernetType: layers.EthernetType(rng.IntN(0x10000))},
		gopacket.Payload(make([]byte, rng.IntN(60))))
	return b
}

// gen makes random frames and random tables.
type gen struct {
	rng  *rand.Rand
	vips []netip.Addr
	// A real connection (client -> vip) and a real listener, when set.
	conn     [2]netip.AddrPort
	listener netip.AddrPort
	ports    []uint16 // interesting ports: rule edges and the like
	// Fragments: IP ids start at idBase; datagrams lists first fragments
	// made, which later fragments reuse (fragHits counts those).
	idBase    uint16
	datagrams []pkt
	fragHits  int
	// This node's heartbeat socket and its peers', when set.
	hbSelf  netip.AddrPort
	hbPeers []netip.AddrPort
	// IPv6: a real connection (client -> an IPv6 vip), when set, and the
	// first fragments made.
	conn6      [2]netip.AddrPort
	datagrams6 []datagram6
	fragHits6  int
}

func (g *gen) addr() netip.Addr {
	if g.rng.IntN(2) == 0 {
		return netip.AddrFrom4([4]byte{198, 18 + byte(g.rng.IntN(2)), byte(g.rng.IntN(4)), byte(g.rng.IntN(256))})
	}
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], g.rng.Uint32())
	return netip.AddrFrom4(b)
}

func (g *gen) port() uint16 {
	if len(g.ports) > 0 && g.rng.IntN(2) == 0 {
		return g.ports[g.rng.IntN(len(g.ports))]
	}
	return uint16(g.rng.IntN(65536))
}

func (g *gen) vip() netip.Addr { return g.vips[g.rng.IntN(len(g.vips))] }

// vip4 returns one of the generator's IPv4 VIPs.
func (g *gen) vip4() netip.Addr {
	for {
		if v := g.vip(); v.Is4() {
			return v
		}
	}
}

// has6 reports whether the generator has IPv6 VIPs.
func (g *gen) has6() bool {
	for _, v := range g.vips {
		if v.Is6() {
			return true
		}
	}
	return false
}

// tables makes a random configuration and node state: several rules, some
// for every VIP, all affinities and modes, every bucket state.
func (g *gen) tables() *Tables {
	c := &Config{Seed: g.rng.Uint32(), VIPs: g.vips}
	g.ports = []uint16{0, 1, 53, 80, 443, 8080, 65535}
	id := RuleID(0)
	for n := g.rng.IntN(7); n > 0; n-- {
		id += RuleID(1 + g.rng.IntN(5))
		r := Rule{ID: id, Proto: Protocol(1 + g.rng.IntN(3)), Affinity: Affinity(g.rng.IntN(3))}
		if g.rng.IntN(3) > 0 {
			r.VIP = g.vip()
		}
		switch g.rng.IntN(4) {
		case 0:
			r.PortLo, r.PortHi = 0, 65535
		case 1:
			p := g.port()
			r.PortLo, r.PortHi = p, p
		default:
			lo := uint16(g.rng.IntN(65536))
			r.PortLo, r.PortHi = lo, lo+uint16(g.rng.IntN(int(65535-lo)+1))
		}
		if g.rng.IntN(10) == 0 {
			r.Mode = ModeDisabled
		}
		if g.rng.IntN(10) == 0 {
			r.State = RuleDisabled
		}
		c.Rules = append(c.Rules, r)
		g.ports = append(g.ports, r.PortLo, r.PortHi, r.PortHi+1, r.PortLo-1)
	}
	t := &Tables{Config: c, States: map[RuleID]*[NumBuckets]BucketState{}}
	for _, id := range c.RuleIDs() {
		if g.rng.IntN(10) == 0 {
			continue // a rule with no states: all NotOwned
		}
		st := new([NumBuckets]BucketState)
		for b := range st {
			st[b] = BucketState(g.rng.IntN(4))
		}
		t.States[id] = st
	}
	if g.rng.IntN(2) == 0 {
		// Hand-overs: indexes 1-7, pending buckets (where a SYN handed
		// over here is taken) and one past the limit; index 5 has no MAC
		// (the SYN is dropped).
		t.HandTo = map[RuleID]*[NumBuckets]uint8{}
		for i := 1; i < 8; i++ {
			if i != 5 {
				t.HandMACs[i] = [6]byte{0x02, 0, 0, 0, 1, byte(i)}
			}
		}
		for _, id := range c.RuleIDs() {
			h := new([NumBuckets]uint8)
			for b := range h {
				switch k := g.rng.IntN(40); {
				case k == 0:
					h[b] = MaxHandTo + 1
				case k < 6:
					h[b] = HandPending
				case k < 9:
					h[b] = HandKeep
				case k < 20:
					h[b] = uint8(g.rng.IntN(8))
				}
			}
			t.HandTo[id] = h
		}
	}
	return t
}

// prevOf makes tables for Prev of t, as a rules change leaves them: t's
// configuration before the change (another seed, a rule's ports moved or
// widened, a rule dropped, or the same) with states of their own.
func (g *gen) prevOf(t *Tables) *Tables {
	c := *t.Config
	c.Rules = slices.Clone(c.Rules)
	switch g.rng.IntN(4) {
	case 0:
		c.Seed = g.rng.Uint32()
	case 1:
		if len(c.Rules) > 0 {
			i := g.rng.IntN(len(c.Rules))
			c.Rules = slices.Delete(c.Rules, i, i+1)
		}
	case 2:
		for i := range c.Rules {
			if r := &c.Rules[i]; r.PortLo > 0 {
				r.PortLo--
			}
		}
	}
	p := &Tables{Config: &c, States: map[RuleID]*[NumBuckets]BucketState{}}
	for _, id := range c.RuleIDs() {
		st := new([NumBuckets]BucketState)
		for b := range st {
			st[b] = BucketState(g.rng.IntN(4))
		}
		p.States[id] = st
	}
	return p
}

// frame makes one random frame.
func (g *gen) frame() []byte {
	rng := g.rng
	if rng.IntN(20) == 0 {
		return otherFrame(rng)
	}
	if g.has6() && rng.IntN(2) == 0 {
		return g.frame6()
	}
	p := pkt{vlan: rng.IntN(5) == 0, src: g.addr(), dst: g.vip4(), sport: g.port(), dport: g.port(),
		ipOpts: rng.IntN(10) == 0, payload: make([]byte, rng.IntN(40))}
	if rng.IntN(10) == 0 {
		p.dst = g.addr() // most likely not a VIP
	}
	switch k := rng.IntN(100); {
	case k < 45:
		p.proto = layers.IPProtocolTCP
		p.syn, p.ack = rng.IntN(2) == 0, rng.IntN(2) == 0
		p.tcpOpts = rng.IntN(5) == 0
		if g.conn[0].IsValid() && rng.IntN(4) == 0 {
			p.src, p.sport, p.dst, p.dport = g.conn[0].Addr(), g.conn[0].Port(), g.conn[1].Addr(), g.conn[1].Port()
			if rng.IntN(3) == 0 {
				p.dport = g.listener.Port()
				p.sport = uint16(rng.IntN(65536))
			}
		}
	case k < 70:
		p.proto = layers.IPProtocolUDP
		if g.hbSelf.IsValid() && rng.IntN(6) == 0 {
			// To this node's heartbeat socket, from a peer's or not.
			p.dst, p.dport = g.hbSelf.Addr(), g.hbSelf.Port()
			if p.dst.IsUnspecified() {
				p.dst = g.addr()
			}
			if len(g.hbPeers) > 0 && rng.IntN(2) == 0 {
				hp := g.hbPeers[rng.IntN(len(g.hbPeers))]
				p.src, p.sport = hp.Addr(), hp.Port()
				if rng.IntN(5) == 0 {
					p.sport++ // the right address, another socket
				}
			}
		}
	case k < 78:
		p.proto = layers.IPProtocolICMPv4
		p.icmpType = []uint8{0, 8, 13, 5}[rng.IntN(4)]
	case k < 90:
		// An ICMP error about a packet from a VIP (mostly) to a client.
		p.proto = layers.IPProtocolICMPv4
		p.icmpType = []uint8{3, 11, 12}[rng.IntN(3)]
		q := pkt{src: g.vip4(), dst: g.addr(), sport: g.port(), dport: g.port(),
			proto: []layers.IPProtocol{layers.IPProtocolTCP, layers.IPProtocolUDP, layers.IPProtocolICMPv4}[rng.IntN(3)]}
		if rng.IntN(8) == 0 {
			q.src = g.addr()
		}
		if g.conn[0].IsValid() && rng.IntN(4) == 0 {
			q.proto = layers.IPProtocolTCP
			q.src, q.sport, q.dst, q.dport = g.conn[1].Addr(), g.conn[1].Port(), g.conn[0].Addr(), g.conn[0].Port()
		}
		if rng.IntN(8) == 0 {
			q.fragOff = uint16(1 + rng.IntN(100))
		}
		q.mf = rng.IntN(8) == 0
		p.inner = embedded(q)
		if rng.IntN(10) == 0 {
			p.inner = p.inner[:rng.IntN(len(p.inner))] // a short quote
		}
	case k < 95:
		// A fragment, first or later, of a datagram seen before or not.
		p.proto = []layers.IPProtocol{layers.IPProtocolTCP, layers.IPProtocolUDP, layers.IPProtocolICMPv4}[rng.IntN(3)]
		p.id = g.idBase | uint16(rng.IntN(4096))
		if p.proto == layers.IPProtocolTCP {
			p.syn, p.ack = rng.IntN(3) == 0, rng.IntN(2) == 0
			if g.conn[0].IsValid() && rng.IntN(3) == 0 {
				p.src, p.sport, p.dst, p.dport = g.conn[0].Addr(), g.conn[0].Port(), g.conn[1].Addr(), g.conn[1].Port()
				p.syn, p.ack = false, true
			}
		}
		p.mf = rng.IntN(3) > 0
		if !p.mf || rng.IntN(2) == 0 {
			p.fragOff = uint16(1 + rng.IntN(1000))
			if len(g.datagrams) > 0 && rng.IntN(3) > 0 {
				d := g.datagrams[rng.IntN(len(g.datagrams))]
				p.src, p.dst, p.proto, p.id = d.src, d.dst, d.proto, d.id
				g.fragHits++
			}
		} else {
			g.datagrams = append(g.datagrams, p)
		}
	default:
		p.proto = layers.IPProtocol([]uint8{47, 50, 132, 255}[rng.IntN(4)])
	}
	b := p.build()
	if rng.IntN(10) == 0 {
		b = g.mangle(b, p.vlan, fields4)
	}
	return b
}

// ipFields are the header fields mangle corrupts, by offset from the IP
// header: a 16-bit length and two single bytes.
type ipFields struct{ length, byte1, byte2 int }

var (
	fields4 = ipFields{
		length: 2,       // total length
		byte1:  20 + 12, // TCP data offset (if TCP)
		byte2:  20 + 8,  // an embedded IPv4 version and IHL (if ICMP)
	}
	fields6 = ipFields{
		length: 4,       // payload length, 0 included
		byte1:  40 + 1,  // an extension header's length (if any)
		byte2:  40 + 12, // TCP data offset (if TCP right after the header)
	}
)

// mangle breaks a frame: truncates it, corrupts one of the header fields
// f of its IP version (or the version byte) or pads it.
func (g *gen) mangle(b []byte, vlan bool, f ipFields) []byte {
	rng := g.rng
	ip := 14
	if vlan {
		ip = 18
	}
	switch rng.IntN(6) {
	case 0:
		return b[:14+rng.IntN(len(b)-13)] // prog.Run needs a whole Ethernet header
	case 1:
		b[ip] = byte(rng.IntN(256)) // version and IHL (IPv4), version and traffic class (IPv6)
	case 2:
		binary.BigEndian.PutUint16(b[ip+f.length:], uint16(rng.IntN(len(b)+20)))
	case 3:
		if len(b) > ip+f.byte1 {
			b[ip+f.byte1] = byte(rng.IntN(256))
		}
	case 4:
		if len(b) > ip+f.byte2 {
			b[ip+f.byte2] = byte(rng.IntN(256))
		}
	case 5:
		b = append(b, make([]byte, rng.IntN(30))...) // Ethernet padding
	}
	return b
}

// conns is a ConnLookup holding a fixed set of connections.
type conns map[[2]netip.AddrPort]bool

// conns maps a connection to true for a live socket, false for one in
// TIME_WAIT.
func (c conns) HoldsConn(client, vip netip.AddrPort) bool {
	live, ok := c[[2]netip.AddrPort{client, vip}]
	return ok && live
}

func (c conns) TimeWait(client, vip netip.AddrPort) bool {
	live, ok := c[[2]netip.AddrPort{client, vip}]
	return ok && !live
}

// ValidCookie: the tests' nodes never answer with SYN cookies, but for
// TestSynCookie, which runs a real handshake.
func (c conns) ValidCookie(client, vip netip.AddrPort, seq, ack uint32) bool { return false }

// countingConns counts the lookups that found a connection.
type countingConns struct {
	conns
	found, found6 int
}

func (c *countingConns) HoldsConn(client, vip netip.AddrPort) bool {
	ok := c.conns.HoldsConn(client, vip)
	if ok {
		c.found++
		if vip.Addr().Is6() {
			c.found6++
		}
	}
	return ok
}

func cmpOr(v, def uint16) uint16 {
	if v != 0 {
		return v
	}
	return def
}
