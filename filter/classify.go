package filter

import (
	"encoding/binary"
	"net"
	"net/netip"

	"github.com/google/gopacket/layers"
)

// ConnLookup answers the one question the data plane asks the kernel's
// socket table (in XDP: bpf_skc_lookup_tcp).
type ConnLookup interface {
	// HoldsConn reports whether this node holds a TCP socket that is
	// neither a listener nor in TIME_WAIT (established, SYN_RECV, FIN_WAIT,
	// ...) for the connection from client to vip.
	HoldsConn(client, vip netip.AddrPort) bool
	// TimeWait reports whether it holds one in TIME_WAIT (which counts
	// for a FIN only: see the XDP program's holds_conn).
	TimeWait(client, vip netip.AddrPort) bool
	// ValidCookie reports whether a TCP ACK (no SYN, no RST) from client
	// to vip completes a SYN-cookie handshake this node's listener
	// answered (in XDP: bpf_tcp_check_syncookie). It is asked only when
	// HoldsConn is false; seq and ack are the segment's numbers.
	ValidCookie(client, vip netip.AddrPort, seq, ack uint32) bool
}

// NoConns is a ConnLookup for a node that holds no connections.
type NoConns struct{}

// HoldsConn always reports false.
func (NoConns) HoldsConn(client, vip netip.AddrPort) bool { return false }

// TimeWait always reports false.
func (NoConns) TimeWait(client, vip netip.AddrPort) bool { return false }

// ValidCookie always reports false.
func (NoConns) ValidCookie(client, vip netip.AddrPort, seq, ack uint32) bool { return false }

// Classifier is the reference data plane: the XDP program's verdicts,
// computed in Go from Tables. Tests compare the two frame by frame, and
// `shoal simulate` uses it to explain what a node would do with a packet.
//
// It parses by hand with encoding/binary (the gopacket decoders reject
// packets over IPv4 and TCP option details, and read an IPv4 total length of
// zero as "TSO", which the kernel program does not do, so a reference built
// on them would be a different function); gopacket supplies the protocol
// numbers here and builds the frames in the tests.
//
// The rules, identical in filter/xdp/shoal.c (IPv6's are on classify6):
//   - Ethernet with at most one 802.1Q tag, then IPv4 or IPv6; anything
//     else, or an IPv4 header shorter than 20 bytes, passes. So does an
//     IPv4 packet whose destination is not a VIP.
//   - To a VIP, the IPv4 header must be sane (version 4, IHL >= 5, header
//     within total length, total length within the frame, trailing Ethernet
//     padding allowed); a broken one is dropped as malformed, counted under
//     DefaultRule. So are TCP shorter than 20 bytes or with a data offset
//     outside the segment, UDP or ICMP shorter than 8 bytes, and an ICMP
//     error whose embedded IPv4 header is broken.
//   - A datagram's first fragment (MF, offset 0) is judged like any packet
//     and its verdict remembered (by source, destination, protocol and IP
//     id; FragEntries datagrams, least recently used forgotten first);
//     a later fragment gets the remembered verdict, counted under the same
//     rule. A later fragment whose first fragment was not seen: the rule
//     for destination port 0 of the protocol (TCP and UDP; DefaultRule for
//     others), key (client IP, 0). A first fragment dropped as malformed is
//     not remembered.
//   - TCP and UDP: the rule for the destination port, key by its affinity.
//   - ICMP errors (destination unreachable, time exceeded, parameter
//     problem) about a packet sent from a VIP are judged as the packets of
//     the embedded flow would be: the client is the embedded destination.
//     Other ICMP and other protocols: DefaultRule, key (client IP, 0).
//   - A disabled rule drops. Then by bucket state: Owned accepts, NotOwned
//     drops; OwnedDirty accepts a SYN (SYN without ACK), other TCP only for
//     a connection this node holds, and everything else; Draining accepts
//     TCP only for a connection this node holds, nothing else. A TCP ACK
//     (not an ICMP error about one) that finds no connection holds one when
//     it completes a valid SYN cookie. Later fragments judged without their
//     first count as "everything else" (they carry no ports to look up).
//   - A SYN (not a fragment) in a rule Tables.Prev remaps, which these
//     tables do not take: if Prev's states take it (Prev's rule and bucket
//     for the flow, Prev's rule not disabled), it is accepted when the
//     bucket's hand-over index is HandKeep or HandPending and handed over
//     by any other index with a MAC; otherwise dropped, never handed over.
//   - The data-plane lease: once it has expired (SetLeaseExpired), Owned
//     and OwnedDirty count as Draining.
//   - Not VIP traffic, and passed, but for UDP to this node's heartbeat
//     socket from an address that is not a peer's (SetHeartbeatPeers):
//     dropped with DropNotPeer, counted apart from the rules.
type Classifier struct {
	t            *Tables
	remapped     map[RuleID]bool // t.Remapped()
	mac          [6]byte
	conns        ConnLookup
	leaseExpired bool
	frags        *fragMemory // nil until a first fragment is seen; nil in Classify
	remember     bool
	hbSelf       netip.AddrPort
	hbPeers      map[netip.AddrPort]bool
	members      map[netip.Addr]bool
	pkt          packet // of the frame being judged
}

