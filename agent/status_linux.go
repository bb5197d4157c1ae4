package agent

import (
	"cmp"
	"context"
	"net/netip"
	"slices"
	"strings"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/agent/node"
	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/rules"
)

// The Agent implements the control API on top of its commander.

func (a *Agent) SetAdmin(ctx context.Context, r control.AdminRequest) error {
	return a.cmd.SetAdmin(ctx, r)
}
func (a *Agent) ListRules() []control.RuleInfo { return a.cmd.ListRules() }
func (a *Agent) AddRule(ctx context.Context, r control.RuleRequest) (control.RuleInfo, error) {
	return a.cmd.AddRule(ctx, r)
}
func (a *Agent) RemoveRule(ctx context.Context, t string) error { return a.cmd.RemoveRule(ctx, t) }
func (a *Agent) EditRule(ctx context.Context, t string, r control.RuleEditRequest) (control.RuleInfo, error) {
	return a.cmd.EditRule(ctx, t, r)
}
func (a *Agent) SetSettings(ctx context.Context, r control.SettingsRequest) error {
	return a.cmd.SetSettings(ctx, r)
}
func (a *Agent) SetRuleState(ctx context.Context, r control.RuleStateRequest) error {
	return a.cmd.SetRuleState(ctx, r)
}
func (a *Agent) SetWeight(ctx context.Context, r control.WeightRequest) error {
	return a.cmd.SetWeight(ctx, r)
}
func (a *Agent) SetPriority(ctx context.Context, r control.PriorityRequest) error {
	return a.cmd.SetPriority(ctx, r)
}

// leave takes the node out of the cluster; the operator then stops the agent.
func (a *Agent) Leave(ctx context.Context) error { return a.store.Leave(ctx) }

// setPlug pulls or restores the node's virtual plug (plug arms its
// restore). Putting it back starts a fresh membership incarnation, so the
// node listens before it takes anything, exactly as a node whose cable
// comes back after a restart.
func (a *Agent) setPlug(ctx context.Context, r control.PlugRequest) error {
	return a.node.SetPlug(ctx, r.Pulled)
}

// status is the node's published state, with what only the Agent knows.
func (a *Agent) Status() control.Status {
	s := a.node.Status()
	s.NodeName = a.cfg.NodeName
	s.Healthy = a.hc.Healthy()
	if !s.Healthy {
		s.HealthError = a.hc.Err()
	}
	if ok, why := a.host.Healthy(); !ok {
		s.Healthy = false
		s.HealthError = strings.TrimPrefix(s.HealthError+"; data plane: "+why, "; ")
	}
	// The admin state as replicated, which may be a step ahead of the
	// tables: a command that returned has changed it.
	if n := a.store.State().Node(a.self); n != nil {
		s.Admin = n.Admin.String()
	}
	s.Leader, _ = a.store.Leader()
	s.Raft, _ = a.raftInfo()
	s.RulesStopped = control.RulesStopped(a.store)
	s.BGP = a.bgpInfo()
	return s
}

func (a *Agent) Query() control.Query {
	ms := a.node.Snap()
	rs, hb, self := ms.Rules(), ms.Heartbeat(), a.self
	owners := filter.Assign(ms.Filter(), node.NodeIDs(hb.View.Eligible))
	q := control.Query{Self: a.cfg.NodeName, Converged: hb.Converged, RulesIndex: rs.Index, Settings: control.SettingsOf(rs.Settings)}
	q.Leader, _ = a.store.Leader()
	var roles map[string]string
	q.Raft, roles = a.raftInfo()
	q.BGP = a.bgpInfo()
	q.Forwarding = a.forwardInfo()
	for _, v := range rs.VIPs {
		q.VIPs = append(q.VIPs, v.String())
	}
	peers := map[filter.NodeID]int{}
	for i, p := range hb.Peers {
		peers[filter.NodeID(p.ID)] = i
	}
	for _, n := range rs.Nodes {
		ni := control.NodeInfo{ID: n.ID, Name: n.Name, HostPriority: n.HostPriority, Admin: n.Admin.String(),
			Eligible: hb.View.Has(uint32(n.ID)), HeartbeatAddr: n.HeartbeatAddr, APIAddr: n.APIAddr,
			Share: map[filter.RuleID]float64{}, Raft: cmp.Or(roles[n.Name], "none"), Zone: n.Zone}
		if n.ID == self {
			ni.Live, ni.Healthy, ni.RulesIndex = true, a.healthy(), rs.Index
		} else if i, ok := peers[n.ID]; ok {
			ni.Live, ni.Healthy, ni.RulesIndex = hb.Peers[i].Live, hb.Peers[i].Healthy, hb.Peers[i].RulesIndex
		}
		for id, t := range owners.Rules {
			k := 0
			for _, o := range t {
				if o == n.ID {
					k++
				}
			}
			ni.Share[id] = float64(k) / filter.NumBuckets
		}
		q.Nodes = append(q.Nodes, ni)
	}
	for i := range rs.Rules {
		q.Rules = append(q.Rules, control.RuleInfoOf(rs, &rs.Rules[i]))
	}
	return q
}

