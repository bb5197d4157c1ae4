package heartbeat

import (
	"slices"
	"testing"
	"time"
)

// TestSimTimingChange: the cluster settings change the heartbeat timing;
// Raft applies the new rules index on each node a few milliseconds apart,
// and each node gives the new timing to its machine then (as the agent's
// membership does). Every node switches within a few milliseconds of the
// others, then sends at the new period; no peer is ever declared dead, the
// eligible set never changes and every bucket keeps exactly one owner.
// Under 10% loss too.
func TestSimTimingChange(t *testing.T) {
	cases := []struct {
		name      string
		period    time.Duration
		tolerance int
	}{
		{"shorter period", 20 * time.Millisecond, 12},
		{"longer period", 300 * time.Millisecond, 12},
		{"lower tolerance", DefaultPeriod, 8},
		{"both", 30 * time.Millisecond, 20},
	}
	runs := 20
	if *simRuns > 0 {
		runs = *simRuns
	} else if testing.Short() {
		runs = 5
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var spreads []time.Duration
			for seed := range runs {
				n := 2 + seed%7
				s := newSim(t, n, Config{}, uint64(7000+seed))
				if seed%2 == 1 {
					s.setAllLinks(func(l *simLink) { l.loss = 0.1 })
				}
				start := s.startAll(3 * time.Second)
				s.run(start + time.Second)
				from := s.elapsed()
				switched := make([]time.Duration, n)
				for i := range s.nodes {
					// Raft applies the settings within 5 ms on every node.
					s.at(from+time.Duration(s.rng.Int64N(int64(5*time.Millisecond))), func() {
						nd := s.nodes[i]
						nd.m.SetLocal(s.now, Local{Admin: Started, Healthy: true, RulesIndex: 8, Seed: s.fcfg.Seed})
						if err := nd.m.SetTiming(s.now, c.period, c.tolerance, 0, 8); err != nil {
							t.Fatal(err)
						}
						s.after(i)
					})
				}
				all := make([]uint32, n)
				for i := range all {
					all[i] = uint32(i + 1)
				}
				end := from + 4*time.Second
				for d := from; d < end; d += time.Millisecond {
					s.run(d)
					for i, nd := range s.nodes {
						if switched[i] == 0 && nd.m.Config().Period == c.period && nd.m.Config().Tolerance == c.tolerance {
							switched[i] = d
						}
						if v := nd.m.View(); !slices.Equal(v.Eligible, all) {
							t.Fatalf("seed %d n=%d: at %v node %d's view is %v, want every node", seed, n, d-from, nd.id, v.Eligible)
						}
					}
					if ok, why := s.coverage(); !ok {
						t.Fatalf("seed %d n=%d: at %v after the change: %s", seed, n, d-from, why)
					}
				}
				first, last := slices.Min(switched), slices.Max(switched)
				if first == 0 {
					t.Fatalf("seed %d n=%d: some node never switched: %v", seed, n, switched)
				}
				spreads = append(spreads, last-first)
				if d := s.totalDeaths(); d != 0 {
					t.Errorf("seed %d n=%d: %d peers declared dead during the change", seed, n, d)
				}
				if len(s.viol) > 0 {
					t.Errorf("seed %d n=%d: two nodes accepted one bucket: %+v", seed, n, s.viol[0])
				}
				// Every node sends at the new period: heartbeats over the
				// last two seconds.
				seqs := make([]uint64, n)
				for i, nd := range s.nodes {
					seqs[i] = nd.m.seq
				}
				const window = 2 * time.Second
				s.run(end + window)
				for i, nd := range s.nodes {
					want := float64(window / c.period)
					if got := float64(nd.m.seq - seqs[i]); got < want-1 || got > want+1 {
						t.Errorf("seed %d n=%d: node %d sent %.0f heartbeats in %v, want %.0f (one per %v)", seed, n, nd.id, got, window, want, c.period)
					}
				}
			}
			sp := sortedDurations(spreads)
			t.Logf("to %v x %d: %d runs (n 2-8, half at 10%% loss): first to last node switched p50 %v p99 %v max %v; 0 deaths, 0 view changes but the rules index",
				c.period, c.tolerance, runs, percentile(sp, .5), percentile(sp, .99), percentile(sp, 1))
		})
	}
}

