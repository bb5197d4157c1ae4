package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/hashicorp/raft"

	"github.com/shoalnet/shoal/filter"
)

var (
	vip1 = netip.MustParseAddr("198.18.0.100")
	vip2 = netip.MustParseAddr("198.18.0.101")
)

// testFSM feeds commands to an fsm as raft log entries, numbering them.
type testFSM struct {
	t       testing.TB
	f       *fsm
	index   uint64
	notices int
}

func newTestFSM(t testing.TB) *testFSM {
	tf := &testFSM{t: t}
	tf.f = newFSM(func() { tf.notices++ })
	return tf
}

func (tf *testFSM) apply(cmd Command) (Result, error) {
	tf.t.Helper()
	data, err := EncodeCommand(cmd)
	if err != nil {
		tf.t.Fatalf("encode %T: %v", cmd, err)
	}
	tf.index++
	ar, ok := tf.f.Apply(&raft.Log{Index: tf.index, Term: 1, Type: raft.LogCommand, Data: data}).(applyResult)
	if !ok {
		tf.t.Fatalf("apply %T: result is not an applyResult", cmd)
	}
	return ar.res, ar.err
}

func (tf *testFSM) mustApply(cmd Command) Result {
	tf.t.Helper()
	res, err := tf.apply(cmd)
	if err != nil {
		tf.t.Fatalf("apply %T %+v: %v", cmd, cmd, err)
	}
	return res
}

func nodeInfo(name string, prio int) NodeInfo {
	return NodeInfo{Name: name, HostPriority: prio, HeartbeatAddr: "198.18.1.1:7946", RaftAddr: "198.18.1." + name[len(name)-1:] + ":7000", APIAddr: "198.18.1.1:7001"}
}

func testSettings() Settings {
	return Settings{ClusterID: 0xc0ffee, HashSeed: 42, HeartbeatPeriod: 200 * time.Millisecond, HeartbeatTolerance: 5}
}

// seeded returns an fsm holding a small cluster: two VIPs, three nodes
// (ids 1-3, host priorities 1-3), rule 1 (tcp vip1:80) and rule 2 (udp
// all vips 5000-5100, single host).
func seeded(t testing.TB) *testFSM {
	tf := newTestFSM(t)
	tf.mustApply(&InitCluster{Settings: testSettings()})
	tf.mustApply(&PutVIP{VIP: vip1})
	tf.mustApply(&PutVIP{VIP: vip2})
	for i, n := range []string{"n1", "n2", "n3"} {
		tf.mustApply(&RegisterNode{Info: nodeInfo(n, i+1)})
	}
	tf.mustApply(&PutRule{Rule: filter.Rule{VIP: vip1, PortLo: 80, PortHi: 80, Proto: filter.ProtoTCP, Affinity: filter.AffinitySingle}})
	tf.mustApply(&PutRule{Rule: filter.Rule{PortLo: 5000, PortHi: 5100, Proto: filter.ProtoUDP, Mode: filter.ModeSingle}})
	return tf
}

var stateOpts = cmp.Options{cmpopts.EquateEmpty(), cmpopts.EquateComparable(netip.Addr{})}

