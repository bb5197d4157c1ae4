package rules

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/shoalnet/shoal/filter"
)

// Check reports whether cmd would apply to s, with the error the FSM would
// return. Store.Apply calls it before proposing, so a bad command fails fast
// with the same message the leader would give.
func (s *State) Check(cmd Command) error {
	_, err := applyTo(s.Clone(), cmd)
	return err
}

// applyTo applies cmd to s (which the caller owns and discards on error)
// and checks the state's invariants afterwards.
func applyTo(s *State, cmd Command) (Result, error) {
	res, err := cmd.apply(s)
	if err != nil {
		return Result{}, err
	}
	if err := s.validate(); err != nil {
		return Result{}, err
	}
	return res, nil
}

func (c *InitCluster) apply(s *State) (Result, error) {
	if s.Settings.ClusterID != 0 {
		return Result{}, fmt.Errorf("%w: the cluster is already initialised (cluster id %08x)", ErrConflict, s.Settings.ClusterID)
	}
	if c.Settings.ClusterID == 0 {
		return Result{}, fmt.Errorf("%w: cluster id 0 is reserved", ErrInvalid)
	}
	s.Settings = c.Settings
	return Result{}, nil
}

func checkVIP(vip netip.Addr) error {
	switch {
	case !vip.IsValid():
		return fmt.Errorf("%w: vip is missing", ErrInvalid)
	case vip.Zone() != "":
		return fmt.Errorf("%w: vip %s: a VIP has no zone", ErrInvalid, vip)
	case vip.Is4In6():
		return fmt.Errorf("%w: vip %s: an IPv4-mapped address; write the IPv4 VIP as %s", ErrInvalid, vip, vip.Unmap())
	case vip.IsUnspecified() || vip.IsLoopback() || vip.IsMulticast() || vip.IsLinkLocalUnicast() ||
		vip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return fmt.Errorf("%w: vip %s: want a unicast address clients can reach (not link-local)", ErrInvalid, vip)
	}
	return nil
}

func (c *PutVIP) apply(s *State) (Result, error) {
	if err := checkVIP(c.VIP); err != nil {
		return Result{}, err
	}
	i, ok := slices.BinarySearchFunc(s.VIPs, c.VIP, netip.Addr.Compare)
	if !ok {
		if len(s.VIPs) >= filter.MaxVIPs {
			return Result{}, fmt.Errorf("%w: vip %s: the cluster has %d VIPs, the data plane's limit (filter.MaxVIPs); remove one first: %w",
				ErrInvalid, c.VIP, len(s.VIPs), filter.ErrCapacity)
		}
		s.VIPs = slices.Insert(s.VIPs, i, c.VIP)
	}
	return Result{}, nil
}

func (c *RemoveVIP) apply(s *State) (Result, error) {
	i, ok := slices.BinarySearchFunc(s.VIPs, c.VIP, netip.Addr.Compare)
	if !ok {
		return Result{}, fmt.Errorf("%w: vip %s is not a cluster vip", ErrUnknownVIP, c.VIP)
	}
	var users []string
	for _, r := range s.Rules {
		if r.VIP == c.VIP {
			users = append(users, fmt.Sprint(r.ID))
		}
	}
	if len(users) > 0 {
		return Result{}, fmt.Errorf("%w: vip %s is used by rule %s; remove those rules first", ErrConflict, c.VIP, strings.Join(users, ", "))
	}
	s.VIPs = slices.Delete(s.VIPs, i, i+1)
	return Result{}, nil
}

// describeRule names a rule the way an operator writes it.
func describeRule(r *filter.Rule) string {
	vip := "all vips"
	if r.VIP.IsValid() {
		vip = r.VIP.String()
	}
	ports := fmt.Sprintf("%d-%d", r.PortLo, r.PortHi)
	if r.PortLo == r.PortHi {
		ports = fmt.Sprint(r.PortLo)
	}
	return fmt.Sprintf("%s %s port %s", r.Proto, vip, ports)
}

