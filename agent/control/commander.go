package control

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/rules"
)

// RuleStore is what the control API needs of the replicated rules.
type RuleStore interface {
	Apply(ctx context.Context, cmd rules.Command) (rules.Result, error)
	State() *rules.State
}

// Commander turns control requests into validated rules commands.
type Commander struct {
	store RuleStore
	self  func() filter.NodeID
}

// NewCommander returns a commander proposing to store; self is this
// node's id once it is registered.
func NewCommander(store RuleStore, self func() filter.NodeID) *Commander {
	return &Commander{store: store, self: self}
}

// BadRequest is an error in what the caller sent (HTTP 400).
func BadRequest(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrBadRequest, fmt.Sprintf(format, a...))
}

// apply checks cmd against the local state first, so that a mistake gets
// its message without a round trip to the leader, then proposes it.
func (c *Commander) apply(ctx context.Context, cmd rules.Command) (rules.Result, error) {
	if err := c.store.State().Check(cmd); err != nil {
		return rules.Result{}, err
	}
	return c.store.Apply(ctx, cmd)
}

// node resolves a node name ("" is this node).
func (c *Commander) node(st *rules.State, name string) (*rules.Node, error) {
	if name == "" {
		if n := st.Node(c.self()); n != nil {
			return n, nil
		}
		return nil, fmt.Errorf("%w: this node is not registered yet", rules.ErrUnknownNode)
	}
	if n := st.NodeByName(name); n != nil {
		return n, nil
	}
	if id, err := strconv.ParseUint(name, 10, 32); err == nil {
		if n := st.Node(filter.NodeID(id)); n != nil {
			return n, nil
		}
	}
	return nil, fmt.Errorf("%w: no node is named %q (see `shoal query`)", rules.ErrUnknownNode, name)
}

// resolveRules turns "all", a rule id, "vip", "vip:port" or "*:port" into
// rule ids; "all" only where allowAll.
func resolveRules(st *rules.State, target string, allowAll bool) ([]filter.RuleID, error) {
	if target == "all" && !allowAll {
		return nil, BadRequest("name one rule, not all")
	}
	return st.ResolveRules(target)
}

func oneRule(st *rules.State, target string) (filter.RuleID, error) {
	ids, err := resolveRules(st, target, false)
	if err != nil {
		return 0, err
	}
	if len(ids) > 1 {
		return 0, BadRequest("%s matches rules %v: name one by id", target, ids)
	}
	return ids[0], nil
}

func (c *Commander) SetAdmin(ctx context.Context, req AdminRequest) error {
	st := c.store.State()
	n, err := c.node(st, req.Node)
	if err != nil {
		return err
	}
	var want rules.AdminState
	if req.State == "resume" {
		if n.Admin != rules.AdminSuspended {
			return BadRequest("node %s is %s, not suspended", n.Name, n.Admin)
		}
		want = rules.AdminStopped
	} else {
		if want, err = rules.ParseAdminState(req.State); err != nil {
			return err
		}
		if n.Admin == rules.AdminSuspended && want != rules.AdminSuspended {
			return BadRequest("node %s is suspended: run `shoal resume` first", n.Name)
		}
	}
	_, err = c.apply(ctx, &rules.SetAdminState{Node: n.ID, State: want})
	return err
}

func (c *Commander) AddRule(ctx context.Context, req RuleRequest) (RuleInfo, error) {
	r := filter.Rule{}
	if req.VIP != "" && req.VIP != "all" {
		vip, err := netip.ParseAddr(req.VIP)
		if err != nil {
			return RuleInfo{}, BadRequest("vip %q: %v", req.VIP, err)
		}
		r.VIP = vip
	}
	lo, hi, err := parsePorts(req.Ports)
	if err != nil {
		return RuleInfo{}, err
	}
	r.PortLo, r.PortHi = lo, hi
	if r.Proto, err = filter.ParseProtocol(OrDefault(req.Proto, "tcp")); err != nil {
		return RuleInfo{}, BadRequest("%v", err)
	}
	if r.Mode, err = filter.ParseMode(OrDefault(req.Mode, "multiple")); err != nil {
		return RuleInfo{}, BadRequest("%v", err)
	}
	if r.Affinity, err = filter.ParseAffinity(OrDefault(req.Affinity, "single")); err != nil {
		return RuleInfo{}, BadRequest("%v", err)
	}
	res, err := c.apply(ctx, &rules.PutRule{Rule: r})
	if err != nil {
		return RuleInfo{}, err
	}
	r.ID = res.RuleID
	return RuleInfoOf(c.store.State(), &r), nil
}

func OrDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// parsePorts parses "80" or "8000-8099".
func parsePorts(s string) (uint16, uint16, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	l, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	h := l
	var err2 error
	if isRange {
		h, err2 = strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
	}
	if s == "" || err1 != nil || err2 != nil || l > h {
		return 0, 0, BadRequest("ports %q: want a port (80) or a range (8000-8099) within 0-65535", s)
	}
	return uint16(l), uint16(h), nil
}

func (c *Commander) RemoveRule(ctx context.Context, target string) error {
	id, err := oneRule(c.store.State(), target)
	if err != nil {
		return err
	}
	_, err = c.apply(ctx, &rules.RemoveRule{ID: id})
	return err
}

// editRule changes the rule target names in place, as one PutRule with
// its id: the fields req gives replace the rule's, and the FSM keeps the
// nodes' settings for it.
func (c *Commander) EditRule(ctx context.Context, target string, req RuleEditRequest) (RuleInfo, error) {
	st := c.store.State()
	id, err := oneRule(st, target)
	if err != nil {
		return RuleInfo{}, err
	}
	r := *st.Rule(id)
	changed := false
	if req.VIP != "" {
		r.VIP = netip.Addr{}
		if req.VIP != "all" {
			if r.VIP, err = netip.ParseAddr(req.VIP); err != nil {
				return RuleInfo{}, BadRequest("vip %q: %v", req.VIP, err)
			}
		}
		changed = true
	}
	if req.Ports != "" {
		if r.PortLo, r.PortHi, err = parsePorts(req.Ports); err != nil {
			return RuleInfo{}, err
		}
		changed = true
	}
	if req.Proto != "" {
		if r.Proto, err = filter.ParseProtocol(req.Proto); err != nil {
			return RuleInfo{}, BadRequest("%v", err)
		}
		changed = true
	}
	if req.Mode != "" {
		if r.Mode, err = filter.ParseMode(req.Mode); err != nil {
			return RuleInfo{}, BadRequest("%v", err)
		}
		changed = true
	}
	if req.Affinity != "" {
		if r.Affinity, err = filter.ParseAffinity(req.Affinity); err != nil {
			return RuleInfo{}, BadRequest("%v", err)
		}
		changed = true
	}
	if !changed {
		return RuleInfo{}, BadRequest("nothing to change: give --vip, --ports, --proto, --mode or --affinity")
	}
	if _, err := c.apply(ctx, &rules.PutRule{Rule: r}); err != nil {
		return RuleInfo{}, err
	}
	return RuleInfoOf(c.store.State(), &r), nil
}

// setSettings changes the cluster settings req gives: the hash seed and
// heartbeat settings in one command, the MAC mode (a command of its own,
// validated first) after it.
func (c *Commander) SetSettings(ctx context.Context, req SettingsRequest) error {
	cmd := &rules.SetSettings{HashSeed: req.HashSeed, HeartbeatTolerance: req.HeartbeatTolerance}
	if req.HeartbeatPeriod != "" {
		d, err := time.ParseDuration(req.HeartbeatPeriod)
		if err != nil {
			return BadRequest("heartbeat period %q: want a duration such as 75ms", req.HeartbeatPeriod)
		}
		cmd.HeartbeatPeriod = &d
	}
	var mode *rules.SetMACMode
	if req.MACMode != "" {
		m, err := rules.ParseMACMode(req.MACMode)
		if err != nil {
			return BadRequest("%v", err)
		}
		mode = &rules.SetMACMode{Mode: m}
	}
	some := cmd.HashSeed != nil || cmd.HeartbeatPeriod != nil || cmd.HeartbeatTolerance != nil
	if !some && mode == nil {
		return BadRequest("nothing to change: give --hash-seed, --heartbeat-period, --heartbeat-tolerance or --mac-mode")
	}
	if some {
		if _, err := c.apply(ctx, cmd); err != nil {
			return err
		}
	}
	if mode != nil {
		if _, err := c.apply(ctx, mode); err != nil {
			return err
		}
	}
	return nil
}