func TestFSMCommands(t *testing.T) {
	u32 := func(v uint32) *uint32 { return &v }
	dur := func(v time.Duration) *time.Duration { return &v }
	intp := func(v int) *int { return &v }
	tests := []struct {
		name   string
		cmd    Command
		want   Result
		change func(s *State) // what the command does to the seeded state
	}{
		{"put vip", &PutVIP{VIP: netip.MustParseAddr("198.18.0.7")}, Result{}, func(s *State) {
			s.VIPs = []netip.Addr{netip.MustParseAddr("198.18.0.7"), vip1, vip2}
		}},
		{"put existing vip is a no-op", &PutVIP{VIP: vip2}, Result{}, func(s *State) {}},
		{"remove unused vip", &RemoveVIP{VIP: vip2}, Result{}, func(s *State) { s.VIPs = []netip.Addr{vip1} }},
		{"put new rule", &PutRule{Rule: filter.Rule{VIP: vip2, PortLo: 443, PortHi: 443, Proto: filter.ProtoBoth}}, Result{RuleID: 3}, func(s *State) {
			s.Rules = append(s.Rules, filter.Rule{ID: 3, VIP: vip2, PortLo: 443, PortHi: 443, Proto: filter.ProtoBoth})
			s.LastRuleID = 3
		}},
		{"replace rule", &PutRule{Rule: filter.Rule{ID: 1, VIP: vip1, PortLo: 80, PortHi: 81, Proto: filter.ProtoTCP}}, Result{RuleID: 1}, func(s *State) {
			s.Rules[0] = filter.Rule{ID: 1, VIP: vip1, PortLo: 80, PortHi: 81, Proto: filter.ProtoTCP}
		}},
		{"remove rule drops node settings", &RemoveRule{ID: 1}, Result{RuleID: 1}, func(s *State) {
			s.Rules = s.Rules[1:]
			s.Nodes[0].Rules = nil
		}},
		{"drain rule cluster-wide", &SetRuleState{Rules: []filter.RuleID{1}, State: filter.RuleDraining}, Result{}, func(s *State) {
			s.Rules[0].State = filter.RuleDraining
		}},
		{"disable all rules", &SetRuleState{Rules: []filter.RuleID{1, 2}, State: filter.RuleDisabled}, Result{}, func(s *State) {
			s.Rules[0].State = filter.RuleDisabled
			s.Rules[1].State = filter.RuleDisabled
		}},
		{"disable rule on one node", &SetRuleState{Rules: []filter.RuleID{2}, Node: 2, State: filter.RuleDisabled}, Result{}, func(s *State) {
			s.Nodes[1].Rules = map[filter.RuleID]filter.NodeRule{2: {Weight: filter.DefaultWeight, State: filter.RuleDisabled}}
		}},
		{"weight", &SetWeight{Rule: 1, Node: 2, Weight: 0}, Result{}, func(s *State) {
			s.Nodes[1].Rules = map[filter.RuleID]filter.NodeRule{1: {Weight: 0}}
		}},
		{"weight equal removes the override", &SetWeight{Rule: 1, Node: 1, Weight: WeightEqual}, Result{}, func(s *State) {
			s.Nodes[0].Rules = nil
		}},
		{"weight on every listed pair", NewSetWeight([]filter.RuleID{1, 2}, []filter.NodeID{2, 3}, 0), Result{}, func(s *State) {
			s.Nodes[1].Rules = map[filter.RuleID]filter.NodeRule{1: {Weight: 0}, 2: {Weight: 0}}
			s.Nodes[2].Rules = map[filter.RuleID]filter.NodeRule{1: {Weight: 0}, 2: {Weight: 0}}
		}},
		{"handling priority", &SetHandlingPriority{Rule: 2, Node: 3, Priority: 9}, Result{}, func(s *State) {
			s.Nodes[2].Rules = map[filter.RuleID]filter.NodeRule{2: {Weight: filter.DefaultWeight, HandlingPriority: 9}}
		}},
		{"host priority", &SetHostPriority{Node: 3, Priority: 32}, Result{NodeID: 3}, func(s *State) { s.Nodes[2].HostPriority = 32 }},
		{"register node gets next id and lowest free priority", &RegisterNode{Info: nodeInfo("n4", 0), Admin: AdminStopped}, Result{NodeID: 4}, func(s *State) {
			info := nodeInfo("n4", 4)
			s.Nodes = append(s.Nodes, Node{ID: 4, NodeInfo: info, Admin: AdminStopped})
			s.LastNodeID = 4
		}},
		{"register again is idempotent and updates addresses", &RegisterNode{Info: NodeInfo{Name: "n2", HeartbeatAddr: "198.18.9.9:1", RaftAddr: "198.18.1.2:7000", APIAddr: "198.18.9.9:2"}}, Result{NodeID: 2}, func(s *State) {
			s.Nodes[1].HeartbeatAddr = "198.18.9.9:1"
			s.Nodes[1].APIAddr = "198.18.9.9:2"
		}},
		{"remove node", &RemoveNode{ID: 2}, Result{NodeID: 2}, func(s *State) { s.Nodes = append(s.Nodes[:1], s.Nodes[2]) }},
		{"admin state", &SetAdminState{Node: 1, State: AdminDraining}, Result{NodeID: 1}, func(s *State) { s.Nodes[0].Admin = AdminDraining }},
		{"settings", &SetSettings{HashSeed: u32(7), HeartbeatPeriod: dur(time.Second), HeartbeatTolerance: intp(3)}, Result{}, func(s *State) {
			s.Settings.HashSeed, s.Settings.HeartbeatPeriod, s.Settings.HeartbeatTolerance = 7, time.Second, 3
		}},
		{"settings, one field", &SetSettings{HashSeed: u32(9)}, Result{}, func(s *State) { s.Settings.HashSeed = 9 }},
		{"mac mode igmp", &SetMACMode{Mode: MACIGMP}, Result{}, func(s *State) { s.Settings.MACMode = MACIGMP }},
		{"mac mode multicast is stored as the default", &SetMACMode{Mode: MACMulticast}, Result{}, func(s *State) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tf := seeded(t)
			tf.mustApply(&SetWeight{Rule: 1, Node: 1, Weight: 70}) // an override some cases touch
			want := tf.f.current().Clone()
			tt.change(want)
			before := tf.notices
			res, err := tf.apply(tt.cmd)
			if err != nil {
				t.Fatalf("apply: %v", err)
			}
			want.Index = tf.index
			tt.want.Index = tf.index
			if diff := cmp.Diff(tt.want, res); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(want, tf.f.current(), stateOpts); diff != "" {
				t.Errorf("state (-want +got):\n%s", diff)
			}
			if tf.notices != before+1 {
				t.Errorf("notified %d times, want 1", tf.notices-before)
			}
		})
	}
}

