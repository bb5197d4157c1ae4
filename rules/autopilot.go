package rules

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"

	"github.com/shoalnet/shoal/filter"
)

// PeerHealth is what a node's heartbeats say of it, as this node heard
// them: the autopilot's stats for it, instead of a call to every server
// every round (at 64 nodes, 63 calls every 2 s; the heartbeats already
// carry what it needs).
type PeerHealth struct {
	Live       bool          // heard within the heartbeat tolerance
	LastHeard  time.Duration // since its last valid heartbeat
	RulesIndex uint64        // the rules index its heartbeat says it applied
}

// SetPeerHealth gives the store what it reads the members' health from
// (the agent's heartbeats); nil: every other member counts as unheard,
// and no voter is ever replaced. It must not block.
func (s *Store) SetPeerHealth(f func() map[filter.NodeID]PeerHealth) {
	s.apMu.Lock()
	defer s.apMu.Unlock()
	s.peerHealth = f
}

// VoterState is the autopilot's last view of the Raft members, for query
// and metrics.
type VoterState struct {
	At               time.Time     `json:"at"`
	Healthy          bool          `json:"healthy"`           // every member healthy
	FailureTolerance int           `json:"failure_tolerance"` // voters that may fail with writes still possible
	Servers          []VoterServer `json:"servers"`
	LastPromotion    *Promotion    `json:"last_promotion,omitempty"`
}

// VoterServer is one Raft member.
type VoterServer struct {
	Name    string    `json:"name"`
	Role    string    `json:"role"` // leader, voter or non-voter
	Healthy bool      `json:"healthy"`
	Since   time.Time `json:"since"` // when its health last changed
	Zone    string    `json:"zone,omitempty"`
}

// Promotion is a vote given or taken.
type Promotion struct {
	At       time.Time `json:"at"`
	Promoted string    `json:"promoted,omitempty"`
	Demoted  string    `json:"demoted,omitempty"`
}

// Voters returns the autopilot's last state; ok is false on a node that is
// not the leader (only the leader runs it; ask it, or read Members).
func (s *Store) Voters() (VoterState, bool) {
	s.apMu.Lock()
	defer s.apMu.Unlock()
	if s.apState == nil || !s.IsLeader() {
		return VoterState{}, false
	}
	vs := *s.apState
	vs.LastPromotion = s.lastPromotion
	return vs, true
}

// runAutopilot runs the voter policy while this node leads, until the
// store closes.
func (s *Store) runAutopilot() {
	defer s.bg.Done()
	pol := s.cfg.Voters
	ap := autopilot.New(apRaft{s.raft, s}, apDelegate{s},
		autopilot.WithLogger(newHCLogger(s.log, &s.closing).Named("autopilot")),
		autopilot.WithPromoter(&voterPromoter{policy: pol, zone: s.zoneOf, active: func() bool { return s.health() != nil }, now: time.Now}),
		autopilot.WithReconcileInterval(pol.Interval),
		autopilot.WithUpdateInterval(pol.Interval/2))
	seen := make(chan raft.Observation, 4)
	obs := raft.NewObserver(seen, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.RaftState)
		return ok
	})
	s.raft.RegisterObserver(obs)
	defer s.raft.DeregisterObserver(obs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	running := false
	for {
		if leads := s.raft.State() == raft.Leader; leads != running {
			if leads {
				ap.Start(ctx)
			} else {
				<-ap.Stop()
				s.apMu.Lock()
				s.apState = nil
				s.apMu.Unlock()
			}
			running = leads
		}
		select {
		case <-s.closed:
			<-ap.Stop()
			return
		case <-seen:
		}
	}
}

// zoneOf returns the zone a member registered.
func (s *Store) zoneOf(id raft.ServerID) string {
	if n := s.fsm.current().NodeByName(string(id)); n != nil {
		return n.Zone
	}
	return ""
}

// apRaft is the store's Raft as autopilot drives it: promotions and
// demotions are recorded for query.
type apRaft struct {
	*raft.Raft
	s *Store
}

func (r apRaft) AddVoter(id raft.ServerID, addr raft.ServerAddress, prev uint64, timeout time.Duration) raft.IndexFuture {
	f := r.Raft.AddVoter(id, addr, prev, timeout)
	if f.Error() == nil {
		r.s.notePromotion(Promotion{At: time.Now(), Promoted: string(id)})
	}
	return f
}

func (r apRaft) DemoteVoter(id raft.ServerID, prev uint64, timeout time.Duration) raft.IndexFuture {
	f := r.Raft.DemoteVoter(id, prev, timeout)
	if f.Error() == nil {
		r.s.notePromotion(Promotion{At: time.Now(), Demoted: string(id)})
	}
	return f
}

func (s *Store) notePromotion(p Promotion) {
	s.log.Info("raft voters changed", "promoted", p.Promoted, "demoted", p.Demoted)
	s.apMu.Lock()
	s.lastPromotion = &p
	s.apMu.Unlock()
	s.votersChanged.Add(1)
}

