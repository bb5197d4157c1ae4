package heartbeat

import (
	"testing"
	"time"
)

// TestSimStall: one node's agent stalls (SIGSTOP, a paused VM) for a
// random 0.2-4 s: it handles nothing, the heartbeats sent to it wait in its
// socket, probes of it time out, and its data plane's lease runs out T-1
// periods after its last heartbeat. No two nodes ever accept one bucket (a
// stalled node whose lease ended accepts nothing new); within T+3 periods
// of the stall's start every bucket has one owner again if it lasts that
// long; after it, the stalled node, having found it stalled, rejoins and
// every bucket has one owner among all within 2 s.
func TestSimStall(t *testing.T) {
	runs := 200
	if *simRuns > 0 {
		runs = *simRuns
	} else if testing.Short() {
		runs = 40
	}
	var back []time.Duration
	stalls := 0
	for seed := range runs {
		n := 2 + seed%5
		s := newSim(t, n, Config{}, uint64(9000+seed))
		start := s.startAll(3 * time.Second)
		s.run(start + time.Second + time.Duration(s.rng.Int64N(int64(s.cfg.Period))))
		x := s.rng.IntN(n)
		dur := 200*time.Millisecond + time.Duration(s.rng.Int64N(int64(3800*time.Millisecond)))
		from, sentBefore := s.elapsed(), s.nodes[x].m.lastSent
		s.nodes[x].stalledUntil = s.now.Add(dur)
		p := s.cfg.Period
		bound := time.Duration(s.cfg.Tolerance+3) * p
		if dur > bound+p {
			if _, ok := s.waitCoverage(from + bound); !ok {
				_, why := s.coverage()
				t.Fatalf("seed %d n=%d: node %d stalled %v: not covered %v after: %s", seed, n, x+1, dur, bound, why)
			}
		}
		s.run(from + dur)
		d, ok := s.waitCoverage(from + dur + 2*time.Second)
		if !ok || s.nodes[x].accept.Count() == 0 && n > 1 {
			s.run(from + dur + 2*time.Second)
			_, why := s.coverage()
			t.Fatalf("seed %d n=%d: node %d stalled %v: 2 s after, covered %v, it accepts %d: %s", seed, n, x+1, dur, ok, s.nodes[x].accept.Count(), why)
		}
		back = append(back, d-from-dur)
		st := s.nodes[x].m.Status()
		// A stall: no heartbeat for longer than the lease, from the last
		// one before the stop to the first thing done after it.
		if want := s.nodes[x].stalledUntil.Sub(sentBefore) > s.nodes[x].m.LeaseLength(s.now); (st.Stalls == 1) != want {
			t.Errorf("seed %d: stalled %v: %d stalls counted, want stall %v", seed, dur, st.Stalls, want)
		}
		stalls += int(st.Stalls)
		if len(s.viol) > 0 {
			t.Errorf("seed %d n=%d: node %d stalled %v: two nodes accepted one bucket: %+v", seed, n, x+1, dur, s.viol[0])
		}
	}
	b := sortedDurations(back)
	t.Logf("%d runs (n 2-6, stalls 0.2-4 s, %d past the lease): 0 double owners; after the stall, every bucket one owner again p50 %v p99 %v max %v",
		runs, stalls, percentile(b, .5), percentile(b, .99), percentile(b, 1))
}