// packet is what the classifier knows of the frame it is judging beyond
// its flow: where the IP header starts and the IP packet's length, who
// forwarded it here and after how many hops, and the frame it leaves
// when it changes its size (forwarded, or decapsulated).
type packet struct {
	l3    int
	ipLen int
	from  netip.Addr
	hops  uint8
	out   []byte
}

// SetMembers mirrors (*XDP).SetMembers: the addresses a forwarded packet
// is taken from (routed mode).
func (c *Classifier) SetMembers(addrs []netip.Addr) {
	c.members = make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		c.members[a.Unmap()] = true
	}
}

// NewClassifier returns a classifier for a node with tables t whose cluster
// interface has MAC ifMAC. conns may be nil for a node with no connections.
func NewClassifier(t *Tables, ifMAC net.HardwareAddr, conns ConnLookup) *Classifier {
	c := &Classifier{t: t, remapped: t.Remapped(), conns: conns, remember: true}
	copy(c.mac[:], ifMAC)
	if c.conns == nil {
		c.conns = NoConns{}
	}
	return c
}

// Classify judges one frame for a node with tables t and interface MAC
// ifMAC, as Classifier.Classify does (rewriting the destination MAC of
// frame on Accept), for a node that remembers no fragments. conns may be
// nil.
func Classify(t *Tables, frame []byte, ifMAC net.HardwareAddr, conns ConnLookup) Result {
	c := Classifier{t: t, remapped: t.Remapped(), conns: conns}
	copy(c.mac[:], ifMAC)
	if c.conns == nil {
		c.conns = NoConns{}
	}
	return c.Classify(frame)
}

// SetTables makes t the tables later frames are judged by, keeping what
// the classifier remembers of fragments (as the XDP program keeps its LRU
// across updates).
func (c *Classifier) SetTables(t *Tables) { c.t, c.remapped = t, t.Remapped() }

// SetLeaseExpired says whether the data-plane lease has expired.
func (c *Classifier) SetLeaseExpired(expired bool) { c.leaseExpired = expired }

// SetHeartbeatPeers mirrors (*XDP).SetHeartbeatPeers. An unspecified
// address in self stands for every local address; a zero self turns the
// check off.
func (c *Classifier) SetHeartbeatPeers(self netip.AddrPort, peers []netip.AddrPort) {
	c.hbSelf = netip.AddrPortFrom(self.Addr().Unmap(), self.Port())
	c.hbPeers = make(map[netip.AddrPort]bool, len(peers))
	for _, p := range peers {
		c.hbPeers[netip.AddrPortFrom(p.Addr().Unmap(), p.Port())] = true
	}
}

// flow is what the state rules need to know of a packet.
type flow struct {
	rule     RuleID
	key      Key
	tcp      bool // a TCP packet with a known 4-tuple (or an ICMP error about one)
	syn      bool
	fin      bool // a TCP FIN, itself (not quoted by ICMP)
	cookie   bool // a TCP ACK without SYN or RST, itself (not quoted by ICMP)
	seq, ack uint32
	client   netip.AddrPort
	vip      netip.AddrPort
}

