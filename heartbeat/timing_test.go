package heartbeat

import (
	"testing"
	"time"
)

// TestSetTiming: a new heartbeat timing waits for its safe point (converged
// on a view of the rules that carry it, or T periods), then the period,
// the death window and the send schedule follow it.
func TestSetTiming(t *testing.T) {
	const newP, newT = 40 * time.Millisecond, 8
	// hb6 is peer 2's heartbeat at rules index 6 (the settings' index).
	hb6 := func(h *harness) *Message {
		msg := h.hb(2, 1, 2)
		msg.RulesIndex, msg.View.RulesIndex = 6, 6
		return msg
	}
	cases := []struct {
		name string
		// run gives the timing at now (converged on {1,2} at index 5) and
		// returns by when it must be in use.
		run func(h *harness, now time.Time) (by time.Time)
	}{
		{"switches once converged on the settings' rules", func(h *harness, now time.Time) time.Time {
			h.m.SetTiming(now, newP, newT, 0, 6)
			h.local.RulesIndex = 6
			h.m.SetLocal(now, h.local) // a new view: not converged
			h.step(now.Add(time.Millisecond))
			if c := h.m.Config(); c.Period != tP {
				t.Errorf("switched to %v before converging on index 6", c.Period)
			}
			h.recv(now.Add(2*time.Millisecond), hb6(h))
			return now.Add(2 * time.Millisecond)
		}},
		{"switches at once when already converged on them", func(h *harness, now time.Time) time.Time {
			h.m.SetTiming(now, newP, newT, 0, 5)
			return now
		}},
		{"switches after T periods without agreement", func(h *harness, now time.Time) time.Time {
			h.m.SetTiming(now, newP, newT, 0, 6)
			h.local.RulesIndex = 6
			h.m.SetLocal(now, h.local)
			// Peer 2 stays at index 5: no view of index 6 converges.
			end := now.Add(6 * tP)
			for d := now.Add(tP / 2); !d.After(end); d = d.Add(tP / 2) {
				if w := h.m.Wake(); w.After(end) {
					t.Fatalf("at %v: wakes at %v, after the timing's deadline %v", d.Sub(now), w.Sub(now), end.Sub(now))
				}
				h.recv(d, h.hb(2, 1, 2))
				h.step(d)
				if switched := h.m.Config().Period == newP; switched != !d.Before(end) {
					t.Fatalf("at %v: switched %v, want it at %v", d.Sub(now), switched, end.Sub(now))
				}
			}
			return end
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, 1, 2)
			now := converge2(h).Add(tP / 2)
			h.step(now)
			by := c.run(h, now)
			cfg := h.m.Config()
			if cfg.Period != newP || cfg.Tolerance != newT {
				t.Fatalf("timing %v x %d, want %v x %d", cfg.Period, cfg.Tolerance, newP, newT)
			}
			switched := h.m.Status()
			if switched.Period != newP || switched.Tolerance != newT {
				t.Errorf("Status timing %v x %d, want %v x %d", switched.Period, switched.Tolerance, newP, newT)
			}
			if next := h.m.NextSend(); next.After(by) && !h.m.lastSent.Equal(by) {
				t.Errorf("next heartbeat %v after the switch, want one at once", next.Sub(by))
			}
		})
	}
}

// TestTimingChangeTransition: for the old death window after a switch, a
// node sends at the shorter period, declares deaths after the longer
// window and leases for the shorter lease; then the new timing alone.
func TestTimingChangeTransition(t *testing.T) {
	// The harness runs at 100 ms x 6: window 600 ms, lease 500 ms.
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	type phase struct {
		send, lease time.Duration
		live, dead  time.Duration // a peer silent this long is live, dead
	}
	cases := []struct {
		name          string
		period        time.Duration
		tolerance     int
		during, after phase
	}{
		// 40 ms x 8: window 320 ms, lease 280 ms. During the change the old
		// 600 ms window still counts: live after 321 ms.
		{"shorter", ms(40), 8, phase{ms(40), ms(280), ms(321), ms(601)}, phase{ms(40), ms(280), ms(320), ms(321)}},
		// 200 ms x 6: window 1.2 s, lease 1 s; during the change it sends
		// every 100 ms and leases for 500 ms.
		{"longer", ms(200), 6, phase{tP, ms(500), ms(1200), ms(1201)}, phase{ms(200), ms(1000), ms(1200), ms(1201)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, 1, 2)
			now := converge2(h).Add(tP / 2)
			h.step(now)
			if err := h.m.SetTiming(now, c.period, c.tolerance, 0, 5); err != nil {
				t.Fatal(err)
			}
			h.step(now)
			if h.m.Config().Period != c.period || !h.m.lastSent.Equal(now) {
				t.Fatalf("converged on the settings' rules: period %v, last sent %v; want %v, sent at once", h.m.Config().Period, h.m.lastSent.Sub(now), c.period)
			}
			check := func(when string, at time.Time, p phase) {
				t.Helper()
				h.step(at)
				if got := h.m.NextSend().Sub(at); got != p.send {
					t.Errorf("%s: next heartbeat %v after one, want %v", when, got, p.send)
				}
				if got := h.m.LeaseLength(at); got != p.lease {
					t.Errorf("%s: lease %v, want %v", when, got, p.lease)
				}
				h.recv(at, h.hb(2, 1, 2))
				h.m.Tick(at.Add(p.live))
				if !h.m.Status().Peers[0].Live {
					t.Errorf("%s: peer 2 dead %v after its last heartbeat, want live", when, p.live)
				}
				h.m.Tick(at.Add(p.dead))
				if h.m.Status().Peers[0].Live {
					t.Errorf("%s: peer 2 live %v after its last heartbeat, want dead", when, p.dead)
				}
			}
			check("during the change", h.m.NextSend(), c.during)
			// The change ends 600 ms (the old window) after the switch.
			check("after the change", now.Add(3*time.Second), c.after)
		})
	}
}

// TestSetTimingNoChange: invalid timings are refused, the timing in use or
// the one waiting changes nothing, and giving back the one in use cancels
// the wait.
func TestSetTimingNoChange(t *testing.T) {
	h := newHarness(t, 1, 2)
	now := converge2(h).Add(tP / 2)
	for _, bad := range []struct {
		p   time.Duration
		tol int
	}{{0, 6}, {time.Microsecond, 6}, {tP, 1}, {tP, 0}} {
		if err := h.m.SetTiming(now, bad.p, bad.tol, 0, 5); err == nil {
			t.Errorf("SetTiming(%v, %d): no error", bad.p, bad.tol)
		}
	}
	v := h.m.Version()
	if err := h.m.SetTiming(now, tP, 6, 0, 9); err != nil || h.m.Version() != v || h.m.hasTiming {
		t.Errorf("the timing in use again: err %v, version %d -> %d, waiting %v; want nothing changed", err, v, h.m.Version(), h.m.hasTiming)
	}
	h.m.SetTiming(now, 2*tP, 6, 0, 9) // waits for index 9
	h.m.SetTiming(now.Add(5*tP), 2*tP, 6, 0, 10)
	if h.m.timing.index != 9 || !h.m.timing.since.Equal(now) {
		t.Errorf("the waiting timing again moved its index or deadline: %+v", h.m.timing)
	}
	h.m.SetTiming(now.Add(5*tP), tP, 6, 0, 10)
	h.m.Tick(now.Add(20 * tP))
	if c := h.m.Config(); c.Period != tP || h.m.hasTiming {
		t.Errorf("after the timing in use was given back: period %v, waiting %v; want %v and none", c.Period, h.m.hasTiming, tP)
	}
}
