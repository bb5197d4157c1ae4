package config

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// BGP is how a node announces the VIPs to its routers in routed mode
// (`shoal settings set --mac-mode routed`): an embedded BGP speaker that
// opens sessions to Neighbors and announces each VIP (/32, /128) with this
// node's address as next hop while the node is eligible. Empty (no
// neighbors): the node cannot take part in routed mode.
type BGP struct {
	ASN      uint32     `yaml:"asn"`       // this node's AS number
	RouterID netip.Addr `yaml:"router_id"` // default: the IPv4 address of heartbeat_addr
	// NextHop and NextHop6 are the addresses announced as the VIPs' next
	// hops (IPv4, IPv6); default: the address of heartbeat_addr, and none
	// for IPv6 (IPv6 VIPs are then not announced).
	NextHop     netip.Addr    `yaml:"next_hop"`
	NextHop6    netip.Addr    `yaml:"next_hop6"`
	Communities []string      `yaml:"communities"` // "ASN:value", attached to every announcement
	Neighbors   []BGPNeighbor `yaml:"neighbors"`
	// NoForward turns forwarding off: the node keeps every packet the
	// routers send it, as plain ECMP does, and every change of the
	// routers' next hops breaks the connections it moves. For comparisons
	// only, and on every node alike (docs/ROUTED.md).
	NoForward bool `yaml:"no_forward"`
}

// BGPNeighbor is one router the node peers with.
type BGPNeighbor struct {
	Address  netip.Addr `yaml:"address"`
	ASN      uint32     `yaml:"asn"`
	Password string     `yaml:"password"` // TCP MD5 (RFC 2385); empty: none
	// HoldTime and Keepalive are the BGP timers (defaults 9s and 3s; a
	// hold time of at least 3s, keepalive at most a third of it).
	HoldTime  time.Duration `yaml:"hold_time"`
	Keepalive time.Duration `yaml:"keepalive"`
	// MultihopTTL allows a neighbour that many hops away (eBGP multihop);
	// 0: directly connected.
	MultihopTTL uint8 `yaml:"multihop_ttl"`
	// BFD runs BFD (RFC 5880/5881, single hop) to the neighbour, so that it
	// drops this node's routes within Interval x Multiplier of its death.
	BFD BGPBFD `yaml:"bfd"`
}

// BGPBFD is a neighbour's BFD session. The router declares this node dead
// after Multiplier x Interval without its packets; this node declares the
// router dead after Multiplier x ReceiveInterval. ReceiveInterval is kept
// above a third of a second by default because a router whose session is
// not up yet sends at most once a second (RFC 5880 6.8.3, FRR's bfdd): a
// shorter detection time here would tear the BGP session down before BFD
// ever comes up.
type BGPBFD struct {
	Enabled         bool          `yaml:"enabled"`
	Interval        time.Duration `yaml:"interval"`         // how often this node sends, default 300ms
	ReceiveInterval time.Duration `yaml:"receive_interval"` // how often it asks the router to send, default max(interval, 400ms)
	Multiplier      uint32        `yaml:"multiplier"`       // packets missed before down, default 3
}

// Configured reports whether the node has a BGP speaker to start.
func (b *BGP) Configured() bool { return len(b.Neighbors) > 0 }

// ParseCommunity parses a standard community "ASN:value" (each 0-65535).
func ParseCommunity(s string) (uint32, error) {
	hi, lo, ok := strings.Cut(s, ":")
	a, err1 := strconv.ParseUint(hi, 10, 16)
	v, err2 := strconv.ParseUint(lo, 10, 16)
	if !ok || err1 != nil || err2 != nil {
		return 0, fmt.Errorf("%q: want ASN:value, each 0-65535", s)
	}
	return uint32(a)<<16 | uint32(v), nil
}