// Classify judges frame. On Accept it rewrites the destination MAC of frame
// in place, as the XDP program does; frame is otherwise untouched. It does
// not allocate, but for its fragment memory, made once, when it sees its
// first first fragment.
func (c *Classifier) Classify(frame []byte) Result {
	r, _ := c.ClassifyFrame(frame)
	return r
}

// ClassifyFrame judges frame as Classify does, and returns the frame the
// XDP program leaves: frame itself, rewritten in place, or a new frame for
// a packet it forwards (encapsulated) or was forwarded (decapsulated).
func (c *Classifier) ClassifyFrame(frame []byte) (Result, []byte) {
	c.pkt = packet{}
	r := c.classifyEth(frame)
	if r.Verdict != Pass {
		r.From, r.Hops = c.pkt.from, c.pkt.hops
	}
	if c.pkt.out != nil {
		return r, c.pkt.out
	}
	return r, frame
}

func (c *Classifier) classifyEth(frame []byte) Result {
	if len(frame) < 14 {
		return Result{Verdict: Pass}
	}
	et := layers.EthernetType(binary.BigEndian.Uint16(frame[12:14]))
	off := 14
	if et == layers.EthernetTypeDot1Q {
		if len(frame) < 18 {
			return Result{Verdict: Pass}
		}
		et = layers.EthernetType(binary.BigEndian.Uint16(frame[16:18]))
		off = 18
	}
	switch et {
	case layers.EthernetTypeIPv4:
		return c.classify4(frame, frame[off:])
	case layers.EthernetTypeIPv6:
		return c.classify6(frame, frame[off:])
	}
	return Result{Verdict: Pass}
}

// fragment says whether a packet is a fragment of a datagram and which.
type fragment struct {
	key   fragKey
	first bool // offset 0 and more fragments: judged, its verdict remembered
	later bool // a later fragment: takes the first fragment's verdict
}

// classify4 judges the IPv4 packet ip of frame.
func (c *Classifier) classify4(frame, ip []byte) Result {
	if len(ip) < 20 {
		return Result{Verdict: Pass}
	}
	dst := addr4(ip[16:20])
	if c.t.Forwarding() && !c.pkt.from.IsValid() && len(frame)-len(ip) == 14 &&
		(ip[9] == byte(layers.IPProtocolIPv4) || ip[9] == byte(layers.IPProtocolIPv6)) && dst == c.t.Self {
		if r, ok := c.decap(frame, ip); ok {
			return r
		}
	}
	if !c.isVIP(dst) {
		if !c.heartbeatOK(ip, dst) {
			return Result{Verdict: Drop, Reason: DropNotPeer}
		}
		return Result{Verdict: Pass}
	}
	fragOff := binary.BigEndian.Uint16(ip[6:8])
	var fr fragment
	if fragOff&0x3fff != 0 {
		fr.key = fragKey{src: addr4(ip[12:16]), dst: dst, id: uint32(binary.BigEndian.Uint16(ip[4:6])), proto: ip[9]}
		fr.first, fr.later = fragOff&0x1fff == 0, fragOff&0x1fff != 0
	}
	c.pkt.l3, c.pkt.ipLen = len(frame)-len(ip), int(binary.BigEndian.Uint16(ip[2:4]))
	if fr.later && saneIPv4(ip) {
		if res, ok := c.remembered(frame, fr.key); ok {
			return res
		}
	}
	f, ok := c.parse(ip, dst)
	if !ok {
		return Result{Verdict: Drop, Reason: DropMalformed, Rule: DefaultRule}
	}
	return c.decide(frame, &f, fr)
}

// remembered returns the verdict remembered for the datagram k's first
// fragment, if any, applied to frame.
func (c *Classifier) remembered(frame []byte, k fragKey) (Result, bool) {
	if c.frags == nil {
		return Result{}, false
	}
	v, ok := c.frags.get(k)
	res := v.Result
	if ok && res.Verdict == Accept {
		copy(frame[0:6], c.mac[:])
	}
	if ok && res.Verdict != Accept && v.to.IsValid() {
		// The first fragment's node, for this one too.
		res.Verdict, res.Reason = Drop, v.reason
		res.Via, res.Second = netip.Addr{}, false
		c.forward(frame, &res, c.t.peerIndex(v.to), false)
	}
	return res, ok
}