// TestCapacity fills the cluster to the data plane's capacities: the next
// VIP and the next rule are refused with an error naming the limit, and
// replacing an existing rule still works.
func TestCapacity(t *testing.T) {
	tf := seeded(t) // 2 VIPs, 2 rules
	for i := 2; i < filter.MaxVIPs; i++ {
		tf.mustApply(&PutVIP{VIP: netip.AddrFrom4([4]byte{198, 18, 2, byte(i)})})
	}
	for i := 2; i < filter.MaxRules; i++ {
		tf.mustApply(&PutRule{Rule: filter.Rule{VIP: vip2, PortLo: uint16(10000 + i), PortHi: uint16(10000 + i), Proto: filter.ProtoTCP}})
	}
	st := tf.f.current()
	if len(st.VIPs) != filter.MaxVIPs || len(st.Rules) != filter.MaxRules {
		t.Fatalf("%d VIPs, %d rules; want %d, %d", len(st.VIPs), len(st.Rules), filter.MaxVIPs, filter.MaxRules)
	}
	for _, tt := range []struct {
		name string
		cmd  Command
		want string
	}{
		{"65th vip", &PutVIP{VIP: netip.MustParseAddr("198.18.3.1")}, "filter.MaxVIPs"},
		{"257th rule", &PutRule{Rule: filter.Rule{VIP: vip2, PortLo: 9, PortHi: 9, Proto: filter.ProtoUDP}}, "filter.MaxRules"},
	} {
		if err := tf.f.current().Check(tt.cmd); !errors.Is(err, filter.ErrCapacity) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Check = %v, want ErrCapacity naming %s", tt.name, err, tt.want)
		}
		if _, err := tf.apply(tt.cmd); !errors.Is(err, ErrInvalid) || !errors.Is(err, filter.ErrCapacity) {
			t.Errorf("%s: apply = %v, want ErrInvalid and ErrCapacity", tt.name, err)
		}
	}
	tf.mustApply(&PutVIP{VIP: vip1}) // an existing VIP: no-op
	tf.mustApply(&PutRule{Rule: filter.Rule{ID: 1, VIP: vip1, PortLo: 81, PortHi: 81, Proto: filter.ProtoTCP}})
}