// TestSimRuleChangeHeartbeats: a rule change reaches a 32-node cluster
// (at its scaled timing) as Raft applies it, up to 100 ms apart from node
// to node. Each node announces its new view and answers the others once,
// when every member advertises it: a few heartbeats beyond its period's,
// not one per peer that adopted the view before it (13 a node in a 32-node
// lab before, each to every peer). The cluster converges on the new view
// as soon as the last node's announcement is answered.
func TestSimRuleChangeHeartbeats(t *testing.T) {
	const n = 32
	period, tolerance := ScaledTiming(DefaultPeriod, DefaultTolerance, n)
	runs := 5
	if *simRuns > 0 {
		runs = *simRuns
	}
	var extras, converge []time.Duration
	worst := 0.0
	for seed := range runs {
		s := newSim(t, n, Config{Period: period, Tolerance: tolerance}, uint64(9100+seed))
		start := s.startAll(5 * time.Second)
		s.run(start + 2*time.Second)
		from := s.elapsed()
		seqs := make([]uint64, n)
		for i, nd := range s.nodes {
			seqs[i] = nd.m.seq
		}
		last := time.Duration(0)
		for i := range s.nodes {
			at := from + time.Duration(s.rng.Int64N(int64(100*time.Millisecond)))
			last = max(last, at)
			s.at(at, func() {
				nd := s.nodes[i]
				nd.m.SetLocal(s.now, Local{Admin: Started, Healthy: true, RulesIndex: 8, Seed: s.fcfg.Seed})
				s.after(i)
			})
		}
		converged := time.Duration(0)
		const window = 2 * time.Second
		for d := from; d < from+window; d += time.Millisecond {
			s.run(d)
			if converged != 0 {
				continue
			}
			all := true
			for _, nd := range s.nodes {
				st := nd.m.Status()
				all = all && st.Converged && st.View.RulesIndex == 8
			}
			if all {
				converged = d - last
			}
		}
		if converged == 0 {
			t.Fatalf("seed %d: not converged on the new rules %v after the change", seed, window)
		}
		converge = append(converge, converged)
		periodic := float64(window) / float64(period)
		sum := 0.0
		for i, nd := range s.nodes {
			extra := float64(nd.m.seq-seqs[i]) - periodic
			sum += extra
			worst = max(worst, extra)
		}
		extras = append(extras, time.Duration(sum/n*1000)) // thousandths, for the percentiles
		if d := s.totalDeaths(); d != 0 {
			t.Errorf("seed %d: %d peers declared dead during the change", seed, d)
		}
		if len(s.viol) > 0 {
			t.Errorf("seed %d: two nodes accepted one bucket: %+v", seed, s.viol[0])
		}
	}
	ex, cv := sortedDurations(extras), sortedDurations(converge)
	t.Logf("%d nodes at %v x %d, rules applied over 100 ms: heartbeats a node sent beyond its period's: mean %.1f (runs' max of means %.1f), most by one node %.0f; converged p50 %v max %v after the last node applied them",
		n, period, tolerance, float64(percentile(ex, .5))/1000, float64(percentile(ex, 1))/1000, worst, percentile(cv, .5), percentile(cv, 1))
	if m := float64(percentile(ex, 1)) / 1000; m > 3 {
		t.Errorf("a node sent %.1f heartbeats beyond its period's for one rule change, on average; want at most 3 (its announcement and one answer)", m)
	}
	if worst > 6 {
		t.Errorf("a node sent %.0f heartbeats beyond its period's for one rule change; want at most 6", worst)
	}
	if c := percentile(cv, 1); c > 2*period {
		t.Errorf("converged %v after the last node applied the rules; want within 2 periods (%v)", c, 2*period)
	}
}
