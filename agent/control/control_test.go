package control

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/rules"
)

// fakeStore records the command the Commander proposes.
type fakeStore struct {
	st  *rules.State
	got rules.Command   // the last
	all []rules.Command // every one, in order
}

func (f *fakeStore) Apply(_ context.Context, cmd rules.Command) (rules.Result, error) {
	f.got = cmd
	f.all = append(f.all, cmd)
	return rules.Result{}, nil
}
func (f *fakeStore) State() *rules.State { return f.st.Clone() }

var (
	testVIP  = netip.MustParseAddr("198.18.7.100")
	otherVIP = netip.MustParseAddr("198.18.7.101")
)

// testState holds two VIPs and two rules: 1 is tcp VIP:80, draining,
// multiple hosts, affinity none; 2 is tcp every VIP 443.
func testState() *rules.State {
	return &rules.State{
		Settings: rules.Settings{ClusterID: 1, HashSeed: 5, HeartbeatPeriod: 75 * time.Millisecond, HeartbeatTolerance: 12},
		VIPs:     []netip.Addr{testVIP, otherVIP},
		Rules: []filter.Rule{
			{ID: 1, VIP: testVIP, PortLo: 80, PortHi: 80, Proto: filter.ProtoTCP, Mode: filter.ModeMultiple, Affinity: filter.AffinityNone, State: filter.RuleDraining},
			{ID: 2, PortLo: 443, PortHi: 443, Proto: filter.ProtoTCP, Mode: filter.ModeMultiple, Affinity: filter.AffinitySingle},
		},
		LastRuleID: 2,
	}
}

func TestEditRule(t *testing.T) {
	base := testState().Rules[0]
	tests := []struct {
		name   string
		target string
		req    RuleEditRequest
		want   filter.Rule // the rule PutRule carries
		err    error
	}{
		{"affinity", "198.18.7.100:80", RuleEditRequest{Affinity: "single"},
			func() filter.Rule { r := base; r.Affinity = filter.AffinitySingle; return r }(), nil},
		{"ports and affinity by id", "1", RuleEditRequest{Ports: "80-81", Affinity: "network"},
			func() filter.Rule { r := base; r.PortHi, r.Affinity = 81, filter.AffinityNetwork; return r }(), nil},
		{"mode and proto", "1", RuleEditRequest{Mode: "single", Proto: "both"},
			func() filter.Rule { r := base; r.Mode, r.Proto = filter.ModeSingle, filter.ProtoBoth; return r }(), nil},
		{"another vip", "1", RuleEditRequest{VIP: "198.18.7.101"},
			func() filter.Rule { r := base; r.VIP = otherVIP; return r }(), nil},
		{"every vip", "198.18.7.100:80", RuleEditRequest{VIP: "all"},
			func() filter.Rule { r := base; r.VIP = netip.Addr{}; return r }(), nil},
		{"nothing to change", "1", RuleEditRequest{}, filter.Rule{}, ErrBadRequest},
		{"bad affinity", "1", RuleEditRequest{Affinity: "sticky"}, filter.Rule{}, ErrBadRequest},
		{"bad ports", "1", RuleEditRequest{Ports: "90-80"}, filter.Rule{}, ErrBadRequest},
		{"bad vip", "1", RuleEditRequest{VIP: "nowhere"}, filter.Rule{}, ErrBadRequest},
		{"unknown rule", "9", RuleEditRequest{Affinity: "single"}, filter.Rule{}, rules.ErrUnknownRule},
		{"not a cluster vip", "1", RuleEditRequest{VIP: "198.18.7.200"}, filter.Rule{}, rules.ErrUnknownVIP},
		// Rule 2 covers every VIP's port 443: moving rule 1 there on every
		// VIP overlaps it.
		{"overlap", "1", RuleEditRequest{VIP: "all", Ports: "443"}, filter.Rule{}, rules.ErrConflict},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := &fakeStore{st: testState()}
			c := &Commander{store: fs, self: func() filter.NodeID { return 1 }}
			info, err := c.EditRule(context.Background(), tc.target, tc.req)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || fs.got != nil {
					t.Fatalf("editRule: %v, proposed %v; want %v and nothing proposed", err, fs.got, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			put, ok := fs.got.(*rules.PutRule)
			if !ok {
				t.Fatalf("proposed %T, want *rules.PutRule", fs.got)
			}
			if diff := cmp.Diff(tc.want, put.Rule, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("PutRule (-want +got):\n%s", diff)
			}
			if info.ID != 1 || info.Affinity != tc.want.Affinity.String() {
				t.Errorf("answer %+v, want rule 1 with affinity %s", info, tc.want.Affinity)
			}
		})
	}
}

