package agent

import (
	"context"
	"net/netip"
	"slices"
	"strings"

	"github.com/shoalnet/shoal/filter"
)

// The Agent implements the control API on top of its commander.

func (a *Agent) setAdmin(ctx context.Context, r AdminRequest) error { return a.cmd.setAdmin(ctx, r) }
func (a *Agent) listRules() []RuleInfo                              { return a.cmd.listRules() }
func (a *Agent) addRule(ctx context.Context, r RuleRequest) (RuleInfo, error) {
	return a.cmd.addRule(ctx, r)
}
func (a *Agent) removeRule(ctx context.Context, t string) error { return a.cmd.removeRule(ctx, t) }
func (a *Agent) editRule(ctx context.Context, t string, r RuleEditRequest) (RuleInfo, error) {
	return a.cmd.editRule(ctx, t, r)
}
func (a *Agent) setSettings(ctx context.Context, r SettingsRequest) error {
	return a.cmd.setSettings(ctx, r)
}
func (a *Agent) setRuleState(ctx context.Context, r RuleStateRequest) error {
	return a.cmd.setRuleState(ctx, r)
}
func (a *Agent) setWeight(ctx context.Context, r WeightRequest) error { return a.cmd.setWeight(ctx, r) }
func (a *Agent) setPriority(ctx context.Context, r PriorityRequest) error {
	return a.cmd.setPriority(ctx, r)
}

// leave takes the node out of the cluster; the operator then stops the agent.
func (a *Agent) leave(ctx context.Context) error { return a.store.Leave(ctx) }

// setPlug pulls or restores the node's virtual plug (plug arms its
// restore). Putting it back starts a fresh membership incarnation, so the
// node listens before it takes anything, exactly as a node whose cable
// comes back after a restart.
func (a *Agent) setPlug(ctx context.Context, r PlugRequest) error {
	return a.node.mem.setPlug(ctx, r.Pulled)
}

// status is the node's published state, with what only the Agent knows.
func (a *Agent) status() Status {
	s := a.node.status()
	s.NodeName = a.cfg.NodeName
	s.Healthy = a.hc.healthy.Load()
	if !s.Healthy {
		s.HealthError, _ = a.hc.lastErr.Load().(string)
	}
	if ok, why := a.host.hostHealthy(); !ok {
		s.Healthy = false
		s.HealthError = strings.TrimPrefix(s.HealthError+"; data plane: "+why, "; ")
	}
	// The admin state as replicated, which may be a step ahead of the
	// tables: a command that returned has changed it.
	if n := a.store.State().Node(a.self); n != nil {
		s.Admin = n.Admin.String()
	}
	s.Leader, _ = a.store.Leader()
	s.RulesStopped = rulesStopped(a.store)
	return s
}

func (a *Agent) query() Query {
	ms := a.node.mem.snap.Load()
	rs, hb, self := ms.rs, ms.hb, a.self
	owners := filter.Assign(ms.fcfg, nodeIDs(hb.View.Eligible))
	q := Query{Self: a.cfg.NodeName, Converged: hb.Converged, RulesIndex: rs.Index, Settings: settingInfo(rs.Settings)}
	q.Leader, _ = a.store.Leader()
	for _, v := range rs.VIPs {
		q.VIPs = append(q.VIPs, v.String())
	}
	peers := map[filter.NodeID]int{}
	for i, p := range hb.Peers {
		peers[filter.NodeID(p.ID)] = i
	}
	for _, n := range rs.Nodes {
		ni := NodeInfo{ID: n.ID, Name: n.Name, HostPriority: n.HostPriority, Admin: n.Admin.String(),
			Eligible: hb.View.Has(uint32(n.ID)), HeartbeatAddr: n.HeartbeatAddr, APIAddr: n.APIAddr,
			Share: map[filter.RuleID]float64{}}
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
		q.Rules = append(q.Rules, ruleInfo(rs, &rs.Rules[i]))
	}
	return q
}

func (a *Agent) params() Params {
	p := a.node.params()
	p.Config = *a.cfg
	p.ARP = a.host.arpCounters()
	p.NDP = a.host.ndpCounters()
	return p
}

// simulate says which node takes a flow now, and which would if any one
// node failed.
func (a *Agent) simulate(client, to netip.AddrPort, proto string) (Simulation, error) {
	p, err := filter.ParseProtocol(orDefault(proto, "tcp"))
	if err != nil || p == filter.ProtoBoth {
		return Simulation{}, badRequest("proto %q: want tcp or udp", proto)
	}
	ms, ds := a.node.mem.snap.Load(), a.node.rec.pub.Load()
	id, bucket, ok := ms.fcfg.Locate(to.Addr(), p, client.Addr(), client.Port(), to.Port())
	if !ok {
		return Simulation{}, badRequest("%s is not a VIP of this cluster, or %s is not IPv4", to.Addr(), client.Addr())
	}
	name := func(n filter.NodeID) string {
		if node := ms.rs.Node(n); node != nil {
			return node.Name
		}
		return ""
	}
	view := nodeIDs(ms.hb.View.Eligible)
	sim := Simulation{Rule: id, Bucket: bucket, IfDown: map[string]string{}}
	sim.Owner = name(filter.Assign(ms.fcfg, view).Rules[id][bucket])
	if t := ds.tables; t != nil {
		sim.Here = t.States[id][bucket].String()
	}
	for _, down := range view {
		rest := slices.DeleteFunc(slices.Clone(view), func(n filter.NodeID) bool { return n == down })
		sim.IfDown[name(down)] = name(filter.Assign(ms.fcfg, rest).Rules[id][bucket])
	}
	return sim, nil
}
