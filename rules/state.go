package rules

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/shoalnet/shoal/filter"
)

// Defaults for the heartbeat settings a new cluster starts with when the
// bootstrapping node names none (the agent passes heartbeat's defaults).
const (
	DefaultHeartbeatPeriod    = 75 * time.Millisecond
	DefaultHeartbeatTolerance = 12
)

// MaxHostPriority is the largest host or handling priority; it also bounds
// the number of registered nodes, as host priorities are unique. NLB's 32
// is the limit while any registered node runs a shoal below
// bigClusterLevel (State.MaxPriority): such a replica refuses priorities
// above 32, and would diverge from the others.
const (
	MaxHostPriority   = 64
	legacyMaxPriority = 32
	bigClusterLevel   = 5
)

// Settings are the cluster-wide settings.
type Settings struct {
	ClusterID          uint32        // random at bootstrap; heartbeats carry it
	HashSeed           uint32        // seeds the ownership hash
	HeartbeatPeriod    time.Duration // P: one heartbeat per period
	HeartbeatTolerance int           // T: periods without a heartbeat before a peer is dead
	// MACMode is the cluster MAC the VIPs resolve to; "" is MACMulticast
	// (omitted, so a state without it encodes as an older shoal wrote it).
	MACMode MACMode `json:",omitempty"`
}

// NodeInfo is what a node says about itself when it registers or joins.
type NodeInfo struct {
	Name          string // unique in the cluster; also the Raft server ID
	HostPriority  int    // 1..64 (1..32 in a cluster not all at level 5), unique; 0 asks for the lowest free one
	HeartbeatAddr string // host:port of the heartbeat UDP socket
	RaftAddr      string // host:port of the Raft TCP transport
	APIAddr       string // host:port of the authenticated peer API
	// CommandLevel is the highest command level the node's shoal applies;
	// 0 stands for 1 (and is what nodes at level 1 send, so older
	// replicas, which do not know the field, still decode the entry).
	CommandLevel int `json:",omitempty"`
	// Zone names where the node is (a rack, a room): the Raft voters are
	// spread over zones, so that one lost zone takes as few as can be.
	// Empty: no zone. Registered at command level 4.
	Zone string `json:",omitempty"`
}

// level returns the command level the node reports.
func (ni *NodeInfo) level() int { return max(1, ni.CommandLevel) }

// MaxPriority is the largest host or handling priority, and so the number
// of nodes, the cluster takes now: MaxHostPriority once every registered
// node reports command level 5, NLB's 32 before. Every replica decides it
// from the same replicated registry, so all apply a registration alike.
func (s *State) MaxPriority() int {
	if s.legacyMember() != nil {
		return legacyMaxPriority
	}
	return MaxHostPriority
}

// legacyMember is the first registered node below bigClusterLevel, or nil.
func (s *State) legacyMember() *Node { return s.below(bigClusterLevel) }

// below is the first registered node below command level level, or nil.
func (s *State) below(level int) *Node {
	for i := range s.Nodes {
		if s.Nodes[i].level() < level {
			return &s.Nodes[i]
		}
	}
	return nil
}

// Speaks reports whether every registered node reports command level
// level or above.
func (s *State) Speaks(level int) bool { return s.below(level) == nil }

// CheckSupported returns ErrUnsupported unless every registered node
// reports the command level cmd's type needs.
func (s *State) CheckSupported(cmd Command) error {
	need := max(1, commandSince[cmd.Type()])
	if m, ok := cmd.(*SetMACMode); ok && m.Mode == MACRouted {
		need = max(need, 3) // a member below level 3 would refuse the mode and diverge
	}
	if w, ok := cmd.(*SetWeight); ok && (len(w.Rules) > 0 || len(w.Nodes) > 0) {
		need = max(need, listedWeightLevel)
	}
	if r, ok := cmd.(*RegisterNode); ok && r.Info.Zone != "" {
		need = max(need, zoneLevel)
	}
	if n := s.below(need); n != nil {
		return fmt.Errorf("%w: command type %d needs command level %d on every member, and node %d (%s) runs a shoal at level %d; upgrade every node first", ErrUnsupported, cmd.Type(), need, n.ID, n.Name, n.level())
	}
	return nil
}

