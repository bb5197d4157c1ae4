package rules

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/shoalnet/shoal/filter"
)

// bigInfo is node i's registration at command level level, with its own
// addresses.
func bigInfo(i, level int) NodeInfo {
	return NodeInfo{
		Name: fmt.Sprintf("node%d", i), CommandLevel: level,
		HeartbeatAddr: fmt.Sprintf("198.18.2.%d:7946", i), RaftAddr: fmt.Sprintf("198.18.2.%d:7000", i), APIAddr: fmt.Sprintf("198.18.2.%d:7001", i),
	}
}

// TestSixtyFourNodesNeedLevel5: a cluster takes 64 nodes (host and
// handling priorities up to 64) once every member reports command level 5,
// and NLB's 32 while any reports less, with an error naming that member;
// a member below level 5 cannot join a cluster that uses priorities past
// 32; a 64-node registry survives a snapshot.
func TestSixtyFourNodesNeedLevel5(t *testing.T) {
	tf := newTestFSM(t)
	tf.mustApply(&InitCluster{Settings: testSettings()})
	tf.mustApply(&RegisterNode{Info: bigInfo(1, 4)})
	for i := 2; i <= 32; i++ {
		tf.mustApply(&RegisterNode{Info: bigInfo(i, 5)})
	}
	_, err := tf.apply(&RegisterNode{Info: bigInfo(33, 5)})
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "node1") || !strings.Contains(err.Error(), "level 4") {
		t.Fatalf("33rd node with node1 at level 4: %v, want ErrConflict naming node1's level", err)
	}
	if _, err := tf.apply(&SetHostPriority{Node: 2, Priority: 40}); !errors.Is(err, ErrInvalid) {
		t.Errorf("host priority 40 with node1 at level 4: %v, want ErrInvalid", err)
	}

	tf.mustApply(&RegisterNode{Info: bigInfo(1, 5)}) // node1 upgraded
	if got := tf.f.current().MaxPriority(); got != MaxHostPriority {
		t.Fatalf("MaxPriority with every node at level 5: %d, want %d", got, MaxHostPriority)
	}
	for i := 33; i <= 64; i++ {
		res := tf.mustApply(&RegisterNode{Info: bigInfo(i, 5)})
		if n := tf.f.current().Node(res.NodeID); n.HostPriority != i {
			t.Fatalf("node%d got host priority %d, want %d", i, n.HostPriority, i)
		}
	}
	if _, err := tf.apply(&RegisterNode{Info: bigInfo(65, 5)}); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "at most 64") {
		t.Errorf("65th node: %v, want ErrConflict, at most 64", err)
	}
	tf.mustApply(&PutVIP{VIP: vip1})
	tf.mustApply(&PutRule{Rule: filter.Rule{VIP: vip1, PortLo: 80, PortHi: 80, Proto: filter.ProtoTCP, Affinity: filter.AffinitySingle}})
	tf.mustApply(&SetHandlingPriority{Node: 3, Rule: 1, Priority: 60})
	if _, err := tf.apply(&SetHandlingPriority{Node: 3, Rule: 1, Priority: 65}); !errors.Is(err, ErrInvalid) {
		t.Errorf("handling priority 65: %v, want ErrInvalid", err)
	}

	// A shoal at level 4 would refuse the priorities past 32 the others
	// applied: it may not join, nor may a member go back to it.
	if _, err := tf.apply(&RegisterNode{Info: bigInfo(70, 4)}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("a level-4 node joining 64: %v, want ErrUnsupported", err)
	}
	if _, err := tf.apply(&RegisterNode{Info: bigInfo(5, 4)}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("node5 going back to level 4: %v, want ErrUnsupported", err)
	}

	want := tf.f.current().Clone()
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
		t.Fatalf("restore 64 nodes: %v", err)
	}
	if got := len(restored.f.current().Nodes); got != len(want.Nodes) {
		t.Errorf("restored %d nodes, want %d", got, len(want.Nodes))
	}
}
