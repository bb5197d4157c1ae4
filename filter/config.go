package filter

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
)

// DefaultWeight is a node's load weight on a rule when none is set (NLB's
// "equal" weight).
const DefaultWeight = 50

// MaxWeight is the largest load weight.
const MaxWeight = 100

// Config is everything the ownership function needs that Raft replicates:
// the hash seed, the VIPs, the port rules and the node registry.
type Config struct {
	Seed  uint32
	VIPs  []netip.Addr
	Rules []Rule // user rules, sorted by ID; DefaultRule is implicit
	Nodes []Node // the node registry, sorted by ID
}

// Node is a registered node's settings that ownership depends on.
type Node struct {
	ID           NodeID
	HostPriority int // 1..64, unique; the lowest eligible is the default host
	// Rules holds the node's per-rule settings; a rule missing here gets
	// DefaultWeight, the host priority as handling priority, and RuleEnabled.
	Rules map[RuleID]NodeRule
}

// NodeRule is one node's settings for one rule.
type NodeRule struct {
	Weight           int // 0..100; 0 takes no new connections
	HandlingPriority int // single-host mode: the lowest eligible wins
	State            RuleState
}

// RuleOf returns the node's settings for rule id, with defaults filled in.
func (n *Node) RuleOf(id RuleID) NodeRule {
	if nr, ok := n.Rules[id]; ok {
		if nr.HandlingPriority == 0 {
			nr.HandlingPriority = n.HostPriority
		}
		return nr
	}
	return NodeRule{Weight: DefaultWeight, HandlingPriority: n.HostPriority}
}

// Node returns the registered node with id, or nil.
func (c *Config) Node(id NodeID) *Node {
	i, ok := slices.BinarySearchFunc(c.Nodes, id, func(n Node, id NodeID) int { return cmp.Compare(n.ID, id) })
	if !ok {
		return nil
	}
	return &c.Nodes[i]
}

// Rule returns the rule with id, or nil. DefaultRule has no Rule value.
func (c *Config) Rule(id RuleID) *Rule {
	i, ok := slices.BinarySearchFunc(c.Rules, id, func(r Rule, id RuleID) int { return cmp.Compare(r.ID, id) })
	if !ok {
		return nil
	}
	return &c.Rules[i]
}

// Validate checks that the configuration is one the ownership function and
// the data plane can use: sorted unique ids, valid rules, no overlapping
// rules, valid weights and priorities.
func (c *Config) Validate() error {
	for i, v := range c.VIPs {
		if err := checkFamily(v); err != nil {
			return fmt.Errorf("vip %w", err)
		}
		if slices.Contains(c.VIPs[:i], v) {
			return fmt.Errorf("vip %s listed twice", v)
		}
	}
	for i := range c.Rules {
		r := &c.Rules[i]
		if err := r.Validate(); err != nil {
			return fmt.Errorf("rule %d: %w", r.ID, err)
		}
		if i > 0 && c.Rules[i-1].ID >= r.ID {
			return fmt.Errorf("rule %d: rules must be sorted by unique id", r.ID)
		}
		for j := range c.Rules[:i] {
			if r.Overlaps(&c.Rules[j]) {
				return fmt.Errorf("rule %d overlaps rule %d", r.ID, c.Rules[j].ID)
			}
		}
	}
	prios := map[int]NodeID{}
	for i := range c.Nodes {
		n := &c.Nodes[i]
		if n.ID == NoNode {
			return fmt.Errorf("node id 0 is reserved")
		}
		if i > 0 && c.Nodes[i-1].ID >= n.ID {
			return fmt.Errorf("node %d: nodes must be sorted by unique id", n.ID)
		}
		if other, dup := prios[n.HostPriority]; dup {
			return fmt.Errorf("nodes %d and %d share host priority %d", other, n.ID, n.HostPriority)
		}
		prios[n.HostPriority] = n.ID
		for id, nr := range n.Rules {
			if nr.Weight < 0 || nr.Weight > MaxWeight {
				return fmt.Errorf("node %d rule %d: weight %d is outside 0-100", n.ID, id, nr.Weight)
			}
			if nr.State > RuleDisabled {
				return fmt.Errorf("node %d rule %d: invalid state %d", n.ID, id, nr.State)
			}
		}
	}
	return nil
}

// checkFamily accepts a VIP that is IPv4 or IPv6, without a zone and not
// an IPv4-mapped IPv6 address (which would be a second name for an IPv4
// VIP that packets never carry).
func checkFamily(v netip.Addr) error {
	switch {
	case v.Zone() != "":
		return fmt.Errorf("%s: a VIP has no zone", v)
	case v.Is4In6():
		return fmt.Errorf("%s: an IPv4-mapped address; use %s", v, v.Unmap())
	}
	return nil
}

// Lookup returns the rule covering traffic to vip on proto and port: a rule
// for that VIP first, then a rule for every VIP, else DefaultRule. ok is
// false when vip is not one of the cluster's VIPs.
func (c *Config) Lookup(vip netip.Addr, proto Protocol, port uint16) (id RuleID, ok bool) {
	if !slices.Contains(c.VIPs, vip) {
		return DefaultRule, false
	}
	var wildcard RuleID
	for i := range c.Rules {
		r := &c.Rules[i]
		if !r.Covers(vip, proto, port) {
			continue
		}
		if r.VIP.IsValid() {
			return r.ID, true
		}
		if wildcard == DefaultRule {
			wildcard = r.ID
		}
	}
	return wildcard, true
}

// Affinity returns the affinity of rule id; DefaultRule uses single affinity.
func (c *Config) Affinity(id RuleID) Affinity {
	if r := c.Rule(id); r != nil {
		return r.Affinity
	}
	return AffinitySingle
}

// RuleIDs returns DefaultRule followed by every rule's id.
func (c *Config) RuleIDs() []RuleID {
	ids := make([]RuleID, 0, len(c.Rules)+1)
	ids = append(ids, DefaultRule)
	for _, r := range c.Rules {
		ids = append(ids, r.ID)
	}
	return ids
}
