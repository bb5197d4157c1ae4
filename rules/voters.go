package rules

import (
	"cmp"
	"slices"
	"time"

	"github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"
)

// VoterPolicy is how the leader keeps MaxVoters voters as nodes fail and
// come back (DESIGN.md, "Replicated rules"). hashicorp/raft-autopilot runs
// it: it gathers each server's health (from the heartbeats, see
// PeerHealth) and applies the changes voterPromoter asks for, a step at a
// time, promotions before demotions.
type VoterPolicy struct {
	// DeadAfter: a voter unhealthy this long (not heard, or its rules
	// behind) is demoted to a non-voter, so that a healthy node can take
	// its vote. It stays registered and in Raft, and votes again only if
	// promoted again.
	DeadAfter time.Duration
	// Stable: a non-voter is promoted only once healthy this long.
	Stable time.Duration
	// Contact: a server not heard from this long is unhealthy.
	Contact time.Duration
	// Interval between the policy's rounds; the servers' health is
	// gathered every half of it.
	Interval time.Duration
}

// DefaultVoterPolicy: a dead voter is replaced about 15 s after it died
// (10 s dead, then a round or two of 2 s), and a node that came back
// votes again only after 10 s of health.
func DefaultVoterPolicy() VoterPolicy {
	return VoterPolicy{DeadAfter: 10 * time.Second, Stable: 10 * time.Second, Contact: 2 * time.Second, Interval: 2 * time.Second}
}

// MinQuorum is the fewest voters the policy leaves: it never demotes below
// it (Consul's dead-server cleanup once shrank a cluster to two voters, and
// its MinQuorum came from that).
const MinQuorum = 3

// voterPromoter is the autopilot.Promoter that keeps MaxVoters voters,
// spread over zones. Its core, planVoters, is pure.
type voterPromoter struct {
	policy VoterPolicy
	zone   func(id raft.ServerID) string // the server's zone label ("": none)
	active func() bool                   // the members' health is known (heartbeats): else no change
	now    func() time.Time
}

var _ autopilot.Promoter = (*voterPromoter)(nil)

func (p *voterPromoter) GetServerExt(*autopilot.Config, *autopilot.ServerState) any { return nil }
func (p *voterPromoter) GetStateExt(*autopilot.Config, *autopilot.State) any        { return nil }

// GetNodeTypes: every server may vote.
func (p *voterPromoter) GetNodeTypes(_ *autopilot.Config, s *autopilot.State) map[raft.ServerID]autopilot.NodeType {
	types := make(map[raft.ServerID]autopilot.NodeType, len(s.Servers))
	for id := range s.Servers {
		types[id] = autopilot.NodeVoter
	}
	return types
}

func (p *voterPromoter) IsPotentialVoter(t autopilot.NodeType) bool { return t == autopilot.NodeVoter }

// FilterFailedServerRemovals keeps autopilot's removal of servers that
// left the registry (stale ones) and drops its removal of failed ones: a
// failed voter is demoted by the plan instead, and stays a member that
// may come back.
func (p *voterPromoter) FilterFailedServerRemovals(_ *autopilot.Config, _ *autopilot.State, f *autopilot.FailedServers) *autopilot.FailedServers {
	return &autopilot.FailedServers{StaleVoters: f.StaleVoters, StaleNonVoters: f.StaleNonVoters}
}

func (p *voterPromoter) CalculatePromotionsAndDemotions(_ *autopilot.Config, s *autopilot.State) autopilot.RaftChanges {
	if !p.active() {
		return autopilot.RaftChanges{}
	}
	var servers []candidate
	for id, st := range s.Servers {
		servers = append(servers, candidate{
			ID: id, Zone: p.zone(id), Voter: st.HasVotingRights(), Leader: st.State == autopilot.RaftLeader,
			Healthy: st.Health.Healthy, Since: st.Health.StableSince,
		})
	}
	promote, demote := planVoters(servers, p.policy, p.now())
	return autopilot.RaftChanges{Promotions: promote, Demotions: demote}
}

// candidate is one server as planVoters sees it.
type candidate struct {
	ID      raft.ServerID
	Zone    string
	Voter   bool
	Leader  bool
	Healthy bool
	Since   time.Time // when its health last changed
}

// planVoters chooses the voters: up to MaxVoters among the leader, the
// voters not dead past DeadAfter and the non-voters healthy for Stable,
// preferring the leader, then voters (no churn), then the longest healthy,
// and spreading them over zones (each pick from a zone with the fewest
// picked). It returns the non-voters to promote and the voters to demote;
// it never demotes below MinQuorum voters, nor demotes a healthy voter
// before the promotions that replace it are done (autopilot applies
// promotions first and demotes in a later round).
func planVoters(servers []candidate, pol VoterPolicy, now time.Time) (promote, demote []raft.ServerID) {
	usable := func(c candidate) bool {
		switch {
		case c.Leader:
			return true
		case c.Voter:
			return c.Healthy || now.Sub(c.Since) < pol.DeadAfter
		default:
			return c.Healthy && now.Sub(c.Since) >= pol.Stable
		}
	}
	rank := func(c candidate) int {
		switch {
		case c.Leader:
			return 0
		case c.Voter:
			return 1 // healthy, or dead within DeadAfter: keeps its vote
		default:
			return 2
		}
	}
	var pool []candidate
	for _, c := range servers {
		if usable(c) {
			pool = append(pool, c)
		}
	}
	slices.SortFunc(pool, func(a, b candidate) int {
		return cmp.Or(cmp.Compare(rank(a), rank(b)), a.Since.Compare(b.Since), cmp.Compare(a.ID, b.ID))
	})
	perZone := map[string]int{}
	chosen := map[raft.ServerID]bool{}
	for len(chosen) < MaxVoters {
		best := -1
		for i, c := range pool {
			if chosen[c.ID] {
				continue
			}
			if best < 0 || perZone[c.Zone] < perZone[pool[best].Zone] {
				best = i
			}
		}
		if best < 0 {
			break
		}
		chosen[pool[best].ID] = true
		perZone[pool[best].Zone]++
	}
	voters := 0
	for _, c := range servers {
		switch {
		case c.Voter:
			voters++
		case chosen[c.ID]:
			promote = append(promote, c.ID)
		}
	}
	slices.Sort(promote)
	// Demote: the dead first, then the surplus; healthy ones only once
	// nothing is left to promote, and never below MinQuorum.
	var out []candidate
	for _, c := range servers {
		if c.Voter && !c.Leader && !chosen[c.ID] && (len(promote) == 0 || !c.Healthy) {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b candidate) int {
		if a.Healthy != b.Healthy {
			if !a.Healthy {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.ID, b.ID)
	})
	for _, c := range out {
		if voters-1 < MinQuorum {
			break
		}
		demote = append(demote, c.ID)
		voters--
	}
	return promote, demote
}