// fwdMark marks, in its outer header's id, a packet a node forwarded; the
// id's low byte counts the hops.
const fwdMark = 0x5e00

// decap judges a packet forwarded to this node (routed mode): the packet
// it carries, if a member sent it; ok is false for a packet of another
// tunnel, which is judged as any other.
func (c *Classifier) decap(frame, ip []byte) (Result, bool) {
	id := binary.BigEndian.Uint16(ip[4:6])
	if ip[0] != 0x45 || id&0xff00 != fwdMark {
		return Result{}, false
	}
	from := addr4(ip[12:16])
	if !c.members[from] {
		return Result{Verdict: Drop, Reason: DropForeign}, true
	}
	inner := make([]byte, len(frame)-EncapOverhead)
	copy(inner, frame[:12])
	et := layers.EthernetTypeIPv4
	if ip[9] == byte(layers.IPProtocolIPv6) {
		et = layers.EthernetTypeIPv6
	}
	binary.BigEndian.PutUint16(inner[12:14], uint16(et))
	copy(inner[14:], ip[EncapOverhead:])
	// The packet keeps its outer header unless it is taken (then it
	// leaves as the inner frame) or forwarded on (its outer header
	// rewritten).
	c.pkt = packet{from: from, hops: uint8(id)}
	malformed := Result{Verdict: Drop, Reason: DropMalformed, Rule: DefaultRule}
	var r Result
	switch {
	case len(inner) < 14+20, et == layers.EthernetTypeIPv6 && len(inner) < 14+40:
		return malformed, true
	case et == layers.EthernetTypeIPv6:
		r = c.classify6(inner, inner[14:])
	default:
		r = c.classify4(inner, inner[14:])
	}
	switch {
	case r.Verdict == Pass || r.Reason == DropNotPeer:
		return Result{Verdict: Drop, Reason: DropForeign}, true // no VIP traffic: nothing a member forwards
	case r.Verdict == Accept:
		c.pkt.out = inner
	case r.Verdict == Drop:
		c.pkt.out = nil
	}
	return r, true
}

// forward sends the frame of res (dropped so far) to the node at index i
// of Peers, encapsulated, as the program's forward does: not past
// MaxHops, never to this node, never an 802.1Q-tagged frame, only with a
// next hop's MAC, and within the MTU.
func (c *Classifier) forward(frame []byte, res *Result, i int, second bool) {
	if i <= 0 || i >= MaxForward {
		return
	}
	to, dst := c.t.Peers[i], c.t.PeerMACs[i]
	if c.pkt.hops >= MaxHops || to == c.t.Self || c.pkt.l3 != 14 || dst == [6]byte{} ||
		c.t.MTU > 0 && c.pkt.ipLen+EncapOverhead > c.t.MTU {
		return
	}
	src := c.mac
	in := frame
	if c.pkt.out != nil {
		in = c.pkt.out
	}
	out := make([]byte, len(in)+EncapOverhead)
	copy(out[0:6], dst[:])
	copy(out[6:12], src[:])
	binary.BigEndian.PutUint16(out[12:14], uint16(layers.EthernetTypeIPv4))
	proto := layers.IPProtocolIPv4
	if binary.BigEndian.Uint16(in[12:14]) == uint16(layers.EthernetTypeIPv6) {
		proto = layers.IPProtocolIPv6
	}
	OuterHeader(out[14:34], c.t.Self, to, proto, c.pkt.ipLen, c.pkt.hops+1)
	copy(out[34:], in[14:])
	c.pkt.out = out
	res.Verdict, res.Reason, res.Via, res.Second = Forward, NoReason, to, second
}