// validateBGP fills the BGP defaults and checks the section; heartbeat is
// the node's heartbeat address, the default router ID and next hop.
func (b *BGP) validate(heartbeat string, bad func(field, format string, a ...any)) {
	if !b.Configured() {
		if b.ASN != 0 || len(b.Communities) > 0 || b.RouterID.IsValid() || b.NextHop.IsValid() || b.NextHop6.IsValid() {
			bad("bgp.neighbors", "at least one neighbour is needed for the rest of the bgp section to mean anything")
		}
		return
	}
	self := netip.Addr{}
	if ap, err := netip.ParseAddrPort(heartbeat); err == nil {
		self = ap.Addr().Unmap()
	}
	if b.ASN == 0 {
		bad("bgp.asn", "required: this node's AS number (1-4294967295)")
	}
	if !b.RouterID.IsValid() && self.Is4() {
		b.RouterID = self
	}
	if !b.RouterID.Is4() {
		bad("bgp.router_id", "want an IPv4 address (default: the IPv4 address of heartbeat_addr)")
	}
	if !b.NextHop.IsValid() && self.Is4() {
		b.NextHop = self
	}
	if b.NextHop.IsValid() && (!b.NextHop.Is4() || b.NextHop.IsUnspecified()) {
		bad("bgp.next_hop", "%s: want this node's IPv4 address", b.NextHop)
	}
	if b.NextHop6.IsValid() && (!b.NextHop6.Is6() || b.NextHop6.Is4In6() || b.NextHop6.IsUnspecified()) {
		bad("bgp.next_hop6", "%s: want this node's IPv6 address", b.NextHop6)
	}
	if !b.NextHop.IsValid() && !b.NextHop6.IsValid() {
		bad("bgp.next_hop", "required when heartbeat_addr is not IPv4: the address the routers forward the VIPs to")
	}
	for i, c := range b.Communities {
		if _, err := ParseCommunity(c); err != nil {
			bad(fmt.Sprintf("bgp.communities[%d]", i), "%v", err)
		}
	}
	seen := map[netip.Addr]bool{}
	for i := range b.Neighbors {
		n := &b.Neighbors[i]
		f := func(name string) string { return fmt.Sprintf("bgp.neighbors[%d].%s", i, name) }
		if !n.Address.IsValid() || n.Address.IsUnspecified() || n.Address.IsMulticast() {
			bad(f("address"), "required: the router's address")
		} else if seen[n.Address] {
			bad(f("address"), "%s is listed twice", n.Address)
		}
		seen[n.Address] = true
		if n.ASN == 0 {
			bad(f("asn"), "required: the router's AS number")
		}
		if len(n.Password) > 80 {
			bad(f("password"), "at most 80 characters (TCP MD5 keys)")
		}
		if n.HoldTime == 0 {
			n.HoldTime = 9 * time.Second
		}
		if n.Keepalive == 0 {
			n.Keepalive = n.HoldTime / 3
		}
		if n.HoldTime < 3*time.Second || n.HoldTime > 65535*time.Second || n.HoldTime%time.Second != 0 {
			bad(f("hold_time"), "%s: want whole seconds, 3s to 65535s (RFC 4271)", n.HoldTime)
		}
		if n.Keepalive < time.Second || n.Keepalive > n.HoldTime/3 || n.Keepalive%time.Second != 0 {
			bad(f("keepalive"), "%s: want whole seconds, 1s to a third of hold_time", n.Keepalive)
		}
		if n.BFD.Enabled {
			if n.BFD.Interval == 0 {
				n.BFD.Interval = 300 * time.Millisecond
			}
			if n.BFD.Multiplier == 0 {
				n.BFD.Multiplier = 3
			}
			if n.BFD.ReceiveInterval == 0 {
				n.BFD.ReceiveInterval = max(n.BFD.Interval, 400*time.Millisecond)
			}
			if n.BFD.Interval < 10*time.Millisecond || n.BFD.Interval > 10*time.Second {
				bad(f("bfd.interval"), "%s: want 10ms to 10s", n.BFD.Interval)
			}
			if n.BFD.ReceiveInterval < 10*time.Millisecond || n.BFD.ReceiveInterval > 10*time.Second {
				bad(f("bfd.receive_interval"), "%s: want 10ms to 10s", n.BFD.ReceiveInterval)
			}
			if n.BFD.Multiplier > 255 {
				bad(f("bfd.multiplier"), "%d: want 1 to 255", n.BFD.Multiplier)
			}
			if n.MultihopTTL > 1 {
				bad(f("bfd"), "single-hop BFD only: a multihop neighbour cannot run it")
			}
		}
	}
}
