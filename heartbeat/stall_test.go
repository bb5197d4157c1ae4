package heartbeat

import (
	"testing"
	"time"
)

// TestStallReleases: a node that sent nothing for longer than its lease
// (T-1 = 5 periods here) finds, at whatever it does next, that it stalled:
// it accepts nothing until its peer acknowledges a heartbeat sent after
// the stall; then it rejoins.
// Gaps up to the lease are no stall.
func TestStallReleases(t *testing.T) {
	for _, c := range []struct {
		name  string
		gap   time.Duration
		stall bool
	}{{"gap of the lease", 5 * tP, false}, {"gap past the lease", 5*tP + time.Millisecond, true}, {"3 s", 3 * time.Second, true}} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, 1, 2)
			now := converge2(h)
			h.runTo(now.Add(tP))
			sent := h.m.lastSent
			if st := h.m.Status(); toyCount(st.Accept) != 8 || !st.Converged {
				t.Fatalf("before: accept %d converged %v, want 8 and converged", toyCount(st.Accept), st.Converged)
			}
			// Whatever comes first after the gap: a heartbeat that waited
			// in the socket.
			h.recv(sent.Add(c.gap), h.hb(2, 1, 2))
			st := h.m.Status()
			if got := st.Stalls == 1; got != c.stall {
				t.Fatalf("after a gap of %v: %d stalls, want stall %v", c.gap, st.Stalls, c.stall)
			}
			if !c.stall {
				if toyCount(st.Accept) != 8 {
					t.Errorf("no stall: accept %d, want 8", toyCount(st.Accept))
				}
				return
			}
			// The heartbeat it found may be old: it takes nothing until its
			// peer acknowledges one sent after the stall.
			if toyCount(st.Accept) != 0 || st.Converged {
				t.Fatalf("after the stall: accept %d converged %v; want nothing, not converged", toyCount(st.Accept), st.Converged)
			}
			// It runs again and hears its peer: it rejoins.
			at := sent.Add(c.gap)
			for i := 1; i <= 5; i++ {
				h.runTo(at.Add(time.Duration(i) * tP / 2))
				h.recv(at.Add(time.Duration(i)*tP/2+time.Millisecond), h.hb(2, 1, 2))
			}
			h.runTo(at.Add(3 * tP))
			if st := h.m.Status(); toyCount(st.Accept) != 8 || !st.Settled || st.Stalls != 1 {
				t.Errorf("after rejoining: accept %d settled %v stalls %d; want 8, settled, 1", toyCount(st.Accept), st.Settled, st.Stalls)
			}
		})
	}
}

// TestMayHold: a dead peer may still serve its connections for HeldGrace
// after its death, unless a probe finds it gone; come back, it may until
// it settles.
func TestMayHold(t *testing.T) {
	dead := func(t *testing.T) (*harness, time.Time) {
		h := newHarness(t, 1, 2)
		now := converge2(h)
		last := now.Add(time.Millisecond)
		died := last.Add(6*tP + time.Millisecond)
		h.runTo(died)
		if st := h.m.Status(); st.Peers[0].Live || !st.Peers[0].MayHold {
			t.Fatalf("dead peer: live %v may hold %v; want dead, may hold", st.Peers[0].Live, st.Peers[0].MayHold)
		}
		return h, died
	}
	t.Run("until the grace ends", func(t *testing.T) {
		h, died := dead(t)
		if w := h.m.Wake(); w.After(died.Add(HeldGrace + 1)) {
			t.Errorf("wakes %v after the death, after the grace %v", w.Sub(died), HeldGrace)
		}
		h.runTo(died.Add(HeldGrace))
		if !h.m.Status().Peers[0].MayHold {
			t.Error("no longer may hold at the end of the grace")
		}
		h.runTo(died.Add(HeldGrace + 1))
		if h.m.Status().Peers[0].MayHold {
			t.Error("may hold after the grace")
		}
	})
	t.Run("a probe finds it gone", func(t *testing.T) {
		h, died := dead(t)
		h.m.Probe(died.Add(tP), 2, ProbeSilent)
		if !h.m.Status().Peers[0].MayHold {
			t.Error("a silent probe ended may hold")
		}
		h.m.Probe(died.Add(2*tP), 2, ProbeGone)
		if h.m.Status().Peers[0].MayHold {
			t.Error("may hold after a probe found it gone")
		}
	})
	t.Run("back, until it settles", func(t *testing.T) {
		h, died := dead(t)
		msg := h.hb(2, 2)
		msg.Settled, msg.View.Eligible = false, nil
		h.recv(died.Add(tP), msg)
		if st := h.m.Status(); !st.Peers[0].Live || !st.Peers[0].MayHold {
			t.Errorf("back but listening: live %v may hold %v; want live, may hold", st.Peers[0].Live, st.Peers[0].MayHold)
		}
		h.recv(died.Add(2*tP), h.hb(2, 1, 2))
		if st := h.m.Status(); st.Peers[0].MayHold {
			t.Error("settled again: still may hold")
		}
	})
}
