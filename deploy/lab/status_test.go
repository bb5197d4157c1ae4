package lab

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func node(id uint32, converged bool, idx uint64, eligible []uint32, acc map[string]int) NodeStatus {
	return NodeStatus{NodeID: id, NodeName: "node" + string(rune('0'+id)), Converged: converged,
		RulesIndex: idx, View: View{Eligible: eligible, RulesIndex: idx}, Accepting: acc}
}

func TestReady(t *testing.T) {
	all := []uint32{1, 2, 3}
	tests := []struct {
		name    string
		st      []NodeStatus
		wantErr string // "" = ready
	}{
		{"all converged", []NodeStatus{node(1, true, 5, all, nil), node(2, true, 5, []uint32{3, 2, 1}, nil), node(3, true, 5, all, nil)}, ""},
		{"one converging", []NodeStatus{node(1, true, 5, all, nil), node(2, false, 5, all, nil), node(3, true, 5, all, nil)}, "node2 not converged"},
		{"one short of a node", []NodeStatus{node(1, true, 5, all, nil), node(2, true, 5, []uint32{1, 2}, nil), node(3, true, 5, all, nil)}, "node2 sees 2 eligible"},
		{"rules index lags", []NodeStatus{node(1, true, 5, all, nil), node(2, true, 5, all, nil), node(3, true, 4, all, nil)}, "node3 at rules index 4"},
		{"nobody", nil, "no node answered"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Ready(tt.st, 3)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("Ready = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestCovered(t *testing.T) {
	surv := []uint32{1, 2}
	rules := []string{"0", "1"}
	tests := []struct {
		name    string
		st      []NodeStatus
		wantErr string
	}{
		{"covered", []NodeStatus{
			node(1, true, 5, surv, map[string]int{"0": 4096, "1": 2048}),
			node(2, true, 5, surv, map[string]int{"1": 2048}),
		}, ""},
		{"dead node still in a view", []NodeStatus{
			node(1, true, 5, []uint32{1, 2, 3}, map[string]int{"0": 4096, "1": 2048}),
			node(2, true, 5, surv, map[string]int{"1": 2048}),
		}, "node1 still holds node 3"},
		{"gap: the dead node's buckets not taken yet", []NodeStatus{
			node(1, true, 5, surv, map[string]int{"0": 4096, "1": 1365}),
			node(2, true, 5, surv, map[string]int{"1": 1366}),
		}, "rule 1: survivors accept 2731 of 4096"},
		{"overlap counts as not covered", []NodeStatus{
			node(1, true, 5, surv, map[string]int{"0": 4096, "1": 2049}),
			node(2, true, 5, surv, map[string]int{"1": 2048}),
		}, "rule 1: survivors accept 4097"},
		{"not converged", []NodeStatus{
			node(1, false, 5, surv, map[string]int{"0": 4096, "1": 2048}),
			node(2, true, 5, surv, map[string]int{"1": 2048}),
		}, "node1 not converged"},
		{"a rule nobody accepts", []NodeStatus{
			node(1, true, 5, surv, map[string]int{"1": 2048}),
			node(2, true, 5, surv, map[string]int{"1": 2048}),
		}, "rule 0: survivors accept 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Covered(tt.st, rules, 3)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("Covered = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// TestCoveredSince: a failover is timed to the latest push among the
// survivors, not to the poll that saw it; a node that does not say when
// its tables went in, or says later than the poll, leaves the poll's time.
func TestCoveredSince(t *testing.T) {
	t0 := time.Unix(1000, 0)
	seen := t0.Add(time.Second)
	st := []NodeStatus{{TablesAt: t0.Add(100 * time.Millisecond)}, {TablesAt: t0.Add(900 * time.Millisecond)}, {TablesAt: t0}}
	if got := CoveredSince(st, seen); !got.Equal(t0.Add(900 * time.Millisecond)) {
		t.Errorf("CoveredSince = %v, want the latest push, %v", got, t0.Add(900*time.Millisecond))
	}
	st[2].TablesAt = time.Time{}
	if got := CoveredSince(st, seen); !got.Equal(seen) {
		t.Errorf("a node without TablesAt: %v, want the poll's time %v", got, seen)
	}
	st[2].TablesAt = seen.Add(time.Millisecond)
	if got := CoveredSince(st, seen); !got.Equal(seen) {
		t.Errorf("a push after the poll: %v, want the poll's time %v", got, seen)
	}
	if got := CoveredSince(nil, seen); !got.Equal(seen) {
		t.Errorf("no nodes: %v, want the poll's time %v", got, seen)
	}
}

func TestRuleIDs(t *testing.T) {
	st := []NodeStatus{{Accepting: map[string]int{"0": 4096, "1": 10}}, {Accepting: map[string]int{"2": 1}}}
	if diff := cmp.Diff([]string{"0", "1", "2"}, RuleIDs(st)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestBalance(t *testing.T) {
	even := NumBuckets / 4
	st := []NodeStatus{
		{NodeName: "node1", Accepting: map[string]int{"1": NumBuckets, "2": even + 8}},
		{NodeName: "node2", Accepting: map[string]int{"1": 0, "2": even - 8}},
		{NodeName: "node3", Accepting: map[string]int{"2": even}},
		{NodeName: "node4", Accepting: map[string]int{"2": even}},
	}
	// Rule 1 is a single host's (one node owns it all): not a balance.
	if got, want := Balance(st, []string{"1", "2"}), float64(even+8)/float64(even); got != want {
		t.Errorf("Balance = %v, want %v", got, want)
	}
	if got := Balance(st, []string{"1"}); got != 0 {
		t.Errorf("Balance of a single host's rule = %v, want 0", got)
	}
}
