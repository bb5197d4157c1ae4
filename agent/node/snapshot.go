package node

import (
	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
)

// The APIs and metrics read only what the goroutines publish (membership's
// Snap, the reconciler's dataSnap): a scrape or a status request never
// takes a lock a loop holds, and never delays a heartbeat.

// status is the node's part of Status, from the published snapshots.
func (n *Node) Status() control.Status {
	ms, ds := n.mem.snap.Load(), n.rec.pub.Load()
	st := ms.hb
	s := control.Status{
		NodeID: n.self, Admin: ms.admin.String(), Converged: st.Converged, Healthy: true,
		RulesIndex: ms.rs.Index, TablesIndex: ds.tablesIndex, Connections: ds.conns, Plugged: ms.plugged,
		View:      control.ViewInfo{Eligible: nodeIDs(st.View.Eligible), RulesIndex: st.View.RulesIndex, Seed: st.View.Seed},
		Accepting: map[filter.RuleID]int{}, Draining: map[filter.RuleID]int{}, Dirty: map[filter.RuleID]int{},
		Live:             sortedLive(n.self, st),
		DataplaneHealthy: ds.healthy, DataplaneError: ds.lastErr, UpdateFailures: n.rec.failures.Load(),
		Leaving:         ms.leaving,
		HeartbeatPeriod: st.Period.String(), HeartbeatTolerance: st.Tolerance, PeerDeaths: st.Deaths, Stalls: st.Stalls,
	}
	if ds.healthy {
		s.DataplaneError = ""
	}
	if !ds.tablesAt.IsZero() {
		s.TablesAt = ds.tablesAt.UTC()
	}
	if t := ds.tables; t != nil {
		s.Dirty = stateCounts(t, filter.OwnedDirty)
		s.Draining = stateCounts(t, filter.Draining)
		for id, k := range stateCounts(t, filter.Owned) {
			s.Accepting[id] = k + s.Dirty[id]
		}
		for id, k := range s.Dirty {
			if _, ok := s.Accepting[id]; !ok {
				s.Accepting[id] = k
			}
		}
	}
	return s
}

// params is the node's part of Params: packet and heartbeat counters.
func (n *Node) Params() control.Params {
	ms := n.mem.snap.Load()
	p := control.Params{Settings: control.SettingsOf(ms.rs.Settings), Packets: map[filter.RuleID]control.PacketCounters{},
		Heartbeat: heartbeatStats(n.link.Stats()), ARP: map[string]uint64{}}
	if c, err := n.dp.Counters(); err == nil {
		for id, rc := range c {
			pc := control.PacketCounters{Accepted: rc.Accepted, Dropped: map[string]uint64{}, Forwarded: rc.Forwarded}
			if h := map[string]uint64{"out": rc.HandedOver, "in": rc.HandedIn, "refused": rc.HandedRefused}; rc.HandedOver+rc.HandedIn+rc.HandedRefused > 0 {
				pc.Handed = h
			}
			for r, k := range rc.Dropped {
				if k > 0 {
					pc.Dropped[filter.DropReason(r).String()] = k
				}
			}
			p.Packets[id] = pc
		}
	}
	return p
}

func heartbeatStats(st heartbeat.Stats) map[string]uint64 {
	m := map[string]uint64{"sent": st.Sent, "send_errors": st.SendErrors, "received": st.Received, "accepted": st.Accepted, "socket_reopens": st.Reopens,
		"sent_bytes": st.SentBytes, "received_bytes": st.ReceivedBytes}
	for r, n := range st.Rejected {
		if n > 0 {
			m["rejected_"+heartbeat.Reason(r).String()] = n
		}
	}
	return m
}