func TestFSMErrors(t *testing.T) {
	tests := []struct {
		name    string
		setup   []Command
		cmd     Command
		want    error
		message string // a piece of the message that tells the operator what to do
	}{
		{"init twice", nil, &InitCluster{Settings: testSettings()}, ErrConflict, "already initialised"},
		{"vip ipv4-mapped", nil, &PutVIP{VIP: netip.MustParseAddr("::ffff:198.18.0.9")}, ErrInvalid, "write the IPv4 VIP as 198.18.0.9"},
		{"vip ipv6 link-local", nil, &PutVIP{VIP: netip.MustParseAddr("fe80::1")}, ErrInvalid, "not link-local"},
		{"vip ipv6 zoned", nil, &PutVIP{VIP: netip.MustParseAddr("2001:db8::1%eth0")}, ErrInvalid, "no zone"},
		{"vip ipv6 multicast", nil, &PutVIP{VIP: netip.MustParseAddr("ff02::1")}, ErrInvalid, "unicast"},
		{"vip ipv6 loopback", nil, &PutVIP{VIP: netip.MustParseAddr("::1")}, ErrInvalid, "unicast"},
		{"rule for unknown ipv6 vip", nil, &PutRule{Rule: filter.Rule{VIP: netip.MustParseAddr("2001:db8::9"), PortLo: 1, PortHi: 2, Proto: filter.ProtoTCP}}, ErrUnknownVIP, "add it first"},
		{"rule for ipv4-mapped vip", nil, &PutRule{Rule: filter.Rule{VIP: netip.MustParseAddr("::ffff:198.18.0.100"), PortLo: 1, PortHi: 2, Proto: filter.ProtoTCP}}, ErrInvalid, "IPv4-mapped"},
		{"vip multicast", nil, &PutVIP{VIP: netip.MustParseAddr("224.0.0.1")}, ErrInvalid, "unicast"},
		{"vip missing", nil, &PutVIP{}, ErrInvalid, "missing"},
		{"remove unknown vip", nil, &RemoveVIP{VIP: netip.MustParseAddr("198.18.0.9")}, ErrUnknownVIP, "not a cluster vip"},
		{"remove vip in use", nil, &RemoveVIP{VIP: vip1}, ErrConflict, "remove those rules first"},
		{"overlapping ports", nil, &PutRule{Rule: filter.Rule{VIP: vip1, PortLo: 70, PortHi: 90, Proto: filter.ProtoBoth}}, ErrConflict, "overlaps rule 1"},
		{"a replaced rule does not overlap itself", nil, &PutRule{Rule: filter.Rule{ID: 2, PortLo: 5000, PortHi: 5000, Proto: filter.ProtoUDP}}, nil, ""},
		{"bad port range", nil, &PutRule{Rule: filter.Rule{VIP: vip1, PortLo: 90, PortHi: 80, Proto: filter.ProtoTCP}}, ErrInvalid, "start is after end"},
		{"bad protocol", nil, &PutRule{Rule: filter.Rule{VIP: vip1, PortLo: 1, PortHi: 2}}, ErrInvalid, "want tcp, udp or both"},
		{"rule for unknown vip", nil, &PutRule{Rule: filter.Rule{VIP: netip.MustParseAddr("198.18.0.9"), PortLo: 1, PortHi: 2, Proto: filter.ProtoTCP}}, ErrUnknownVIP, "add it first"},
		{"replace unknown rule", nil, &PutRule{Rule: filter.Rule{ID: 9, VIP: vip1, PortLo: 1, PortHi: 2, Proto: filter.ProtoTCP}}, ErrUnknownRule, "id 0 to create"},
		{"single mode with duplicate handling priorities", []Command{&SetHandlingPriority{Rule: 1, Node: 3, Priority: 1}}, &PutRule{Rule: filter.Rule{ID: 1, VIP: vip1, PortLo: 80, PortHi: 80, Proto: filter.ProtoTCP, Mode: filter.ModeSingle}}, ErrConflict, "handling priority 1"},
		{"remove unknown rule", nil, &RemoveRule{ID: 9}, ErrUnknownRule, "shoal rules list"},
		{"rule state, no rules", nil, &SetRuleState{State: filter.RuleDisabled}, ErrInvalid, "no rule"},
		{"rule state, unknown rule", nil, &SetRuleState{Rules: []filter.RuleID{1, 9}, State: filter.RuleDisabled}, ErrUnknownRule, "rule 9"},
		{"rule state, unknown node", nil, &SetRuleState{Rules: []filter.RuleID{1}, Node: 9, State: filter.RuleDisabled}, ErrUnknownNode, "node 9"},
		{"rule state, bad state", nil, &SetRuleState{Rules: []filter.RuleID{1}, State: 7}, ErrInvalid, "want enabled"},
		{"weight above 100", nil, &SetWeight{Rule: 1, Node: 1, Weight: 101}, ErrInvalid, "outside 0-100"},
		{"weight below 0", nil, &SetWeight{Rule: 1, Node: 1, Weight: -2}, ErrInvalid, "outside 0-100"},
		{"weight, unknown node", nil, &SetWeight{Rule: 1, Node: 9, Weight: 10}, ErrUnknownNode, "node 9"},
		{"weight, unknown rule", nil, &SetWeight{Rule: 9, Node: 1, Weight: 10}, ErrUnknownRule, "rule 9"},
		{"weights, one unknown node of the list", nil, NewSetWeight([]filter.RuleID{1, 2}, []filter.NodeID{2, 9}, 0), ErrUnknownNode, "node 9"},
		{"duplicate handling priority in single-host rule", nil, &SetHandlingPriority{Rule: 2, Node: 3, Priority: 1}, ErrConflict, "both have handling priority 1"},
		{"handling priority out of range", nil, &SetHandlingPriority{Rule: 1, Node: 3, Priority: 33}, ErrInvalid, "outside 1-32"},
		{"duplicate host priority", nil, &SetHostPriority{Node: 3, Priority: 1}, ErrConflict, "taken by node 1"},
		{"host priority out of range", nil, &SetHostPriority{Node: 3, Priority: 0}, ErrInvalid, "outside 1-32"},
		{"host priority, unknown node", nil, &SetHostPriority{Node: 9, Priority: 9}, ErrUnknownNode, "shoal query"},
		{"register duplicate host priority", nil, &RegisterNode{Info: nodeInfo("n4", 2)}, ErrConflict, "free priorities include [4 5 6 7 8]"},
		{"register taken name", nil, &RegisterNode{Info: NodeInfo{Name: "n1", HeartbeatAddr: "198.18.1.1:1", RaftAddr: "198.18.1.9:7000", APIAddr: "198.18.1.1:2"}}, ErrConflict, "pick another name"},
		{"register taken raft address", nil, &RegisterNode{Info: NodeInfo{Name: "n9", HeartbeatAddr: "198.18.1.1:1", RaftAddr: "198.18.1.1:7000", APIAddr: "198.18.1.1:2"}}, ErrConflict, "already used by node 1"},
		{"register bad name", nil, &RegisterNode{Info: NodeInfo{Name: "a b", HeartbeatAddr: "198.18.1.1:1", RaftAddr: "198.18.1.9:7000", APIAddr: "198.18.1.1:2"}}, ErrInvalid, "letters, digits"},
		{"register bad address", nil, &RegisterNode{Info: NodeInfo{Name: "n9", HeartbeatAddr: "198.18.1.1", RaftAddr: "198.18.1.9:7000", APIAddr: "198.18.1.1:2"}}, ErrInvalid, "heartbeat address"},
		{"remove unknown node", nil, &RemoveNode{ID: 9}, ErrUnknownNode, "node 9"},
		{"admin state, unknown node", nil, &SetAdminState{Node: 9}, ErrUnknownNode, "node 9"},
		{"settings, none", nil, &SetSettings{}, ErrInvalid, "no setting"},
		{"settings, period too short", nil, &SetSettings{HeartbeatPeriod: new(time.Duration)}, ErrInvalid, "heartbeat period"},
		{"mac mode unknown", nil, &SetMACMode{Mode: "unicast"}, ErrInvalid, "want multicast or igmp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tf := seeded(t)
			for _, c := range tt.setup {
				tf.mustApply(c)
			}
			before := tf.f.current().Clone()
			if err := before.Check(tt.cmd); !errors.Is(err, tt.want) || (err != nil && !strings.Contains(err.Error(), tt.message)) {
				t.Errorf("Check = %v, want %v containing %q", err, tt.want, tt.message)
			}
			_, err := tf.apply(tt.cmd)
			if !errors.Is(err, tt.want) || (err != nil && !strings.Contains(err.Error(), tt.message)) {
				t.Fatalf("apply = %v, want %v containing %q", err, tt.want, tt.message)
			}
			if err == nil {
				return
			}
			// A failed command changes nothing but the index.
			before.Index = tf.index
			if diff := cmp.Diff(before, tf.f.current(), stateOpts); diff != "" {
				t.Errorf("state after a failed command (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFSMUndecodableEntryStops(t *testing.T) {
	for name, data := range map[string][]byte{
		"empty":          nil,
		"short header":   {byte(TypePutVIP), 1, '{', '}'},
		"unknown type":   rawEntry(200, 1, `{}`),
		"future version": rawEntry(TypePutVIP, 2, `{}`),
		"bad json":       rawEntry(TypePutVIP, 1, `{`),
		"unknown field":  rawEntry(TypePutVIP, 1, `{"VIP":"198.18.0.1","Extra":1}`),
	} {
		t.Run(name, func(t *testing.T) {
			tf := seeded(t)
			var halts []Halt
			tf.f.onHalt = func(h Halt) { halts = append(halts, h) }
			before := tf.f.current()
			tf.index++
			bad := tf.index
			ar := tf.f.Apply(&raft.Log{Index: bad, Data: data}).(applyResult)
			if !errors.Is(ar.err, ErrStopped) {
				t.Fatalf("apply: %v, want ErrStopped", ar.err)
			}
			h, ok := tf.f.halted()
			if !ok || h.Index != bad || h.Reason == "" {
				t.Fatalf("halted = %+v, %v; want index %d with a reason", h, ok, bad)
			}
			// Later entries, even good ones, are refused alike: applying
			// them would skip the one before.
			if _, err := tf.apply(&PutVIP{VIP: netip.MustParseAddr("198.18.0.200")}); !errors.Is(err, ErrStopped) || !strings.Contains(err.Error(), "upgrade") {
				t.Errorf("a good entry after the bad one: %v, want ErrStopped saying what to do", err)
			}
			if diff := cmp.Diff(before, tf.f.current(), stateOpts); diff != "" {
				t.Errorf("state changed (-before +after):\n%s", diff)
			}
			if len(halts) != 1 {
				t.Errorf("onHalt called %d times, want once", len(halts))
			}
			if _, err := tf.f.Snapshot(); !errors.Is(err, ErrStopped) {
				t.Errorf("snapshot while stopped: %v, want ErrStopped (it would drop the entry from the log)", err)
			}
		})
	}
}

// testLevel2 is a command type of a later shoal, for the gating tests.
type testLevel2 struct{}

const typeTestLevel2 CommandType = 200

func (*testLevel2) Type() CommandType              { return typeTestLevel2 }
func (*testLevel2) apply(s *State) (Result, error) { return Result{}, nil }

// knowTestLevel2 makes this build know command type 200 at level 2, as an
// upgraded shoal would, until the test ends.
func knowTestLevel2(t *testing.T) {
	commandTable[typeTestLevel2] = func() Command { return new(testLevel2) }
	commandSince[typeTestLevel2] = 2
	t.Cleanup(func() {
		delete(commandTable, typeTestLevel2)
		delete(commandSince, typeTestLevel2)
	})
}

func TestCheckSupported(t *testing.T) {
	knowTestLevel2(t)
	tf := seeded(t)
	if err := tf.f.current().CheckSupported(&PutVIP{}); err != nil {
		t.Errorf("a level 1 command: %v", err)
	}
	err := tf.f.current().CheckSupported(&testLevel2{})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "node 1 (n1)") {
		t.Errorf("a level 2 command with every node at 1: %v, want ErrUnsupported naming n1", err)
	}
	for i, n := range []string{"n1", "n2", "n3"} {
		info := nodeInfo(n, i+1)
		info.CommandLevel = 2
		tf.mustApply(&RegisterNode{Info: info})
		if err := tf.f.current().CheckSupported(&testLevel2{}); (err == nil) != (i == 2) {
			t.Errorf("after %d of 3 nodes report level 2: %v", i+1, err)
		}
	}
}

// TestListedWeightsNeedLevel6: a member below level 6 would read only
// SetWeight's Rule and Node and diverge, so lists wait for every member at
// level 6; a single pair is written without them and needs nothing more.
func TestListedWeightsNeedLevel6(t *testing.T) {
	tf := seeded(t)
	for i, n := range []string{"n1", "n2", "n3"} {
		info := nodeInfo(n, i+1)
		info.CommandLevel = 5
		tf.mustApply(&RegisterNode{Info: info})
	}
	one := NewSetWeight([]filter.RuleID{1}, []filter.NodeID{2}, 0)
	if one.Rules != nil || one.Nodes != nil {
		t.Errorf("one pair written with lists: %+v", one)
	}
	if err := tf.f.current().CheckSupported(one); err != nil {
		t.Errorf("one pair with every node at level 5: %v", err)
	}
	listed := NewSetWeight([]filter.RuleID{1}, []filter.NodeID{2, 3}, 0)
	if err := tf.f.current().CheckSupported(listed); !errors.Is(err, ErrUnsupported) {
		t.Errorf("listed nodes with every node at level 5: %v, want ErrUnsupported", err)
	}
	for i, n := range []string{"n1", "n2", "n3"} {
		info := nodeInfo(n, i+1)
		info.CommandLevel = 6
		tf.mustApply(&RegisterNode{Info: info})
	}
	if err := tf.f.current().CheckSupported(listed); err != nil {
		t.Errorf("listed nodes with every node at level 6: %v", err)
	}
}

// TestRoutedModeNeedsLevel3: a member below level 3 would refuse the
// routed mode (its SetMACMode rejects the value) and diverge, so the mode
// is proposed only once every member reports level 3; the other modes
// stay at SetMACMode's own level.
func TestRoutedModeNeedsLevel3(t *testing.T) {
	tf := seeded(t)
	for i, n := range []string{"n1", "n2", "n3"} {
		info := nodeInfo(n, i+1)
		info.CommandLevel = 2
		tf.mustApply(&RegisterNode{Info: info})
	}
	if err := tf.f.current().CheckSupported(&SetMACMode{Mode: MACIGMP}); err != nil {
		t.Errorf("igmp mode with every node at level 2: %v", err)
	}
	if err := tf.f.current().CheckSupported(&SetMACMode{Mode: MACRouted}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("routed mode with every node at level 2: %v, want ErrUnsupported", err)
	}
	for i, n := range []string{"n1", "n2", "n3"} {
		info := nodeInfo(n, i+1)
		info.CommandLevel = 3
		tf.mustApply(&RegisterNode{Info: info})
	}
	if err := tf.f.current().CheckSupported(&SetMACMode{Mode: MACRouted}); err != nil {
		t.Errorf("routed mode with every node at level 3: %v", err)
	}
}

// memSink is a raft.SnapshotSink in memory.
type memSink struct {
	bytes.Buffer
	cancelled, closed bool
	failWrite         bool
}

func (s *memSink) Write(p []byte) (int, error) {
	if s.failWrite {
		return 0, errors.New("disk full")
	}
	return s.Buffer.Write(p)
}
func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }
func (s *memSink) Close() error  { s.closed = true; return nil }

func TestSnapshotRestore(t *testing.T) {
	tf := seeded(t)
	tf.mustApply(&SetWeight{Rule: 1, Node: 2, Weight: 80})
	tf.mustApply(&SetHandlingPriority{Rule: 2, Node: 3, Priority: 20})
	tf.mustApply(&SetAdminState{Node: 3, State: AdminSuspended})
	tf.mustApply(&SetRuleState{Rules: []filter.RuleID{1}, Node: 1, State: filter.RuleDraining})
	want := tf.f.current().Clone()

	snap, err := tf.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Changes after Snapshot must not leak into it.
	tf.mustApply(&RemoveRule{ID: 1})
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	snap.Release()
	if !sink.closed || sink.cancelled {
		t.Errorf("sink closed=%v cancelled=%v, want closed only", sink.closed, sink.cancelled)
	}

	restored := newTestFSM(t)
	if err := restored.f.Restore(io.NopCloser(&sink)); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, restored.f.current(), stateOpts); diff != "" {
		t.Errorf("restored state (-want +got):\n%s", diff)
	}
	if restored.notices != 1 {
		t.Errorf("restore notified %d times, want 1", restored.notices)
	}
	if diff := cmp.Diff(want.FilterConfig(), restored.f.current().FilterConfig(), stateOpts); diff != "" {
		t.Errorf("filter config after restore (-want +got):\n%s", diff)
	}
}

func TestSnapshotPersistCancelsOnError(t *testing.T) {
	snap, err := seeded(t).f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := memSink{failWrite: true}
	if err := snap.Persist(&sink); err == nil {
		t.Fatal("Persist succeeded on a failing sink")
	}
	if !sink.cancelled || sink.closed {
		t.Errorf("sink closed=%v cancelled=%v, want cancelled only", sink.closed, sink.cancelled)
	}
}

func TestRestoreRejectsBadSnapshots(t *testing.T) {
	for name, data := range map[string]string{
		"empty":          "",
		"version":        "\x02{}",
		"json":           "\x01{",
		"no state":       "\x01{}",
		"invalid rule":   "\x01" + `{"State":{"Rules":[{"ID":1,"PortLo":9,"PortHi":1,"Proto":1}],"LastRuleID":1}}`,
		"too big":        "\x01" + `{"State":{}}` + strings.Repeat(" ", maxSnapshotSize),
		"too many rules": "\x01" + `{"State":{"Rules":[` + strings.TrimSuffix(strings.Repeat(`{"ID":1},`, maxSnapshotRules+1), ",") + `]}}`,
		"too many nodes": "\x01" + `{"State":{"Nodes":[` + strings.TrimSuffix(strings.Repeat(`{"ID":1},`, maxSnapshotNodes+1), ",") + `]}}`,
		"too many vips":  "\x01" + `{"State":{"VIPs":[` + strings.TrimSuffix(strings.Repeat(`"198.18.0.1",`, maxSnapshotVIPs+1), ",") + `]}}`,
	} {
		t.Run(name, func(t *testing.T) {
			err := newFSM(nil).Restore(io.NopCloser(strings.NewReader(data)))
			if err == nil {
				t.Fatal("Restore succeeded")
			}
			// Bounds are checked before the (costlier) validation.
			if strings.HasPrefix(name, "too ") && !strings.Contains(err.Error(), "over") {
				t.Errorf("Restore: %v, want the bound named", err)
			}
		})
	}
}

// TestSnapshotValidationIsBounded restores the largest snapshot the bounds
// let through, every rule checked against every other: it must stay fast,
// so a hostile or corrupt snapshot cannot stall a node.
func TestSnapshotValidationIsBounded(t *testing.T) {
	var rules []string
	for i := 1; i <= maxSnapshotRules; i++ {
		rules = append(rules, fmt.Sprintf(`{"ID":%d,"PortLo":%d,"PortHi":%d,"Proto":1,"Mode":0,"Affinity":1}`, i, i, i))
	}
	data := "\x01" + fmt.Sprintf(`{"State":{"Rules":[%s],"LastRuleID":%d}}`, strings.Join(rules, ","), maxSnapshotRules)
	start := time.Now()
	err := newFSM(nil).Restore(io.NopCloser(strings.NewReader(data)))
	if err != nil {
		t.Fatalf("restore %d rules: %v", maxSnapshotRules, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("restoring %d rules took %v", maxSnapshotRules, d)
	}
}

// TestIPv6VIPs: IPv6 VIPs and their rules go through the FSM, its
// snapshots and its filter config like IPv4 ones, and count one each
// against the data plane's VIP limit.
func TestIPv6VIPs(t *testing.T) {
	v6a, v6b := netip.MustParseAddr("2001:db8::100"), netip.MustParseAddr("2001:db8:1::c612:64") // v6b ends in vip1's bytes
	tf := seeded(t)
	tf.mustApply(&PutVIP{VIP: v6a})
	tf.mustApply(&PutVIP{VIP: v6b})
	r := tf.mustApply(&PutRule{Rule: filter.Rule{VIP: v6a, PortLo: 80, PortHi: 80, Proto: filter.ProtoTCP, Affinity: filter.AffinityNetwork}})
	// Same ports as vip1's rule 1 on another VIP: no overlap.
	tf.mustApply(&PutRule{Rule: filter.Rule{VIP: v6b, PortLo: 80, PortHi: 80, Proto: filter.ProtoTCP}})
	if _, err := tf.apply(&PutRule{Rule: filter.Rule{VIP: v6a, PortLo: 70, PortHi: 90, Proto: filter.ProtoTCP}}); !errors.Is(err, ErrConflict) {
		t.Errorf("overlapping rule on an IPv6 VIP: %v, want ErrConflict", err)
	}
	s := tf.f.current()
	for spec, want := range map[string][]filter.RuleID{
		"2001:db8::100":       {r.RuleID},
		"[2001:db8::100]:80":  {r.RuleID},
		"[2001:db8::100]:443": nil,
	} {
		got, err := s.ResolveRules(spec)
		if want == nil {
			if !errors.Is(err, ErrUnknownRule) {
				t.Errorf("ResolveRules(%q) = %v, %v; want ErrUnknownRule", spec, got, err)
			}
			continue
		}
		if err != nil || !cmp.Equal(got, want) {
			t.Errorf("ResolveRules(%q) = %v, %v; want %v", spec, got, err, want)
		}
	}
	cfg := s.FilterConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("filter config with IPv6 VIPs: %v", err)
	}
	if id, ok := cfg.Lookup(v6a, filter.ProtoTCP, 80); !ok || id != r.RuleID {
		t.Errorf("Lookup(%s, tcp, 80) = %d, %v; want rule %d", v6a, id, ok, r.RuleID)
	}

	snap, err := tf.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	restored := newTestFSM(t)
	if err := restored.f.Restore(io.NopCloser(&sink)); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(s, restored.f.current(), stateOpts); diff != "" {
		t.Errorf("restored state with IPv6 VIPs (-want +got):\n%s", diff)
	}

	// 2 IPv4 and 2 IPv6 VIPs so far; IPv6 VIPs fill the rest of the limit.
	for i := 4; i < filter.MaxVIPs; i++ {
		tf.mustApply(&PutVIP{VIP: netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 4: 2, 15: byte(i)})})
	}
	if _, err := tf.apply(&PutVIP{VIP: netip.MustParseAddr("2001:db8::ffff")}); !errors.Is(err, filter.ErrCapacity) {
		t.Errorf("VIP %d (IPv6): %v, want ErrCapacity", filter.MaxVIPs+1, err)
	}
	if _, err := tf.apply(&PutVIP{VIP: netip.MustParseAddr("198.18.9.9")}); !errors.Is(err, filter.ErrCapacity) {
		t.Errorf("VIP %d (IPv4): %v, want ErrCapacity", filter.MaxVIPs+1, err)
	}
}