// Node is one entry of the node registry.
type Node struct {
	ID filter.NodeID
	NodeInfo
	Admin AdminState
	// Rules holds the node's settings for rules where they differ from the
	// defaults (filter.DefaultWeight, handling priority = host priority,
	// enabled). HandlingPriority 0 means "the host priority".
	Rules map[filter.RuleID]filter.NodeRule
}

// State is the whole replicated configuration as of Raft log index Index.
// Every slice is sorted (VIPs by address, Rules and Nodes by ID).
type State struct {
	Index      uint64 // the Raft index of the last command applied
	Settings   Settings
	VIPs       []netip.Addr
	Rules      []filter.Rule
	Nodes      []Node
	LastRuleID filter.RuleID // rule ids are never reused
	LastNodeID filter.NodeID // node ids are never reused
}

// Clone returns a deep copy of s.
func (s *State) Clone() *State {
	c := *s
	c.VIPs = slices.Clone(s.VIPs)
	c.Rules = slices.Clone(s.Rules)
	c.Nodes = slices.Clone(s.Nodes)
	for i := range c.Nodes {
		c.Nodes[i].Rules = maps.Clone(c.Nodes[i].Rules)
	}
	return &c
}

// Node returns the registered node with id, or nil.
func (s *State) Node(id filter.NodeID) *Node {
	i, ok := slices.BinarySearchFunc(s.Nodes, id, func(n Node, id filter.NodeID) int { return cmpU(uint32(n.ID), uint32(id)) })
	if !ok {
		return nil
	}
	return &s.Nodes[i]
}

// NodeByName returns the registered node called name, or nil.
func (s *State) NodeByName(name string) *Node {
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			return &s.Nodes[i]
		}
	}
	return nil
}

// Rule returns the rule with id, or nil.
func (s *State) Rule(id filter.RuleID) *filter.Rule {
	i, ok := slices.BinarySearchFunc(s.Rules, id, func(r filter.Rule, id filter.RuleID) int { return cmpU(uint32(r.ID), uint32(id)) })
	if !ok {
		return nil
	}
	return &s.Rules[i]
}

// HasVIP reports whether vip is one of the cluster's VIPs.
func (s *State) HasVIP(vip netip.Addr) bool {
	_, ok := slices.BinarySearchFunc(s.VIPs, vip, netip.Addr.Compare)
	return ok
}

// NodeRule returns node n's settings for rule id with the defaults filled
// in (HandlingPriority stays 0 when it follows the host priority).
func (n *Node) NodeRule(id filter.RuleID) filter.NodeRule {
	if nr, ok := n.Rules[id]; ok {
		return nr
	}
	return filter.NodeRule{Weight: filter.DefaultWeight}
}

// HandlingPriority returns node n's effective handling priority for rule id.
func (n *Node) HandlingPriority(id filter.RuleID) int {
	if p := n.NodeRule(id).HandlingPriority; p != 0 {
		return p
	}
	return n.HostPriority
}

// FilterConfig returns the part of the state the ownership function needs:
// exactly what filter.Assign takes. The result shares nothing with s.
func (s *State) FilterConfig() *filter.Config {
	c := &filter.Config{
		Seed:  s.Settings.HashSeed,
		VIPs:  slices.Clone(s.VIPs),
		Rules: slices.Clone(s.Rules),
		Nodes: make([]filter.Node, len(s.Nodes)),
	}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		c.Nodes[i] = filter.Node{ID: n.ID, HostPriority: n.HostPriority, Rules: maps.Clone(n.Rules)}
	}
	return c
}