// TestSetWeightPairs: a weight on several rules and nodes is one write, so
// one view change, unless a member is too old to read it; then one write
// per pair, as before.
func TestSetWeightPairs(t *testing.T) {
	withNodes := func(level int) *rules.State {
		st := testState()
		for i, name := range []string{"n1", "n2", "n3"} {
			st.Nodes = append(st.Nodes, rules.Node{ID: filter.NodeID(i + 1), NodeInfo: rules.NodeInfo{Name: name, HostPriority: i + 1, CommandLevel: level,
				HeartbeatAddr: fmt.Sprintf("198.18.7.%d:7946", i+1), RaftAddr: fmt.Sprintf("198.18.7.%d:7000", i+1), APIAddr: fmt.Sprintf("198.18.7.%d:7001", i+1)}})
		}
		st.LastNodeID = 3
		return st
	}
	both, two := []filter.RuleID{1, 2}, []filter.NodeID{2, 3}
	pair := func(r filter.RuleID, n filter.NodeID) rules.Command {
		return rules.NewSetWeight([]filter.RuleID{r}, []filter.NodeID{n}, 0)
	}
	tests := []struct {
		name  string
		level int
		req   WeightRequest
		want  []rules.Command
		err   error
	}{
		{"one pair", rules.CommandLevel, WeightRequest{Rule: "1", Node: "n2", Weight: "0"}, []rules.Command{pair(1, 2)}, nil},
		{"every pair in one write", rules.CommandLevel, WeightRequest{Rule: "all", Node: "n2, n3", Weight: "0"},
			[]rules.Command{rules.NewSetWeight(both, two, 0)}, nil},
		{"a write per pair beside an older member", 5, WeightRequest{Rule: "all", Node: "n2,n3", Weight: "0"},
			[]rules.Command{pair(1, 2), pair(1, 3), pair(2, 2), pair(2, 3)}, nil},
		{"an unknown node in the list", rules.CommandLevel, WeightRequest{Rule: "all", Node: "n2,n9", Weight: "0"}, nil, rules.ErrUnknownNode},
		{"an empty name in the list", rules.CommandLevel, WeightRequest{Rule: "all", Node: "n2,", Weight: "0"}, nil, ErrBadRequest},
		{"no node: this one", rules.CommandLevel, WeightRequest{Rule: "1", Weight: "equal"},
			[]rules.Command{rules.NewSetWeight([]filter.RuleID{1}, []filter.NodeID{1}, rules.WeightEqual)}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := &fakeStore{st: withNodes(tc.level)}
			c := &Commander{store: fs, self: func() filter.NodeID { return 1 }}
			err := c.SetWeight(context.Background(), tc.req)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || fs.all != nil {
					t.Fatalf("SetWeight: %v, proposed %v; want %v and nothing proposed", err, fs.all, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, fs.all); diff != "" {
				t.Errorf("proposed (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSetSettings(t *testing.T) {
	seed, tol := uint32(99), 20
	period := 50 * time.Millisecond
	tests := []struct {
		name string
		req  SettingsRequest
		want *rules.SetSettings
		err  error
	}{
		{"seed", SettingsRequest{HashSeed: &seed}, &rules.SetSettings{HashSeed: &seed}, nil},
		{"seed zero", SettingsRequest{HashSeed: new(uint32)}, &rules.SetSettings{HashSeed: new(uint32)}, nil},
		{"heartbeat", SettingsRequest{HeartbeatPeriod: "50ms", HeartbeatTolerance: &tol},
			&rules.SetSettings{HeartbeatPeriod: &period, HeartbeatTolerance: &tol}, nil},
		{"nothing", SettingsRequest{}, nil, ErrBadRequest},
		{"bad period", SettingsRequest{HeartbeatPeriod: "soon"}, nil, ErrBadRequest},
		{"period out of range", SettingsRequest{HeartbeatPeriod: "1ms"}, nil, rules.ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := &fakeStore{st: testState()}
			c := &Commander{store: fs, self: func() filter.NodeID { return 1 }}
			err := c.SetSettings(context.Background(), tc.req)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || fs.got != nil {
					t.Fatalf("setSettings: %v, proposed %v; want %v and nothing proposed", err, fs.got, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, fs.got); diff != "" {
				t.Errorf("proposed (-want +got):\n%s", diff)
			}
		})
	}
}