func (c *PutRule) apply(s *State) (Result, error) {
	r := c.Rule
	if r.ID == 0 {
		if len(s.Rules) >= filter.MaxRules {
			return Result{}, fmt.Errorf("%w: rule %s: the cluster has %d port rules, the data plane's limit (filter.MaxRules); remove one or widen an existing one: %w",
				ErrInvalid, describeRule(&r), len(s.Rules), filter.ErrCapacity)
		}
		r.ID = s.LastRuleID + 1
		if r.ID == 0 {
			return Result{}, fmt.Errorf("%w: rule ids are exhausted", ErrInvalid)
		}
		s.LastRuleID = r.ID
	} else if s.Rule(r.ID) == nil {
		return Result{}, fmt.Errorf("%w: rule %d does not exist; put it with id 0 to create it", ErrUnknownRule, r.ID)
	}
	if err := r.Validate(); err != nil {
		return Result{}, fmt.Errorf("%w: %s: %w", ErrInvalid, describeRule(&r), err)
	}
	if r.VIP.IsValid() && !s.HasVIP(r.VIP) {
		return Result{}, fmt.Errorf("%w: rule %s: vip %s is not a cluster vip; add it first (shoal rules vip add %s)", ErrUnknownVIP, describeRule(&r), r.VIP, r.VIP)
	}
	for i := range s.Rules {
		o := &s.Rules[i]
		if o.ID != r.ID && r.Overlaps(o) {
			return Result{}, fmt.Errorf("%w: rule %s overlaps rule %d (%s); choose ports that do not intersect, or change or remove rule %d", ErrConflict, describeRule(&r), o.ID, describeRule(o), o.ID)
		}
	}
	i, ok := slices.BinarySearchFunc(s.Rules, r.ID, func(r filter.Rule, id filter.RuleID) int { return cmpU(uint32(r.ID), uint32(id)) })
	if ok {
		s.Rules[i] = r
	} else {
		s.Rules = slices.Insert(s.Rules, i, r)
	}
	if r.Mode == filter.ModeSingle {
		if err := s.checkHandlingPriorities(r.ID); err != nil {
			return Result{}, err
		}
	}
	return Result{RuleID: r.ID}, nil
}

func (c *RemoveRule) apply(s *State) (Result, error) {
	i, ok := slices.BinarySearchFunc(s.Rules, c.ID, func(r filter.Rule, id filter.RuleID) int { return cmpU(uint32(r.ID), uint32(id)) })
	if !ok {
		return Result{}, unknownRule(c.ID)
	}
	s.Rules = slices.Delete(s.Rules, i, i+1)
	for j := range s.Nodes {
		if n := &s.Nodes[j]; n.Rules != nil {
			delete(n.Rules, c.ID)
			if len(n.Rules) == 0 {
				n.Rules = nil
			}
		}
	}
	return Result{RuleID: c.ID}, nil
}

func unknownRule(id filter.RuleID) error {
	return fmt.Errorf("%w: rule %d does not exist; list rules with shoal rules list", ErrUnknownRule, id)
}

func unknownNode(id filter.NodeID) error {
	return fmt.Errorf("%w: node %d is not registered; list nodes with shoal query", ErrUnknownNode, id)
}

// nodeRule returns the node and a pointer-free copy of its settings for
// rule id, after checking both exist.
func (s *State) nodeRule(nodeID filter.NodeID, ruleID filter.RuleID) (*Node, filter.NodeRule, error) {
	if s.Rule(ruleID) == nil {
		return nil, filter.NodeRule{}, unknownRule(ruleID)
	}
	n := s.Node(nodeID)
	if n == nil {
		return nil, filter.NodeRule{}, unknownNode(nodeID)
	}
	return n, n.NodeRule(ruleID), nil
}

// setNodeRule stores a node's settings for a rule, dropping the entry when
// it holds only defaults so equal states compare equal.
func (n *Node) setNodeRule(id filter.RuleID, nr filter.NodeRule) {
	if nr == (filter.NodeRule{Weight: filter.DefaultWeight}) {
		delete(n.Rules, id)
		if len(n.Rules) == 0 {
			n.Rules = nil
		}
		return
	}
	if n.Rules == nil {
		n.Rules = map[filter.RuleID]filter.NodeRule{}
	}
	n.Rules[id] = nr
}