func (c *Commander) SetRuleState(ctx context.Context, req RuleStateRequest) error {
	st := c.store.State()
	ids, err := resolveRules(st, req.Target, true)
	if err != nil {
		return err
	}
	state, err := filter.ParseRuleState(req.State)
	if err != nil {
		return BadRequest("%v", err)
	}
	cmd := &rules.SetRuleState{Rules: ids, State: state}
	if !req.AllNodes {
		n, err := c.node(st, req.Node)
		if err != nil {
			return err
		}
		cmd.Node = n.ID
	}
	_, err = c.apply(ctx, cmd)
	return err
}

func (c *Commander) SetWeight(ctx context.Context, req WeightRequest) error {
	st := c.store.State()
	ids, err := resolveRules(st, req.Rule, true)
	if err != nil {
		return err
	}
	var nodes []filter.NodeID
	for _, name := range strings.Split(req.Node, ",") {
		name = strings.TrimSpace(name)
		if name == "" && req.Node != "" {
			return BadRequest("nodes %q: an empty name in the list", req.Node)
		}
		n, err := c.node(st, name) // none named: this node
		if err != nil {
			return err
		}
		nodes = append(nodes, n.ID)
	}
	w := rules.WeightEqual
	if req.Weight != "equal" {
		v, err := strconv.Atoi(req.Weight)
		if err != nil || v < 0 || v > filter.MaxWeight {
			return BadRequest("weight %q: want 0-100 or equal", req.Weight)
		}
		w = v
	}
	// Every pair in one write, one view change; a cluster with a member
	// too old to read the lists gets a write per pair.
	cmd := rules.NewSetWeight(ids, nodes, w)
	if err := st.CheckSupported(cmd); !errors.Is(err, rules.ErrUnsupported) {
		_, err = c.apply(ctx, cmd)
		return err
	}
	for _, id := range ids {
		for _, n := range nodes {
			if _, err := c.apply(ctx, rules.NewSetWeight([]filter.RuleID{id}, []filter.NodeID{n}, w)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *Commander) SetPriority(ctx context.Context, req PriorityRequest) error {
	st := c.store.State()
	n, err := c.node(st, req.Node)
	if err != nil {
		return err
	}
	if req.Rule == "" {
		_, err = c.apply(ctx, &rules.SetHostPriority{Node: n.ID, Priority: req.Priority})
		return err
	}
	id, err := oneRule(st, req.Rule)
	if err != nil {
		return err
	}
	_, err = c.apply(ctx, &rules.SetHandlingPriority{Rule: id, Node: n.ID, Priority: req.Priority})
	return err
}

func (c *Commander) ListRules() []RuleInfo {
	st := c.store.State()
	out := make([]RuleInfo, 0, len(st.Rules))
	for i := range st.Rules {
		out = append(out, RuleInfoOf(st, &st.Rules[i]))
	}
	return out
}

func RuleInfoOf(st *rules.State, r *filter.Rule) RuleInfo {
	info := RuleInfo{ID: r.ID, VIP: "all", Ports: fmt.Sprint(r.PortLo), Proto: r.Proto.String(), Mode: r.Mode.String(),
		Affinity: r.Affinity.String(), State: r.State.String(), Nodes: map[string]NodeRuleInfo{}}
	if r.VIP.IsValid() {
		info.VIP = r.VIP.String()
	}
	if r.PortHi != r.PortLo {
		info.Ports += fmt.Sprintf("-%d", r.PortHi)
	}
	for i := range st.Nodes {
		n := &st.Nodes[i]
		nr := n.NodeRule(r.ID)
		info.Nodes[n.Name] = NodeRuleInfo{Weight: nr.Weight, HandlingPriority: n.HandlingPriority(r.ID), State: nr.State.String()}
	}
	return info
}