// VoterChanges counts the promotions and demotions this node made as
// leader, for metrics.
func (s *Store) VoterChanges() uint64 { return s.votersChanged.Load() }

// apDelegate is the store as autopilot's application.
type apDelegate struct{ s *Store }

func (d apDelegate) AutopilotConfig() *autopilot.Config {
	pol := d.s.cfg.Voters
	return &autopilot.Config{
		CleanupDeadServers:      true, // servers that left the registry; failed ones are demoted instead
		LastContactThreshold:    pol.Contact,
		MaxTrailingLogs:         250,
		MinQuorum:               MinQuorum,
		ServerStabilizationTime: pol.Stable,
	}
}

// KnownServers: the registered nodes, alive while their heartbeats are
// heard (this node is).
func (d apDelegate) KnownServers() map[raft.ServerID]*autopilot.Server {
	st := d.s.fsm.current()
	health := d.s.health()
	_, leader := d.s.raft.LeaderWithID()
	out := make(map[raft.ServerID]*autopilot.Server, len(st.Nodes))
	for _, n := range st.Nodes {
		status := autopilot.NodeFailed
		if h, ok := health[n.ID]; n.Name == d.s.cfg.NodeName || ok && h.Live {
			status = autopilot.NodeAlive
		}
		out[raft.ServerID(n.Name)] = &autopilot.Server{
			ID: raft.ServerID(n.Name), Name: n.Name, Address: raft.ServerAddress(n.RaftAddr),
			NodeStatus: status, Version: strconv.Itoa(n.level()), RaftVersion: raft.ProtocolVersionMax,
			IsLeader: raft.ServerID(n.Name) == leader,
		}
	}
	return out
}

// FetchServerStats answers from the heartbeats: a member heard lately with
// its rules caught up is in this term (heartbeats carry no term: one that
// is heard and current follows this leader, or soon will).
func (d apDelegate) FetchServerStats(_ context.Context, servers map[raft.ServerID]*autopilot.Server) map[raft.ServerID]*autopilot.ServerStats {
	term, _ := strconv.ParseUint(d.s.raft.Stats()["term"], 10, 64)
	last := d.s.raft.LastIndex()
	st := d.s.fsm.current()
	health := d.s.health()
	out := make(map[raft.ServerID]*autopilot.ServerStats, len(servers))
	for id := range servers {
		if string(id) == d.s.cfg.NodeName {
			out[id] = &autopilot.ServerStats{LastTerm: term, LastIndex: last}
			continue
		}
		n := st.NodeByName(string(id))
		if n == nil {
			continue
		}
		h, ok := health[n.ID]
		if !ok {
			continue
		}
		// The rules index a node applied trails the log's last index by
		// the entries that are no command (configuration changes): count
		// it as the log index when it matches this node's own rules.
		idx := h.RulesIndex
		if idx >= st.Index {
			idx = max(idx, last)
		}
		out[id] = &autopilot.ServerStats{LastContact: h.LastHeard, LastTerm: term, LastIndex: idx}
	}
	return out
}

func (d apDelegate) NotifyState(st *autopilot.State) {
	vs := &VoterState{At: time.Now(), Healthy: st.Healthy, FailureTolerance: st.FailureTolerance}
	for id, srv := range st.Servers {
		role := "non-voter"
		switch srv.State {
		case autopilot.RaftLeader:
			role = "leader"
		case autopilot.RaftVoter, autopilot.RaftStaging:
			role = "voter"
		}
		vs.Servers = append(vs.Servers, VoterServer{Name: string(id), Role: role, Healthy: srv.Health.Healthy, Since: srv.Health.StableSince, Zone: d.s.zoneOf(id)})
	}
	sortVoterServers(vs.Servers)
	d.s.apMu.Lock()
	d.s.apState = vs
	d.s.apMu.Unlock()
}

// RemoveFailedServer is never asked for: the promoter filters failed
// servers out of autopilot's removals (a failed voter is demoted).
func (d apDelegate) RemoveFailedServer(*autopilot.Server) {}

func (s *Store) health() map[filter.NodeID]PeerHealth {
	s.apMu.Lock()
	f := s.peerHealth
	s.apMu.Unlock()
	if f == nil {
		return nil
	}
	return f()
}

// apFields are the store's autopilot state, guarded by apMu.
type apFields struct {
	apMu          sync.Mutex
	peerHealth    func() map[filter.NodeID]PeerHealth
	apState       *VoterState
	lastPromotion *Promotion
}

// sortVoterServers orders the leader first, then voters, then non-voters,
// each by name.
func sortVoterServers(ss []VoterServer) {
	order := map[string]int{"leader": 0, "voter": 1, "non-voter": 2}
	slices.SortFunc(ss, func(a, b VoterServer) int {
		return cmp.Or(cmp.Compare(order[a.Role], order[b.Role]), cmp.Compare(a.Name, b.Name))
	})
}