// validate checks the invariants every state must keep. Commands check the
// same things first with more specific messages; this is the backstop that
// keeps an FSM from ever holding a state the data plane cannot use.
func (s *State) validate() error {
	if !slices.IsSortedFunc(s.VIPs, netip.Addr.Compare) {
		return fmt.Errorf("%w: vips are not sorted", ErrInvalid)
	}
	if err := s.FilterConfig().Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	for i := range s.Rules {
		r := &s.Rules[i]
		if r.VIP.IsValid() && !s.HasVIP(r.VIP) {
			return fmt.Errorf("%w: rule %d uses vip %s, which is not a cluster vip", ErrUnknownVIP, r.ID, r.VIP)
		}
		if r.ID > s.LastRuleID {
			return fmt.Errorf("%w: rule %d is above the last assigned id %d", ErrInvalid, r.ID, s.LastRuleID)
		}
		if r.Mode == filter.ModeSingle {
			if err := s.checkHandlingPriorities(r.ID); err != nil {
				return err
			}
		}
	}
	names := map[string]filter.NodeID{}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		if err := n.NodeInfo.check(); err != nil {
			return err
		}
		if other, dup := names[n.Name]; dup {
			return fmt.Errorf("%w: nodes %d and %d are both named %q", ErrConflict, other, n.ID, n.Name)
		}
		names[n.Name] = n.ID
		if n.ID > s.LastNodeID {
			return fmt.Errorf("%w: node %d is above the last assigned id %d", ErrInvalid, n.ID, s.LastNodeID)
		}
		if n.Admin > AdminSuspended {
			return fmt.Errorf("%w: node %d has invalid admin state %d", ErrInvalid, n.ID, n.Admin)
		}
		for id, nr := range n.Rules {
			if s.Rule(id) == nil {
				return fmt.Errorf("%w: node %d has settings for rule %d, which does not exist", ErrUnknownRule, n.ID, id)
			}
			if nr.HandlingPriority < 0 || nr.HandlingPriority > MaxHostPriority {
				return fmt.Errorf("%w: node %d rule %d: handling priority %d is outside 1-%d", ErrInvalid, n.ID, id, nr.HandlingPriority, MaxHostPriority)
			}
		}
	}
	if s.Settings.ClusterID == 0 {
		return nil // InitCluster checks the settings when it sets them
	}
	return s.Settings.check()
}

// checkHandlingPriorities reports two nodes sharing a handling priority on
// rule id, which would make single-host mode ambiguous.
func (s *State) checkHandlingPriorities(id filter.RuleID) error {
	seen := map[int]filter.NodeID{}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		p := n.HandlingPriority(id)
		if other, dup := seen[p]; dup {
			return fmt.Errorf("%w: nodes %d and %d both have handling priority %d on single-host rule %d; give each node its own priority (shoal rules priority)", ErrConflict, other, n.ID, p, id)
		}
		seen[p] = n.ID
	}
	return nil
}

func (s Settings) check() error {
	switch {
	case !s.MACMode.valid():
		return fmt.Errorf("%w: mac mode %q: want multicast or igmp", ErrInvalid, s.MACMode)
	case s.HeartbeatPeriod < 10*time.Millisecond || s.HeartbeatPeriod > 10*time.Second:
		return fmt.Errorf("%w: heartbeat period %v is outside 10ms-10s", ErrInvalid, s.HeartbeatPeriod)
	case s.HeartbeatTolerance < 2 || s.HeartbeatTolerance > 100:
		return fmt.Errorf("%w: heartbeat tolerance %d is outside 2-100 periods", ErrInvalid, s.HeartbeatTolerance)
	}
	return nil
}

// check validates what a node says about itself.
func (ni *NodeInfo) check() error {
	if err := checkNodeName(ni.Name); err != nil {
		return err
	}
	if err := CheckZone(ni.Zone); err != nil {
		return fmt.Errorf("node %s: %w", ni.Name, err)
	}
	if ni.HostPriority < 0 || ni.HostPriority > MaxHostPriority {
		return fmt.Errorf("%w: node %s: host priority %d is outside 1-%d", ErrInvalid, ni.Name, ni.HostPriority, MaxHostPriority)
	}
	for _, a := range []struct{ what, addr string }{
		{"heartbeat", ni.HeartbeatAddr}, {"raft", ni.RaftAddr}, {"api", ni.APIAddr},
	} {
		if err := checkHostPort(a.addr); err != nil {
			return fmt.Errorf("%w: node %s: %s address %q: %v", ErrInvalid, ni.Name, a.what, a.addr, err)
		}
	}
	return nil
}

func checkHostPort(addr string) error {
	host, port, err := splitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "" {
		return fmt.Errorf("want host:port with a host other peers can reach")
	}
	if port == 0 {
		return fmt.Errorf("port 0 is not reachable")
	}
	return nil
}

func cmpU(a, b uint32) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
