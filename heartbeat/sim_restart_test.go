package heartbeat

import (
	"testing"
	"time"

	"github.com/shoalnet/shoal/filter"
)

// TestSimRestart: a node restarts with a restart window, as the agent does
// (announce, wait until every peer acknowledges, stop; the data plane keeps
// its last accepting set until the lease ends, a period before the window;
// the new incarnation inherits that set). Coming back within the window,
// every bucket has exactly one owner at every instant, the restarting
// node's pinned data plane counted; coming back after it, the survivors own
// every bucket within the window plus the failover bound, and never one
// the pinned data plane still accepts.
func TestSimRestart(t *testing.T) {
	const window = 2 * time.Second
	for _, tc := range []struct {
		name     string
		gap      func(s *sim) time.Duration // from the stop to the new incarnation's start
		inWindow bool
	}{
		{"back within the window", func(s *sim) time.Duration {
			return 300*time.Millisecond + time.Duration(s.rng.Int64N(int64(time.Second)))
		}, true},
		{"back too late", func(*sim) time.Duration { return window + 1500*time.Millisecond }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range 200 {
				s := newSim(t, 3, Config{}, uint64(7000+seed))
				p := s.cfg.Period
				start := s.startAll(5 * time.Second)
				s.run(start + 10*p + time.Duration(s.rng.Int64N(int64(p))))
				k := s.rng.IntN(3)
				n := s.nodes[k]
				n.m.SetLocal(s.now, Local{Admin: Started, Healthy: true, RulesIndex: 7, Seed: s.fcfg.Seed, RestartWindow: window})
				s.after(k)
				leaseEnd := s.now.Add(window - p) // set before the first heartbeat with the window
				for d := s.elapsed() + p/20; !n.m.RestartAcked(); d += p / 20 {
					if d > s.elapsed()+time.Second {
						t.Fatalf("seed %d: the restart window never acknowledged", seed)
					}
					s.run(d)
				}
				pinned, stopped := n.accept, s.elapsed()
				s.crash(k)
				// The pinned data plane accepts until the lease ends.
				pinnedNow := func() filter.Set {
					if s.nodes[k].up || !s.now.Before(leaseEnd) {
						return nil
					}
					return pinned
				}
				s.onAccept = func(o *simNode) {
					if o.id != n.id && o.up && overlaps(o.accept, pinnedNow()) {
						t.Errorf("seed %d: node %d accepts buckets node %d's pinned data plane still accepts, %v after the stop", seed, o.id, n.id, s.elapsed()-stopped)
					}
				}
				gap := tc.gap(s)
				s.at(stopped+gap, func() {
					s.boot(k)
					s.nodes[k].m.Inherit(s.now, pinned, leaseEnd)
					s.after(k)
				})
				step := p / 20
				end := stopped + gap + 3*time.Second
				coveredAt := time.Duration(0)
				for d := stopped + step; d <= end; d += step {
					s.run(d)
					ok, why := s.coverageWith(pinnedNow())
					if ok && coveredAt == 0 && d < stopped+gap {
						coveredAt = d
					}
					if tc.inWindow && !ok {
						for _, o := range s.nodes {
							if o.up {
								st := o.m.Status()
								t.Logf("node %d inc %d accept %d view %v settled %v inheriting %v conv %v excl %v", o.id, st.Incarnation, o.accept.Count(), st.View.Eligible, st.Settled, st.Inheriting, st.Converged, st.Excluded)
							}
						}
						t.Logf("pinned %d k=%d", pinnedNow().Count(), k)
						t.Fatalf("seed %d: %v after the stop (back after %v): %s", seed, d-stopped, gap, why)
					}
				}
				if ok, why := s.coverage(); !ok {
					t.Fatalf("seed %d: not covered 3 s after the new incarnation started: %s", seed, why)
				}
				if !tc.inWindow && (coveredAt == 0 || coveredAt-stopped > window+1200*time.Millisecond) {
					t.Errorf("seed %d: survivors covered every bucket %v after the stop; want within the window (%v) + 1.2 s", seed, coveredAt-stopped, window)
				}
				if len(s.viol) > 0 {
					t.Errorf("seed %d: two nodes accepted one bucket: %+v", seed, s.viol[0])
				}
			}
		})
	}
}