func TestFilterConfig(t *testing.T) {
	tf := seeded(t)
	tf.mustApply(&SetWeight{Rule: 1, Node: 2, Weight: 80})
	got := tf.f.current().FilterConfig()
	want := &filter.Config{
		Seed: 42,
		VIPs: []netip.Addr{vip1, vip2},
		Rules: []filter.Rule{
			{ID: 1, VIP: vip1, PortLo: 80, PortHi: 80, Proto: filter.ProtoTCP, Affinity: filter.AffinitySingle},
			{ID: 2, PortLo: 5000, PortHi: 5100, Proto: filter.ProtoUDP, Mode: filter.ModeSingle},
		},
		Nodes: []filter.Node{
			{ID: 1, HostPriority: 1},
			{ID: 2, HostPriority: 2, Rules: map[filter.RuleID]filter.NodeRule{1: {Weight: 80}}},
			{ID: 3, HostPriority: 3},
		},
	}
	if diff := cmp.Diff(want, got, stateOpts); diff != "" {
		t.Errorf("FilterConfig (-want +got):\n%s", diff)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("FilterConfig does not validate: %v", err)
	}
	// It shares nothing with the state.
	got.Nodes[1].Rules[1] = filter.NodeRule{Weight: 1}
	if w := tf.f.current().Node(2).Rules[1].Weight; w != 80 {
		t.Errorf("changing the filter config changed the state: weight %d", w)
	}
}

