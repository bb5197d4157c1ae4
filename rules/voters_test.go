package rules

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func TestPlanVoters(t *testing.T) {
	pol := VoterPolicy{DeadAfter: 10 * time.Second, Stable: 10 * time.Second}
	now := time.Unix(1000, 0)
	long := now.Add(-time.Hour) // healthy (or dead) for an hour
	// srv: name, voter?, leader?, healthy?, since, zone.
	srv := func(name string, voter, leader, healthy bool, since time.Time, zone string) candidate {
		return candidate{ID: raft.ServerID(name), Voter: voter, Leader: leader, Healthy: healthy, Since: since, Zone: zone}
	}
	five := func(extra ...candidate) []candidate {
		c := []candidate{
			srv("n1", true, true, true, long, ""), srv("n2", true, false, true, long, ""), srv("n3", true, false, true, long, ""),
			srv("n4", true, false, true, long, ""), srv("n5", true, false, true, long, ""),
		}
		return append(c, extra...)
	}
	// dead marks the named voters as unhealthy since at.
	dead := func(c []candidate, at time.Time, names ...string) []candidate {
		for i := range c {
			if slices.Contains(names, string(c[i].ID)) {
				c[i].Healthy, c[i].Since = false, at
			}
		}
		return c
	}
	nonvoters := []candidate{srv("n6", false, false, true, long, ""), srv("n7", false, false, true, long, ""), srv("n8", false, false, true, now.Add(-time.Second), "")}
	tests := []struct {
		name            string
		servers         []candidate
		promote, demote []string
	}{
		{"five healthy voters stay", five(nonvoters...), nil, nil},
		{"fewer than five: the stable non-voters are promoted", five()[:3:3], nil, nil},
		{"three voters and stable non-voters: two promoted", append(five()[:3:3], nonvoters...), []string{"n6", "n7"}, nil},
		{"a voter dead within the bound is kept", dead(five(nonvoters...), now.Add(-5*time.Second), "n2"), nil, nil},
		{"two voters dead past the bound: replaced and demoted", dead(five(nonvoters...), now.Add(-11*time.Second), "n2", "n3"), []string{"n6", "n7"}, []string{"n2", "n3"}},
		{"a dead voter with no stable non-voter to replace it is demoted, down to the minimum",
			dead(five(nonvoters[2]), now.Add(-time.Minute), "n4", "n5"), nil, []string{"n4", "n5"}},
		{"never below the minimum quorum", dead(five()[:3:3], now.Add(-time.Minute), "n3"), nil, nil},
		{"the leader is never demoted", dead(five(nonvoters...), now.Add(-time.Minute), "n1"), nil, nil},
		{"a voter rebooted, healthy but not yet stable, keeps its vote",
			append(five()[:4:4], srv("n5", true, false, true, now.Add(-time.Second), ""), nonvoters[0]), nil, nil},
		{"a non-voter back for less than the stabilisation time is not promoted",
			append(five()[:4:4], srv("n9", false, false, true, now.Add(-9*time.Second), "")), nil, nil},
		{"six voters: the surplus is demoted", append(five(), srv("n6", true, false, true, now, "")), nil, []string{"n6"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			promote, demote := planVoters(tt.servers, pol, now)
			if fmt.Sprint(promote) != fmt.Sprint(ids(tt.promote)) || fmt.Sprint(demote) != fmt.Sprint(ids(tt.demote)) {
				t.Errorf("promote %v, demote %v; want %v, %v", promote, demote, tt.promote, tt.demote)
			}
		})
	}
}

// TestPlanVotersZones: voters are spread over zones, so that one lost
// zone takes as few as can be; a voter in a crowded zone gives its vote to
// a node of a zone without one (promoted first, demoted in a later round).
func TestPlanVotersZones(t *testing.T) {
	pol := VoterPolicy{DeadAfter: 10 * time.Second, Stable: 10 * time.Second}
	now := time.Unix(1000, 0)
	long := now.Add(-time.Hour)
	c := func(name, zone string, voter bool) candidate {
		return candidate{ID: raft.ServerID(name), Zone: zone, Voter: voter, Leader: name == "a1", Healthy: true, Since: long}
	}
	servers := []candidate{
		c("a1", "a", true), c("a2", "a", true), c("a3", "a", true), c("b1", "b", true), c("b2", "b", true),
		c("c1", "c", false), c("c2", "c", false), c("d1", "d", false), c("e1", "e", false),
	}
	promote, demote := planVoters(servers, pol, now)
	if fmt.Sprint(promote) != "[c1 d1 e1]" || len(demote) != 0 {
		t.Fatalf("promote %v, demote %v; want c1 d1 e1 promoted first", promote, demote)
	}
	for i := range servers {
		if slices.Contains(promote, servers[i].ID) {
			servers[i].Voter = true
		}
	}
	promote, demote = planVoters(servers, pol, now)
	if len(promote) != 0 || fmt.Sprint(demote) != "[a2 a3 b2]" {
		t.Fatalf("then promote %v, demote %v; want a2 a3 b2 demoted: one voter in each of five zones", promote, demote)
	}
}

func ids(names []string) []raft.ServerID {
	var out []raft.ServerID
	for _, n := range names {
		out = append(out, raft.ServerID(n))
	}
	return out
}

// TestZoneNeedsLevel4: a replica below level 4 refuses a registration
// with a zone (an unknown field), so one is proposed only once every
// member reports level 4; the zone is kept on re-registration and checked.
func TestZoneNeedsLevel4(t *testing.T) {
	tf := seeded(t)
	for i, n := range []string{"n1", "n2", "n3"} {
		info := nodeInfo(n, i+1)
		info.CommandLevel = 3
		tf.mustApply(&RegisterNode{Info: info})
	}
	zoned := nodeInfo("n1", 1)
	zoned.CommandLevel, zoned.Zone = 4, "rack-a"
	if err := tf.f.current().CheckSupported(&RegisterNode{Info: zoned}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("a zone with a member at level 3: %v, want ErrUnsupported", err)
	}
	for i, n := range []string{"n1", "n2", "n3"} {
		info := nodeInfo(n, i+1)
		info.CommandLevel = 4
		tf.mustApply(&RegisterNode{Info: info})
	}
	if err := tf.f.current().CheckSupported(&RegisterNode{Info: zoned}); err != nil {
		t.Fatalf("a zone with every member at level 4: %v", err)
	}
	tf.mustApply(&RegisterNode{Info: zoned})
	if z := tf.f.current().NodeByName("n1").Zone; z != "rack-a" {
		t.Errorf("n1's zone %q, want rack-a", z)
	}
	bad := zoned
	bad.Zone = "rack a"
	if err := tf.f.current().Check(&RegisterNode{Info: bad}); !errors.Is(err, ErrInvalid) {
		t.Errorf("zone %q: %v, want ErrInvalid", bad.Zone, err)
	}
}
