package rules

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestClusterStopsOnUndecodableEntry commits an entry no node can decode
// (as a newer shoal, or someone who got past TLS, might): every node stops
// at its index without panicking, keeps its state and says why; writes are
// refused with the reason; once the nodes run a shoal that knows the entry
// they apply it and go on.
func TestClusterStopsOnUndecodableEntry(t *testing.T) {
	nodes := newCluster(t, 3)
	mustApply(t, nodes[0], &PutVIP{VIP: vip1})
	want := waitConverged(t, nodes)
	leader, _ := leaderOf(t, nodes)

	f := leader.store.raft.Apply(rawEntry(typeTestLevel2, 1, `{}`), 5*time.Second)
	if err := f.Error(); err != nil {
		t.Fatalf("commit the entry: %v", err)
	}
	bad := f.Index()
	for _, n := range nodes {
		poll(t, 10*time.Second, n.name+" stops", func() error {
			h, ok := n.store.Halted()
			if !ok || h.Index != bad {
				return fmt.Errorf("halted %+v, %v; want index %d", h, ok, bad)
			}
			return nil
		})
		if diff := cmp.Diff(want, n.store.State(), stateOpts); diff != "" {
			t.Errorf("%s: state changed (-before +after):\n%s", n.name, diff)
		}
	}
	if _, err := nodes[1].store.Apply(testCtx(t, 5*time.Second), &PutVIP{VIP: vip2}); !errors.Is(err, ErrStopped) {
		t.Errorf("a write while stopped: %v, want ErrStopped", err)
	}

	// The upgrade: the same nodes, restarted with a shoal that knows type
	// 200, replay the log from the entry on.
	knowTestLevel2(t)
	for _, n := range nodes {
		n.stop()
	}
	for _, n := range nodes {
		n.start(false)
	}
	for _, n := range nodes {
		poll(t, 15*time.Second, n.name+" resumes", func() error {
			if h, ok := n.store.Halted(); ok {
				return fmt.Errorf("still halted: %+v", h)
			}
			if got := n.store.State().Index; got < bad {
				return fmt.Errorf("index %d, want >= %d", got, bad)
			}
			return nil
		})
	}
	mustApply(t, nodes[0], &PutVIP{VIP: vip2})
	if s := waitConverged(t, nodes); !s.HasVIP(vip2) {
		t.Error("the write after resuming did not apply")
	}
}
