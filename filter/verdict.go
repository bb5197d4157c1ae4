package filter

import (
	"fmt"
	"net/netip"
)

// Verdict is what the data plane does with a frame.
type Verdict uint8

// Verdicts. Their values are not XDP action codes; use XDPAction for those.
const (
	// Pass: not VIP traffic (another address, ARP, Neighbor Discovery,
	// unparsable); the frame goes to the kernel untouched.
	Pass Verdict = iota
	// Accept: VIP traffic this node owns; the destination MAC is rewritten
	// to the interface's MAC and the frame goes to the kernel.
	Accept
	// Drop: VIP traffic this node must not take.
	Drop
	// HandOver: a SYN in a bucket this node released, whose new owner has
	// not taken it yet (Tables.HandTo): the frame goes back out to the new
	// owner's MAC (Result.To), with this node's MAC as its source, and the
	// new owner takes it (a SYN to a node's own MAC is that node's).
	HandOver
	// Forward: routed mode, VIP traffic this node does not take: the
	// packet goes, encapsulated, to the node its bucket's forward target
	// names (Result.Via), to its owner or, from a bucket this node owns,
	// to a previous owner that may hold its connection (Result.Second).
	Forward
)

// XDP action codes, as the kernel defines them.
const (
	xdpDrop = 1
	xdpPass = 2
	xdpTx   = 3
)

// XDP_TX: a forwarded packet leaves by the interface it came in by.

// XDPAction returns the XDP action code the program returns for v.
func (v Verdict) XDPAction() uint32 {
	switch v {
	case Drop:
		return xdpDrop
	case HandOver, Forward:
		return xdpTx
	}
	return xdpPass
}

func (v Verdict) String() string {
	switch v {
	case Pass:
		return "pass"
	case Accept:
		return "accept"
	case Drop:
		return "drop"
	case HandOver:
		return "hand-over"
	case Forward:
		return "forward"
	}
	return fmt.Sprintf("verdict(%d)", uint8(v))
}

// DropReason says why VIP traffic was dropped. The values index the
// per-rule drop counters of the XDP program (filter/xdp/shoal.c).
type DropReason uint8

// Drop reasons.
const (
	NoReason        DropReason = iota // not dropped
	DropNotOwned                      // bucket is NotOwned
	DropDirtyNoConn                   // OwnedDirty bucket, TCP non-SYN with no local connection
	DropDrainNoConn                   // Draining bucket, no local connection (always for UDP and other traffic)
	DropDisabled                      // the rule is disabled cluster-wide
	DropMalformed                     // VIP traffic with a broken IPv4, IPv6, TCP, UDP or ICMP header
	NumDropReasons                    // number of per-rule reasons, NoReason included

	// DropNotPeer: UDP to this node's heartbeat socket from an address that
	// is not a registered peer's. It is not VIP traffic and is counted apart
	// from the rules ((*XDP).HeartbeatDrops).
	DropNotPeer = NumDropReasons
	// DropForeign: a packet forwarded to this node (routed mode) from an
	// address that is no member's, or carrying no VIP traffic. Counted
	// apart from the rules ((*XDP).ForwardCounters).
	DropForeign = NumDropReasons + 1
)

func (r DropReason) String() string {
	switch r {
	case NoReason:
		return "none"
	case DropNotOwned:
		return "not-owned"
	case DropDirtyNoConn:
		return "dirty-no-conn"
	case DropDrainNoConn:
		return "draining-no-conn"
	case DropDisabled:
		return "disabled"
	case DropMalformed:
		return "malformed"
	case DropNotPeer:
		return "not-peer"
	case DropForeign:
		return "foreign"
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Result is the data plane's judgement of one frame. Rule, Bucket and State
// are set for Accept and for Drop (a malformed frame counts under
// DefaultRule with bucket 0).
type Result struct {
	Verdict Verdict
	Reason  DropReason
	Rule    RuleID
	Bucket  uint16
	State   BucketState
	To      [6]byte // HandOver: the MAC the frame goes to
	// Handed: a SYN another node handed over to this one (addressed to its
	// MAC): Accept while this node's tables hold the bucket draining
	// (about to acquire it), Drop otherwise (it took the flooded copy, the
	// bucket is not its own, or its lease ended).
	// Counted apart from the frames the client sent.
	Handed bool
	// Via: Forward's target. Second: it is a previous owner of the
	// bucket, which may hold the connection (the second chance).
	Via    netip.Addr
	Second bool
	// From: the member that forwarded the frame here (routed mode), with
	// Hops the hops it made; the zero Addr for a frame from the network.
	From netip.Addr
	Hops uint8
}

// RuleCounters counts the VIP packets one rule's buckets judged.
type RuleCounters struct {
	Accepted      uint64
	Dropped       [NumDropReasons]uint64 // indexed by DropReason; NoReason stays 0
	HandedOver    uint64                 // SYNs handed over to their bucket's new owner
	HandedIn      uint64                 // SYNs handed over to this node, taken
	HandedRefused uint64                 // SYNs handed over to this node, dropped (taken already, or the lease ended)
	Forwarded     uint64                 // forwarded to another node (routed mode)
}

// Counters holds packet counts by rule. Pass verdicts are not counted.
type Counters map[RuleID]RuleCounters

// Count adds one judgement to the counters, as the XDP program does:
// VIP traffic only.
func (c Counters) Count(r Result) {
	if r.Verdict == Pass || r.Reason >= NumDropReasons {
		return
	}
	rc := c[r.Rule]
	switch {
	case r.Handed && r.Verdict == Accept:
		rc.HandedIn++
	case r.Handed:
		rc.HandedRefused++
	case r.Verdict == Accept:
		rc.Accepted++
	case r.Verdict == HandOver:
		rc.HandedOver++
	case r.Verdict == Forward:
		rc.Forwarded++
	default:
		rc.Dropped[r.Reason]++
	}
	c[r.Rule] = rc
}