func (c *SetRuleState) apply(s *State) (Result, error) {
	if len(c.Rules) == 0 {
		return Result{}, fmt.Errorf("%w: no rule given", ErrInvalid)
	}
	if c.State > filter.RuleDisabled {
		return Result{}, fmt.Errorf("%w: rule state %d: want enabled, draining or disabled", ErrInvalid, c.State)
	}
	for _, id := range c.Rules {
		if c.Node == 0 {
			r := s.Rule(id)
			if r == nil {
				return Result{}, unknownRule(id)
			}
			r.State = c.State
			continue
		}
		n, nr, err := s.nodeRule(c.Node, id)
		if err != nil {
			return Result{}, err
		}
		nr.State = c.State
		n.setNodeRule(id, nr)
	}
	return Result{}, nil
}

func (c *SetWeight) apply(s *State) (Result, error) {
	w := c.Weight
	if w == WeightEqual {
		w = filter.DefaultWeight
	}
	if w < 0 || w > filter.MaxWeight {
		return Result{}, fmt.Errorf("%w: weight %d is outside 0-100 (0 takes no new connections; use equal for the default %d)", ErrInvalid, c.Weight, filter.DefaultWeight)
	}
	rules, nodes := c.pairs()
	for _, rule := range rules {
		for _, node := range nodes {
			n, nr, err := s.nodeRule(node, rule)
			if err != nil {
				return Result{}, err
			}
			nr.Weight = w
			n.setNodeRule(rule, nr)
		}
	}
	return Result{}, nil
}

func (c *SetHandlingPriority) apply(s *State) (Result, error) {
	if top := s.MaxPriority(); c.Priority < 0 || c.Priority > top {
		return Result{}, fmt.Errorf("%w: handling priority %d is outside 1-%d (0 follows the host priority)%s", ErrInvalid, c.Priority, top, s.legacyNote(top))
	}
	n, nr, err := s.nodeRule(c.Node, c.Rule)
	if err != nil {
		return Result{}, err
	}
	nr.HandlingPriority = c.Priority
	n.setNodeRule(c.Rule, nr)
	if s.Rule(c.Rule).Mode == filter.ModeSingle {
		return Result{}, s.checkHandlingPriorities(c.Rule)
	}
	return Result{}, nil
}

// legacyNote explains a limit of 32 that an older member imposes.
func (s *State) legacyNote(top int) string {
	n := s.legacyMember()
	if top >= MaxHostPriority || n == nil {
		return ""
	}
	return fmt.Sprintf(" (node %d (%s) runs a shoal at command level %d; %d once every node is at level %d)", n.ID, n.Name, n.level(), MaxHostPriority, bigClusterLevel)
}

// freePriorities lists the host priorities no node holds, for messages.
func (s *State) freePriorities() []int {
	var free []int
	for p := 1; p <= s.MaxPriority(); p++ {
		if !slices.ContainsFunc(s.Nodes, func(n Node) bool { return n.HostPriority == p }) {
			free = append(free, p)
		}
	}
	return free
}

func (s *State) checkHostPriority(self filter.NodeID, p int) error {
	if top := s.MaxPriority(); p < 1 || p > top {
		return fmt.Errorf("%w: host priority %d is outside 1-%d%s", ErrInvalid, p, top, s.legacyNote(top))
	}
	for i := range s.Nodes {
		if o := &s.Nodes[i]; o.ID != self && o.HostPriority == p {
			free := s.freePriorities()
			if len(free) > 5 {
				free = free[:5]
			}
			return fmt.Errorf("%w: host priority %d is taken by node %d (%s); free priorities include %v", ErrConflict, p, o.ID, o.Name, free)
		}
	}
	return nil
}

func (c *SetHostPriority) apply(s *State) (Result, error) {
	n := s.Node(c.Node)
	if n == nil {
		return Result{}, unknownNode(c.Node)
	}
	if err := s.checkHostPriority(n.ID, c.Priority); err != nil {
		return Result{}, err
	}
	n.HostPriority = c.Priority
	for _, r := range s.Rules {
		if r.Mode == filter.ModeSingle {
			if err := s.checkHandlingPriorities(r.ID); err != nil {
				return Result{}, err
			}
		}
	}
	return Result{NodeID: n.ID}, nil
}