func TestResolveRules(t *testing.T) {
	tf := seeded(t)
	tf.mustApply(&PutRule{Rule: filter.Rule{VIP: vip1, PortLo: 80, PortHi: 80, Proto: filter.ProtoUDP}})
	tf.mustApply(&PutRule{Rule: filter.Rule{PortLo: 22, PortHi: 22, Proto: filter.ProtoTCP}})
	s := tf.f.current()
	tests := []struct {
		spec string
		want []filter.RuleID
		err  error
	}{
		{"all", []filter.RuleID{1, 2, 3, 4}, nil},
		{"2", []filter.RuleID{2}, nil},
		{"9", nil, ErrUnknownRule},
		{"198.18.0.100", []filter.RuleID{1, 3}, nil},
		{"198.18.0.100:80", []filter.RuleID{1, 3}, nil},
		{"198.18.0.100:22", []filter.RuleID{4}, nil},
		{"198.18.0.101:5050", []filter.RuleID{2}, nil},
		{"*:5000", []filter.RuleID{2}, nil},
		{"198.18.0.101:81", nil, ErrUnknownRule},
		{"", nil, ErrInvalid},
		{"web:80", nil, ErrInvalid},
		{"198.18.0.100:99999", nil, ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			got, err := s.ResolveRules(tt.spec)
			if !errors.Is(err, tt.err) {
				t.Fatalf("ResolveRules(%q) error = %v, want %v", tt.spec, err, tt.err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ResolveRules(%q) (-want +got):\n%s", tt.spec, diff)
			}
		})
	}
}