// OuterHeader writes into h (20 bytes) the IPv4 header a node puts before
// a packet of innerLen bytes it forwards to node to: IP-in-IP (proto IPv4)
// or IPv6-in-IPv4 (IPv6), don't fragment, TTL 64, the forwarding mark and
// the hop count in its id.
func OuterHeader(h []byte, from, to netip.Addr, proto layers.IPProtocol, innerLen int, hops uint8) {
	h[0], h[1] = 0x45, 0
	binary.BigEndian.PutUint16(h[2:4], uint16(innerLen+EncapOverhead))
	binary.BigEndian.PutUint16(h[4:6], fwdMark|uint16(hops))
	binary.BigEndian.PutUint16(h[6:8], 0x4000)
	h[8], h[9] = 64, byte(proto)
	h[10], h[11] = 0, 0
	f, t := from.As4(), to.As4()
	copy(h[12:16], f[:])
	copy(h[16:20], t[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(h[10:12], ^uint16(sum))
}

// decide is the verdict core both families share: the bucket of f's key,
// this node's state for it, the verdict, the fragment memory, and the MAC
// rewrite of an accepted frame.
func (c *Classifier) decide(frame []byte, f *flow, fr fragment) Result {
	bucket := f.key.Bucket(c.t.Config.Seed)
	res := Result{Rule: f.rule, Bucket: bucket}
	if st := c.t.States[f.rule]; st != nil {
		res.State = st[bucket]
	}
	if c.leaseExpired && (res.State == Owned || res.State == OwnedDirty) {
		res.State = Draining
	}
	var fwdTo netip.Addr
	fwdIdx := c.t.forwardTo(f.rule, bucket)
	if c.t.Forwarding() && fwdIdx != 0 {
		fwdTo = c.t.Peers[fwdIdx]
	}
	switch {
	case f.syn && !fr.first && !c.t.Routed && [6]byte(frame[0:6]) == c.mac:
		// Handed over by the bucket's previous owner (in routed mode every
		// frame comes to this node's MAC and none is): this node's while
		// its tables hold the bucket draining and pending (about to
		// acquire it), and it did not take the flooded copy (a request
		// socket) just before.
		res.Handed = true
		if c.leaseExpired || res.State != Draining || !c.t.pending(f.rule, bucket) || c.holds(f) {
			res.Verdict = Drop
		} else {
			res.Verdict = Accept
		}
	case f.syn && !fr.first && c.remapped[f.rule]:
		// Flows that Prev maps otherwise (Tables.Prev).
		res.Verdict, res.Reason = c.judge(f, res.State)
		if res.Verdict == Accept || res.Reason == DropDisabled || c.leaseExpired || !c.prevTakes(f) {
			break
		}
		if h := c.t.HandTo[f.rule]; h != nil && (h[bucket] == HandKeep || h[bucket] == HandPending) {
			res.Verdict, res.Reason = Accept, NoReason
		} else if to, ok := c.t.handTo(f.rule, bucket); ok && !c.t.Routed {
			res.Verdict, res.Reason, res.To = HandOver, NoReason, to
			copy(frame[0:6], to[:])
			copy(frame[6:12], c.mac[:])
		}
	default:
		res.Verdict, res.Reason = c.judge(f, res.State)
		if f.syn && !fr.first && !c.leaseExpired && !c.t.Routed && (res.Reason == DropNotOwned || res.Reason == DropDrainNoConn) {
			if to, ok := c.t.handTo(f.rule, bucket); ok {
				res.Verdict, res.Reason, res.To = HandOver, NoReason, to
				copy(frame[0:6], to[:])
				copy(frame[6:12], c.mac[:])
			}
		}
	}
	fv := fragVerdict{Result: res}
	if fwdTo.IsValid() && res.Verdict == Drop && res.Reason != DropDisabled {
		fv.to, fv.reason = fwdTo, res.Reason
	}
	if fr.first && c.remember {
		if c.frags == nil {
			c.frags = newFragMemory(FragEntries)
		}
		c.frags.put(fr.key, fv)
	}
	pending := res.State == Draining && c.t.pending(f.rule, bucket)
	switch {
	case fv.to.IsValid() && f.syn && !fr.first && c.pkt.from == fwdTo && pending && !c.leaseExpired:
		// Forwarded here by the node this one acquires the bucket from,
		// its forward target while pending: the hand-over.
		res.Handed, res.Verdict, res.Reason = true, Accept, NoReason
	case fv.to.IsValid():
		// What this node does not take goes to its owner or, from a
		// bucket it owns (acquired, or about to be), to a previous owner
		// that may hold the connection: the second chance.
		c.forward(frame, &res, fwdIdx, res.State == OwnedDirty || c.t.pending(f.rule, bucket))
	}
	if res.Verdict == Accept && !res.Handed {
		copy(frame[0:6], c.mac[:])
	}
	return res
}

// heartbeatOK reports whether a non-VIP IPv4 packet may pass: anything but
// UDP to this node's heartbeat socket from a stranger.
func (c *Classifier) heartbeatOK(ip []byte, dst netip.Addr) bool {
	if c.hbSelf.Port() == 0 || layers.IPProtocol(ip[9]) != layers.IPProtocolUDP {
		return true
	}
	if a := c.hbSelf.Addr(); a.IsValid() && !a.IsUnspecified() && a != dst {
		return true
	}
	if binary.BigEndian.Uint16(ip[6:8])&0x1fff != 0 {
		return true // a later fragment: no ports
	}
	ihl := int(ip[0]&0x0f) * 4
	if ihl < 20 || ihl > 60 || len(ip) < ihl+8 {
		return true
	}
	udp := ip[ihl:]
	if binary.BigEndian.Uint16(udp[2:4]) != c.hbSelf.Port() {
		return true
	}
	return c.hbPeers[netip.AddrPortFrom(addr4(ip[12:16]), binary.BigEndian.Uint16(udp[0:2]))]
}

func (c *Classifier) judge(f *flow, st BucketState) (Verdict, DropReason) {
	if r := c.t.Config.Rule(f.rule); r != nil && (r.Mode == ModeDisabled || r.State == RuleDisabled) {
		return Drop, DropDisabled
	}
	switch st {
	case Owned:
		return Accept, NoReason
	case OwnedDirty:
		if !f.tcp || f.syn || c.holds(f) {
			return Accept, NoReason
		}
		return Drop, DropDirtyNoConn
	case Draining:
		// A SYN opens a new connection, which is never this node's here,
		// even when it finds the TIME_WAIT socket of an old one on the same
		// ports (the kernel would take it as a new connection).
		if f.tcp && !f.syn && c.holds(f) {
			return Accept, NoReason
		}
		return Drop, DropDrainNoConn
	}
	return Drop, DropNotOwned
}

// prevTakes reports whether Prev's states take the SYN f: its rule and
// bucket under Prev's mapping.
func (c *Classifier) prevTakes(f *flow) bool {
	p := c.t.Prev
	id, ok := p.Config.Lookup(f.vip.Addr(), ProtoTCP, f.vip.Port())
	if !ok {
		return false
	}
	if r := p.Config.Rule(id); r != nil && (r.Mode == ModeDisabled || r.State == RuleDisabled) {
		return false
	}
	st := p.States[id]
	if st == nil {
		return false
	}
	k := keyFor(p.Config.Affinity(id), f.client.Addr(), f.client.Port())
	return st[k.Bucket(p.Config.Seed)].TakesSYNs()
}

// holds asks whether this node holds f's connection: a socket, or a valid
// SYN cookie for an ACK that finds none.
func (c *Classifier) holds(f *flow) bool {
	return c.conns.HoldsConn(f.client, f.vip) || f.fin && c.conns.TimeWait(f.client, f.vip) ||
		f.cookie && c.conns.ValidCookie(f.client, f.vip, f.seq, f.ack)
}

// saneIPv4 reports whether the IPv4 header of ip is one parse accepts.
func saneIPv4(ip []byte) bool {
	ihl := int(ip[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(ip[2:4]))
	return ip[0]>>4 == 4 && ihl >= 20 && total >= ihl && total <= len(ip)
}

// parse reads the flow of an IPv4 packet to VIP dst; ok is false when the
// packet is malformed.
func (c *Classifier) parse(ip []byte, dst netip.Addr) (f flow, ok bool) {
	if !saneIPv4(ip) {
		return f, false
	}
	ihl := int(ip[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(ip[2:4]))
	proto := layers.IPProtocol(ip[9])
	l4 := ip[ihl:total]
	if binary.BigEndian.Uint16(ip[6:8])&0x1fff != 0 { // a later fragment
		return c.noPorts(dst, protoOf(proto), addr4(ip[12:16])), true
	}
	switch proto {
	case layers.IPProtocolTCP, layers.IPProtocolUDP:
		return c.ports(l4, protoOf(proto), addr4(ip[12:16]), dst)
	case layers.IPProtocolICMPv4:
		if len(l4) < 8 {
			return f, false
		}
		switch layers.ICMPv4TypeCode(uint16(l4[0]) << 8).Type() {
		case layers.ICMPv4TypeDestinationUnreachable, layers.ICMPv4TypeTimeExceeded,
			layers.ICMPv4TypeParameterProblem:
			return c.parseEmbedded(l4[8:], addr4(ip[12:16]))
		}
	}
	f.rule, f.key = DefaultRule, keyFor(AffinitySingle, addr4(ip[12:16]), 0)
	return f, true
}

// parseEmbedded reads the flow of the packet an ICMP error quotes. The
// quoted packet went from a VIP to a client, so the client is its
// destination. An error quoting a packet not sent from a VIP is keyed like
// any other ICMP packet, by the sender (outerSrc).
func (c *Classifier) parseEmbedded(e []byte, outerSrc netip.Addr) (f flow, ok bool) {
	if len(e) < 20 {
		return f, false
	}
	ihl := int(e[0]&0x0f) * 4
	if e[0]>>4 != 4 || ihl < 20 || ihl > len(e) {
		return f, false
	}
	vip := addr4(e[12:16])
	if !c.isVIP(vip) {
		f.rule, f.key = DefaultRule, keyFor(AffinitySingle, outerSrc, 0)
		return f, true
	}
	later := binary.BigEndian.Uint16(e[6:8])&0x1fff != 0
	return c.quotedPorts(e, ihl, later, protoOf(layers.IPProtocol(e[9])), vip, addr4(e[16:20]))
}

// The readers below serve the IPv4 and the IPv6 parser alike (as l4_ports,
// quoted_ports and no_ports do in the C).

// ports reads the TCP or UDP header l4 of a packet from src to VIP dst:
// the rule by destination port, the key by the rule's affinity and, for
// TCP, the 4-tuple and flags; ok is false when the header is malformed.
func (c *Classifier) ports(l4 []byte, proto Protocol, src, dst netip.Addr) (f flow, ok bool) {
	if proto == ProtoTCP {
		if len(l4) < 20 {
			return f, false
		}
		if doff := int(l4[12]>>4) * 4; doff < 20 || doff > len(l4) {
			return f, false
		}
	} else if len(l4) < 8 {
		return f, false
	}
	cfg := c.t.Config
	sport := binary.BigEndian.Uint16(l4[0:2])
	dport := binary.BigEndian.Uint16(l4[2:4])
	f.rule, _ = cfg.Lookup(dst, proto, dport)
	f.key = keyFor(cfg.Affinity(f.rule), src, sport)
	if proto == ProtoTCP {
		f.tcp = true
		f.syn = l4[13]&0x12 == 0x02 // SYN without ACK
		f.fin = l4[13]&0x01 != 0
		f.cookie = l4[13]&0x16 == 0x10 // ACK without SYN or RST
		f.seq, f.ack = binary.BigEndian.Uint32(l4[4:8]), binary.BigEndian.Uint32(l4[8:12])
		f.client = netip.AddrPortFrom(src, sport)
		f.vip = netip.AddrPortFrom(dst, dport)
	}
	return f, true
}

// quotedPorts reads the flow of the packet e an ICMP error quotes, from
// vip to client: from its transport header (proto, at off) unless it is a
// later fragment; ok is false when the quote stops before the ports.
func (c *Classifier) quotedPorts(e []byte, off int, later bool, proto Protocol, vip, client netip.Addr) (f flow, ok bool) {
	if later || proto == 0 {
		return c.noPorts(vip, proto, client), true
	}
	if len(e) < off+4 {
		return f, false
	}
	cfg := c.t.Config
	vport := binary.BigEndian.Uint16(e[off : off+2])
	cport := binary.BigEndian.Uint16(e[off+2 : off+4])
	f.rule, _ = cfg.Lookup(vip, proto, vport)
	f.key = keyFor(cfg.Affinity(f.rule), client, cport)
	if proto == ProtoTCP {
		f.tcp = true
		f.client = netip.AddrPortFrom(client, cport)
		f.vip = netip.AddrPortFrom(vip, vport)
	}
	return f, true
}

// noPorts is the flow of a packet to vip whose ports are not known (a
// later fragment, or a protocol without ports, proto 0): the rule for port
// 0 of its protocol (the default rule without one) and the client address
// alone, as every node judges it alike.
func (c *Classifier) noPorts(vip netip.Addr, proto Protocol, client netip.Addr) flow {
	f := flow{rule: DefaultRule, key: keyFor(AffinitySingle, client, 0)}
	if proto != 0 {
		f.rule, _ = c.t.Config.Lookup(vip, proto, 0)
	}
	return f
}

func (c *Classifier) isVIP(a netip.Addr) bool {
	for _, v := range c.t.Config.VIPs {
		if v == a {
			return true
		}
	}
	return false
}

func protoOf(p layers.IPProtocol) Protocol {
	switch p {
	case layers.IPProtocolTCP:
		return ProtoTCP
	case layers.IPProtocolUDP:
		return ProtoUDP
	}
	return 0
}

func addr4(b []byte) netip.Addr { return netip.AddrFrom4([4]byte(b)) }

// fragKey names a datagram, as the XDP program's fragment LRU does: an
// IPv4 datagram by source, destination, protocol and 16-bit IP id, an IPv6
// one by source, destination, the fragment header's next header and its
// 32-bit identification.
type fragKey struct {
	src, dst netip.Addr
	id       uint32
	proto    uint8
}

// fragMemory is an exact LRU of first-fragment verdicts, the model of the
// program's BPF_MAP_TYPE_LRU_HASH (whose eviction is only approximately
// least-recently-used: tests stay below its capacity). It allocates only
// when it is created.
type fragMemory struct {
	idx        map[fragKey]int32
	keys       []fragKey
	vals       []fragVerdict
	prev, next []int32 // the recency list through slots; head is the newest
	head, tail int32
}

// fragVerdict is what the memory keeps of a first fragment: its verdict
// and, when this node did not take it, the node it was forwarded to (or
// would have been) and why it was not taken, for the later fragments.
type fragVerdict struct {
	Result
	to     netip.Addr
	reason DropReason
}

func newFragMemory(n int) *fragMemory {
	m := &fragMemory{idx: make(map[fragKey]int32, n), keys: make([]fragKey, 0, n), vals: make([]fragVerdict, 0, n),
		prev: make([]int32, 0, n), next: make([]int32, 0, n), head: -1, tail: -1}
	return m
}

func (m *fragMemory) unlink(i int32) {
	if p := m.prev[i]; p >= 0 {
		m.next[p] = m.next[i]
	} else {
		m.head = m.next[i]
	}
	if n := m.next[i]; n >= 0 {
		m.prev[n] = m.prev[i]
	} else {
		m.tail = m.prev[i]
	}
}

func (m *fragMemory) pushFront(i int32) {
	m.prev[i], m.next[i] = -1, m.head
	if m.head >= 0 {
		m.prev[m.head] = i
	}
	m.head = i
	if m.tail < 0 {
		m.tail = i
	}
}

func (m *fragMemory) get(k fragKey) (fragVerdict, bool) {
	i, ok := m.idx[k]
	if !ok {
		return fragVerdict{}, false
	}
	m.unlink(i)
	m.pushFront(i)
	return m.vals[i], true
}

func (m *fragMemory) put(k fragKey, r fragVerdict) {
	if i, ok := m.idx[k]; ok {
		m.vals[i] = r
		m.unlink(i)
		m.pushFront(i)
		return
	}
	var i int32
	if len(m.keys) < cap(m.keys) {
		i = int32(len(m.keys))
		m.keys, m.vals = append(m.keys, k), append(m.vals, r)
		m.prev, m.next = append(m.prev, -1), append(m.next, -1)
	} else {
		i = m.tail
		m.unlink(i)
		delete(m.idx, m.keys[i])
		m.keys[i], m.vals[i] = k, r
	}
	m.idx[k] = i
	m.pushFront(i)
}