func (c *RegisterNode) apply(s *State) (Result, error) {
	info := c.Info
	if err := info.check(); err != nil {
		return Result{}, err
	}
	if c.Admin > AdminSuspended {
		return Result{}, fmt.Errorf("%w: admin state %d", ErrInvalid, c.Admin)
	}
	if info.level() < bigClusterLevel {
		for i := range s.Nodes {
			if o := &s.Nodes[i]; o.HostPriority > legacyMaxPriority && o.Name != info.Name {
				return Result{}, fmt.Errorf("%w: node %s runs a shoal at command level %d, which holds at most %d nodes, and node %d (%s) has host priority %d; upgrade it first", ErrUnsupported, info.Name, info.level(), legacyMaxPriority, o.ID, o.Name, o.HostPriority)
			}
		}
	}
	if n := s.NodeByName(info.Name); n != nil {
		if n.RaftAddr != info.RaftAddr {
			return Result{}, fmt.Errorf("%w: node name %q is taken by node %d at %s; pick another name or remove node %d first", ErrConflict, info.Name, n.ID, n.RaftAddr, n.ID)
		}
		// A retried join: keep the id and settings, take the new addresses.
		if info.HostPriority != 0 && info.HostPriority != n.HostPriority {
			if err := s.checkHostPriority(n.ID, info.HostPriority); err != nil {
				return Result{}, err
			}
			n.HostPriority = info.HostPriority
		}
		n.HeartbeatAddr, n.APIAddr, n.CommandLevel, n.Zone = info.HeartbeatAddr, info.APIAddr, info.CommandLevel, info.Zone
		return Result{NodeID: n.ID}, nil
	}
	for i := range s.Nodes {
		if o := &s.Nodes[i]; o.RaftAddr == info.RaftAddr {
			return Result{}, fmt.Errorf("%w: raft address %s is already used by node %d (%s)", ErrConflict, info.RaftAddr, o.ID, o.Name)
		}
	}
	if info.HostPriority == 0 {
		free := s.freePriorities()
		if len(free) == 0 {
			top := s.MaxPriority()
			return Result{}, fmt.Errorf("%w: all %d host priorities are taken; a cluster holds at most %d nodes%s", ErrConflict, top, top, s.legacyNote(top))
		}
		info.HostPriority = free[0]
	} else if err := s.checkHostPriority(0, info.HostPriority); err != nil {
		return Result{}, err
	}
	id := s.LastNodeID + 1
	if id == filter.NoNode {
		return Result{}, fmt.Errorf("%w: node ids are exhausted", ErrInvalid)
	}
	s.LastNodeID = id
	s.Nodes = append(s.Nodes, Node{ID: id, NodeInfo: info, Admin: c.Admin}) // ids grow, so the slice stays sorted
	return Result{NodeID: id}, nil
}

func (c *RemoveNode) apply(s *State) (Result, error) {
	i := slices.IndexFunc(s.Nodes, func(n Node) bool { return n.ID == c.ID })
	if i < 0 {
		return Result{}, unknownNode(c.ID)
	}
	s.Nodes = slices.Delete(s.Nodes, i, i+1)
	return Result{NodeID: c.ID}, nil
}

func (c *SetAdminState) apply(s *State) (Result, error) {
	if c.State > AdminSuspended {
		return Result{}, fmt.Errorf("%w: admin state %d: want started, stopped, draining or suspended", ErrInvalid, c.State)
	}
	n := s.Node(c.Node)
	if n == nil {
		return Result{}, unknownNode(c.Node)
	}
	n.Admin = c.State
	return Result{NodeID: n.ID}, nil
}

func (c *SetSettings) apply(s *State) (Result, error) {
	if c.HashSeed == nil && c.HeartbeatPeriod == nil && c.HeartbeatTolerance == nil {
		return Result{}, fmt.Errorf("%w: no setting given", ErrInvalid)
	}
	if s.Settings.ClusterID == 0 {
		return Result{}, fmt.Errorf("%w: the cluster is not initialised yet", ErrInvalid)
	}
	if c.HashSeed != nil {
		s.Settings.HashSeed = *c.HashSeed
	}
	if c.HeartbeatPeriod != nil {
		s.Settings.HeartbeatPeriod = *c.HeartbeatPeriod
	}
	if c.HeartbeatTolerance != nil {
		s.Settings.HeartbeatTolerance = *c.HeartbeatTolerance
	}
	return Result{}, s.Settings.check()
}

func (c *SetMACMode) apply(s *State) (Result, error) {
	if s.Settings.ClusterID == 0 {
		return Result{}, fmt.Errorf("%w: the cluster is not initialised yet", ErrInvalid)
	}
	s.Settings.MACMode = c.Mode.normal()
	return Result{}, s.Settings.check()
}