func (a *Agent) Params() control.Params {
	p := a.node.Params()
	p.Config = *a.cfg
	c := a.host.Counters()
	p.ARP, p.NDP, p.BGP = c["arp"], c["ndp"], c["bgp"]
	p.Forwarding = a.forwardInfo()
	return p
}

// forwardInfo is routed mode's forwarding as the data plane counted it;
// nil in the other modes.
func (a *Agent) forwardInfo() *control.ForwardInfo {
	rs := a.node.Snap().Rules()
	if rs.Settings.MACMode != rules.MACRouted {
		return nil
	}
	fc, err := a.xdp.ForwardCounters()
	if err != nil {
		return nil
	}
	t := a.node.Tables()
	fi := &control.ForwardInfo{On: t != nil && t.Forwarding(), Foreign: fc.Foreign, NoRoute: fc.NoRoute, HopLimit: fc.HopLimit, TooBig: fc.TooBig,
		ClampError: fc.Clamp}
	for _, n := range rs.Nodes {
		addr := node.NodeAddr(rs, n.ID)
		if pc, ok := fc.Peers[addr]; ok && n.ID != a.self {
			fi.Peers = append(fi.Peers, control.ForwardPeer{Node: n.Name, Addr: addr,
				Forwarded: pc.Forwarded, SecondChance: pc.SecondChance, Received: pc.Received})
		}
	}
	return fi
}

// simulate says which node takes a flow now, and which would if any one
// node failed.
func (a *Agent) Simulate(client, to netip.AddrPort, proto string) (control.Simulation, error) {
	p, err := filter.ParseProtocol(control.OrDefault(proto, "tcp"))
	if err != nil || p == filter.ProtoBoth {
		return control.Simulation{}, control.BadRequest("proto %q: want tcp or udp", proto)
	}
	ms, tables := a.node.Snap(), a.node.Tables()
	id, bucket, ok := ms.Filter().Locate(to.Addr(), p, client.Addr(), client.Port(), to.Port())
	if !ok {
		return control.Simulation{}, control.BadRequest("%s is not a VIP of this cluster, or %s is not IPv4", to.Addr(), client.Addr())
	}
	name := func(n filter.NodeID) string {
		if node := ms.Rules().Node(n); node != nil {
			return node.Name
		}
		return ""
	}
	view := node.NodeIDs(ms.Heartbeat().View.Eligible)
	sim := control.Simulation{Rule: id, Bucket: bucket, IfDown: map[string]string{}}
	sim.Owner = name(filter.Assign(ms.Filter(), view).Rules[id][bucket])
	if t := tables; t != nil {
		sim.Here = t.States[id][bucket].String()
	}
	for _, down := range view {
		rest := slices.DeleteFunc(slices.Clone(view), func(n filter.NodeID) bool { return n == down })
		sim.IfDown[name(down)] = name(filter.Assign(ms.Filter(), rest).Rules[id][bucket])
	}
	return sim, nil
}

// raftInfo is this node's place in Raft, with the autopilot's view when it
// leads, and every member's role by name.
func (a *Agent) raftInfo() (control.RaftInfo, map[string]string) {
	ri := control.RaftInfo{Role: "none"}
	roles := map[string]string{}
	ms, err := a.store.Members()
	if err != nil {
		return ri, roles
	}
	leader, _ := a.store.Leader()
	for _, m := range ms {
		role := "non-voter"
		switch {
		case m.Voter && m.Name == leader:
			role = "leader"
		case m.Voter:
			role = "voter"
		}
		roles[m.Name] = role
		if m.Voter {
			ri.Voters++
		} else {
			ri.NonVoters++
		}
	}
	ri.Role = cmp.Or(roles[a.cfg.NodeName], "none")
	if vs, ok := a.store.Voters(); ok {
		ri.Autopilot, ri.Healthy, ri.FailureTolerance = true, vs.Healthy, vs.FailureTolerance
		for _, s := range vs.Servers {
			if !s.Healthy {
				ri.Unhealthy = append(ri.Unhealthy, s.Name)
			}
		}
		ri.VoterChanges, ri.LastChange = a.store.VoterChanges(), vs.LastPromotion
	}
	return ri, roles
}