func TestAdminStateText(t *testing.T) {
	for _, a := range []AdminState{AdminStarted, AdminStopped, AdminDraining, AdminSuspended} {
		got, err := ParseAdminState(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAdminState(%q) = %v, %v", a, got, err)
		}
	}
	if _, err := ParseAdminState("paused"); !errors.Is(err, ErrInvalid) {
		t.Errorf("ParseAdminState(paused) error = %v, want ErrInvalid", err)
	}
}

// TestFSMRetriedRequest checks a request applied twice (a retry after a
// lost leadership or reply) answers as the first time and changes nothing,
// also across a snapshot, while the same command with another id is new.
func TestFSMRetriedRequest(t *testing.T) {
	tf := seeded(t)
	entry := func(cmd Command, id uint64) *raft.Log {
		data, err := encodeEntry(cmd, id)
		if err != nil {
			t.Fatal(err)
		}
		tf.index++
		return &raft.Log{Index: tf.index, Data: data}
	}
	add := &PutRule{Rule: filter.Rule{VIP: vip2, PortLo: 443, PortHi: 443, Proto: filter.ProtoTCP}}
	first := tf.f.Apply(entry(add, 77)).(applyResult)
	if first.err != nil || first.res.RuleID != 3 {
		t.Fatalf("first attempt: %+v", first)
	}
	bad := &SetWeight{Rule: 1, Node: 1, Weight: 500}
	firstBad := tf.f.Apply(entry(bad, 78)).(applyResult)
	before := tf.f.current().Clone()

	// Through a snapshot and restore, as a replica that catches up would.
	snap, _ := tf.f.Snapshot()
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	if err := tf.f.Restore(io.NopCloser(&sink)); err != nil {
		t.Fatal(err)
	}
	again := tf.f.Apply(entry(add, 77)).(applyResult)
	if diff := cmp.Diff(first.res, again.res); diff != "" || again.err != nil {
		t.Errorf("retry result (-first +retry):\n%s err %v", diff, again.err)
	}
	againBad := tf.f.Apply(entry(bad, 78)).(applyResult)
	if !errors.Is(againBad.err, ErrInvalid) || againBad.err.Error() != firstBad.err.Error() {
		t.Errorf("retried failure: %v, want %v", againBad.err, firstBad.err)
	}
	before.Index = tf.index
	if diff := cmp.Diff(before, tf.f.current(), stateOpts); diff != "" {
		t.Errorf("retries changed the state (-want +got):\n%s", diff)
	}
	if ar, ok := tf.f.lookup(77); !ok || ar.res.RuleID != 3 {
		t.Errorf("lookup(77) = %+v, %v", ar, ok)
	}
	// Another id is another request: this one overlaps rule 3.
	if other := tf.f.Apply(entry(add, 79)).(applyResult); !errors.Is(other.err, ErrConflict) {
		t.Errorf("same command, new id: err %v, want ErrConflict", other.err)
	}
	// Old ids are forgotten past maxRecent.
	for i := range maxRecent {
		tf.f.Apply(entry(&PutVIP{VIP: vip1}, uint64(1000+i)))
	}
	if _, ok := tf.f.lookup(77); ok {
		t.Error("request 77 still remembered after maxRecent newer ones")
	}
	if _, ok := tf.f.lookup(uint64(1000 + maxRecent - 1)); !ok {
		t.Error("the newest request is forgotten")
	}
	if len(tf.f.recent) != maxRecent || len(tf.f.byID) != maxRecent {
		t.Errorf("remembering %d results (%d ids), want %d", len(tf.f.recent), len(tf.f.byID), maxRecent)
	}
}

// TestSpeaks: a level is spoken when every registered node reports it.
func TestSpeaks(t *testing.T) {
	s := &State{Nodes: []Node{{ID: 1, NodeInfo: NodeInfo{CommandLevel: CompactHeartbeatLevel}}, {ID: 2, NodeInfo: NodeInfo{CommandLevel: CompactHeartbeatLevel}}}}
	if !s.Speaks(CompactHeartbeatLevel) {
		t.Error("every node at the level: not spoken")
	}
	s.Nodes[1].CommandLevel = 0
	if s.Speaks(CompactHeartbeatLevel) || !s.Speaks(1) {
		t.Error("a node at level 1: the level spoken, or level 1 not")
	}
}
