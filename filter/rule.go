package filter

import (
	"fmt"
	"net/netip"
	"strings"
)

// RuleID identifies a port rule for the lifetime of the cluster. DefaultRule
// (0) is the implicit rule for VIP traffic that no port rule covers.
type RuleID uint32

// DefaultRule is the implicit rule that takes VIP traffic on ports no port
// rule covers; it is owned by the default host (lowest host priority).
const DefaultRule RuleID = 0

// NodeID identifies a node. Zero means "no node".
type NodeID uint32

// NoNode is the owner of a bucket that no node may accept.
const NoNode NodeID = 0

// Protocol is the transport protocol a rule covers.
type Protocol uint8

// Protocols a rule can cover.
const (
	ProtoTCP  Protocol = 1
	ProtoUDP  Protocol = 2
	ProtoBoth Protocol = ProtoTCP | ProtoUDP
)

// Mode is a port rule's filtering mode.
type Mode uint8

// Filtering modes, as NLB names them.
const (
	ModeMultiple Mode = iota // buckets spread over nodes by weight
	ModeSingle               // all traffic to the lowest handling priority
	ModeDisabled             // no node accepts
)

// Affinity selects which packet fields form the flow key.
type Affinity uint8

// Affinities, as NLB names them.
const (
	AffinityNone    Affinity = iota // client IP and client port
	AffinitySingle                  // client IP
	AffinityNetwork                 // client IPv4 /24 or IPv6 /64
)

// RuleState is the administrative state of a rule on one node.
type RuleState uint8

// Rule states: enabled takes traffic, draining finishes existing connections
// and takes no new ones, disabled takes nothing.
const (
	RuleEnabled RuleState = iota
	RuleDraining
	RuleDisabled
)

// Rule is a port rule: which VIP traffic it covers and how it is spread.
type Rule struct {
	ID       RuleID
	VIP      netip.Addr // the zero Addr covers every VIP
	PortLo   uint16
	PortHi   uint16
	Proto    Protocol
	Mode     Mode
	Affinity Affinity
	State    RuleState // cluster-wide state; a node's own state may be stricter
}

// Covers reports whether the rule covers traffic to vip on proto and port.
func (r *Rule) Covers(vip netip.Addr, proto Protocol, port uint16) bool {
	return (!r.VIP.IsValid() || r.VIP == vip) && r.Proto&proto != 0 &&
		port >= r.PortLo && port <= r.PortHi
}

// Overlaps reports whether two rules could both cover one packet on the same
// VIP scope, which rule validation forbids.
func (r *Rule) Overlaps(o *Rule) bool {
	return r.VIP == o.VIP && r.Proto&o.Proto != 0 &&
		r.PortLo <= o.PortHi && o.PortLo <= r.PortHi
}

// Validate checks the rule's own fields.
func (r *Rule) Validate() error {
	if r.VIP.IsValid() {
		if err := checkFamily(r.VIP); err != nil {
			return fmt.Errorf("rule vip %w", err)
		}
	}
	switch {
	case r.ID == DefaultRule:
		return fmt.Errorf("rule id 0 is reserved for the default rule")
	case r.PortLo > r.PortHi:
		return fmt.Errorf("rule port range %d-%d: start is after end", r.PortLo, r.PortHi)
	case r.Proto == 0 || r.Proto > ProtoBoth:
		return fmt.Errorf("rule protocol %d: want tcp, udp or both", r.Proto)
	case r.Mode > ModeDisabled:
		return fmt.Errorf("rule mode %d: want multiple, single or disabled", r.Mode)
	case r.Affinity > AffinityNetwork:
		return fmt.Errorf("rule affinity %d: want none, single or network", r.Affinity)
	case r.State > RuleDisabled:
		return fmt.Errorf("rule state %d: want enabled, draining or disabled", r.State)
	}
	return nil
}

func (p Protocol) String() string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoBoth:
		return "both"
	}
	return fmt.Sprintf("proto(%d)", uint8(p))
}

func (m Mode) String() string {
	switch m {
	case ModeMultiple:
		return "multiple"
	case ModeSingle:
		return "single"
	case ModeDisabled:
		return "disabled"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

func (a Affinity) String() string {
	switch a {
	case AffinityNone:
		return "none"
	case AffinitySingle:
		return "single"
	case AffinityNetwork:
		return "network"
	}
	return fmt.Sprintf("affinity(%d)", uint8(a))
}

func (s RuleState) String() string {
	switch s {
	case RuleEnabled:
		return "enabled"
	case RuleDraining:
		return "draining"
	case RuleDisabled:
		return "disabled"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// ParseProtocol parses "tcp", "udp" or "both".
func ParseProtocol(s string) (Protocol, error) {
	switch strings.ToLower(s) {
	case "tcp":
		return ProtoTCP, nil
	case "udp":
		return ProtoUDP, nil
	case "both":
		return ProtoBoth, nil
	}
	return 0, fmt.Errorf("protocol %q: want tcp, udp or both", s)
}

// ParseMode parses "multiple", "single" or "disabled".
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(s) {
	case "multiple":
		return ModeMultiple, nil
	case "single":
		return ModeSingle, nil
	case "disabled":
		return ModeDisabled, nil
	}
	return 0, fmt.Errorf("mode %q: want multiple, single or disabled", s)
}

// ParseAffinity parses "none", "single" or "network".
func ParseAffinity(s string) (Affinity, error) {
	switch strings.ToLower(s) {
	case "none":
		return AffinityNone, nil
	case "single":
		return AffinitySingle, nil
	case "network":
		return AffinityNetwork, nil
	}
	return 0, fmt.Errorf("affinity %q: want none, single or network", s)
}

// ParseRuleState parses "enabled", "draining" or "disabled".
func ParseRuleState(s string) (RuleState, error) {
	switch strings.ToLower(s) {
	case "enabled", "enable":
		return RuleEnabled, nil
	case "draining", "drain":
		return RuleDraining, nil
	case "disabled", "disable":
		return RuleDisabled, nil
	}
	return 0, fmt.Errorf("rule state %q: want enabled, draining or disabled", s)
}
