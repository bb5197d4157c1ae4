package agent

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
	"github.com/shoalnet/shoal/rules"
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
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.plugged == r.Pulled {
		return nil
	}
	a.plugged = r.Pulled
	a.log.Warn("virtual plug", "pulled", r.Pulled)
	if !r.Pulled {
		if err := a.newMachine(time.Now()); err != nil {
			return err
		}
	}
	a.reconcile()
	return nil
}

func (a *Agent) status() Status {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.hbStatus
	s := Status{
		NodeID: a.self, NodeName: a.cfg.NodeName, Admin: "unknown",
		Healthy: a.hc == nil || a.hc.healthy.Load(), Converged: st.Converged,
		RulesIndex: a.rstate.Index, TablesIndex: a.tablesIndex, Connections: a.conns, Plugged: a.plugged,
		View:      ViewInfo{Eligible: nodeIDs(st.View.Eligible), RulesIndex: st.View.RulesIndex, Seed: st.View.Seed},
		Accepting: map[filter.RuleID]int{}, Draining: map[filter.RuleID]int{}, Dirty: map[filter.RuleID]int{},
		Live: []filter.NodeID{a.self},
	}
	if a.hc != nil {
		s.HealthError, _ = a.hc.lastErr.Load().(string)
		if s.Healthy {
			s.HealthError = ""
		}
	}
	if a.host != nil {
		if ok, why := a.host.hostHealthy(); !ok {
			s.Healthy = false
			s.HealthError = strings.TrimPrefix(s.HealthError+"; data plane: "+why, "; ")
		}
	}
	// The admin state as replicated, which may be a step ahead of the
	// tables: a command that returned has changed it.
	if n := a.store.State().Node(a.self); n != nil {
		s.Admin = n.Admin.String()
	}
	for _, p := range st.Peers {
		if p.Live {
			s.Live = append(s.Live, filter.NodeID(p.ID))
		}
	}
	slices.Sort(s.Live)
	if t := a.last.tables; t != nil {
		s.Dirty = stateCounts(t, filter.OwnedDirty)
		s.Draining = stateCounts(t, filter.Draining)
		for id, n := range stateCounts(t, filter.Owned) {
			s.Accepting[id] = n + s.Dirty[id]
		}
		for id, n := range s.Dirty {
			if _, ok := s.Accepting[id]; !ok {
				s.Accepting[id] = n
			}
		}
	}
	s.Leader, _ = a.store.Leader()
	s.RulesStopped = rulesStopped(a.store)
	return s
}

func nodeIDs(ids []uint32) []filter.NodeID {
	out := make([]filter.NodeID, len(ids))
	for i, id := range ids {
		out[i] = filter.NodeID(id)
	}
	return out
}

func (a *Agent) query() Query {
	a.mu.Lock()
	rs, hb, self := a.rstate, a.hbStatus, a.self
	owners := a.assigner.Assign(a.fcfg, nodeIDs(hb.View.Eligible))
	a.mu.Unlock()
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
			ni.Live, ni.Healthy = true, a.hc == nil || a.hc.healthy.Load()
		} else if i, ok := peers[n.ID]; ok {
			ni.Live, ni.Healthy = hb.Peers[i].Live, hb.Peers[i].Healthy
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

func settingInfo(s rules.Settings) SettingInfo {
	return SettingInfo{ClusterID: s.ClusterID, HashSeed: s.HashSeed, HeartbeatPeriod: s.HeartbeatPeriod.String(), HeartbeatTolerance: s.HeartbeatTolerance}
}

func (a *Agent) params() Params {
	a.mu.Lock()
	rs := a.rstate
	a.mu.Unlock()
	p := Params{Config: *a.cfg, Settings: settingInfo(rs.Settings), Packets: map[filter.RuleID]PacketCounters{},
		Heartbeat: heartbeatStats(a.link.Stats()), ARP: map[string]uint64{}}
	if c, err := a.dp.Counters(); err == nil {
		for id, rc := range c {
			pc := PacketCounters{Accepted: rc.Accepted, Dropped: map[string]uint64{}}
			for r, n := range rc.Dropped {
				if n > 0 {
					pc.Dropped[filter.DropReason(r).String()] = n
				}
			}
			p.Packets[id] = pc
		}
	}
	if a.host != nil {
		p.ARP = a.host.arpCounters()
	}
	return p
}

func heartbeatStats(st heartbeat.Stats) map[string]uint64 {
	m := map[string]uint64{"sent": st.Sent, "send_errors": st.SendErrors, "received": st.Received, "accepted": st.Accepted}
	for r, n := range st.Rejected {
		if n > 0 {
			m["rejected_"+heartbeat.Reason(r).String()] = n
		}
	}
	return m
}

// simulate says which node takes a flow now, and which would if any one
// node failed.
func (a *Agent) simulate(client, to netip.AddrPort, proto string) (Simulation, error) {
	p, err := filter.ParseProtocol(orDefault(proto, "tcp"))
	if err != nil || p == filter.ProtoBoth {
		return Simulation{}, badRequest("proto %q: want tcp or udp", proto)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	id, bucket, ok := a.fcfg.Locate(to.Addr(), p, client.Addr(), client.Port(), to.Port())
	if !ok {
		return Simulation{}, badRequest("%s is not a VIP of this cluster, or %s is not IPv4", to.Addr(), client.Addr())
	}
	name := func(n filter.NodeID) string {
		if node := a.rstate.Node(n); node != nil {
			return node.Name
		}
		return ""
	}
	view := nodeIDs(a.hbStatus.View.Eligible)
	sim := Simulation{Rule: id, Bucket: bucket, IfDown: map[string]string{}}
	sim.Owner = name(a.assigner.Assign(a.fcfg, view).Rules[id][bucket])
	if t := a.last.tables; t != nil {
		sim.Here = t.States[id][bucket].String()
	}
	for _, down := range view {
		rest := slices.DeleteFunc(slices.Clone(view), func(n filter.NodeID) bool { return n == down })
		sim.IfDown[name(down)] = name(filter.Assign(a.fcfg, rest).Rules[id][bucket])
	}
	return sim, nil
}
