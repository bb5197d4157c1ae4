package heartbeat

import (
	"cmp"
	"fmt"
	"time"
)

// Heartbeat timing changed at run time: the period and tolerance are
// cluster settings, replicated with the rules, and every node switches to
// new values at a safe point rather than when its Raft log applies them.

// pendingTiming is a heartbeat timing given to SetTiming and not yet in use.
type pendingTiming struct {
	period    time.Duration
	tolerance int
	hold      time.Duration // HoldPeriod
	index     uint64        // the rules index that carries it
	since     time.Time     // when it was first given
}

// timingChange is the last switch of timing: until until, the old timing's
// period and death window count too (see transition).
type timingChange struct {
	until     time.Time
	period    time.Duration
	tolerance int
	hold      time.Duration // HoldPeriod
}

// SetTiming gives the heartbeat period, tolerance and hold period (see
// Config; 0 means the period) that the replicated settings carry from
// rules index index on. They take effect at a safe point, so that the
// nodes switch at about the same instant and none judges
// a peer by a timing that peer does not use yet: once this node is
// converged on a view of rules index index or later (every member of the
// view has applied those rules, so each of them switches within about a
// round trip of the others), or, failing that, T periods of the timing in
// use after it was first given (this node agrees with nobody, and its peers
// switched long ago). The switch sends a heartbeat at once, so the agent
// renews its data-plane lease with the new length. For the old death window
// after the switch, while peers may still be on the old timing, the node
// sends at the shorter of the two periods, declares a peer dead only after
// the longer of the two windows, holds a drop for the longer of the two
// holds, and gives the data plane the shorter of the two leases (see
// LeaseLength). Giving the timing in
// use, or the one already waiting, again changes nothing; a timing that
// cannot work is refused with an error and changes nothing either.
func (m *Machine[S]) SetTiming(now time.Time, period time.Duration, tolerance int, hold time.Duration, index uint64) error {
	hold = cmp.Or(hold, period)
	c := m.cfg
	c.Period, c.Tolerance, c.HoldPeriod = period, tolerance, hold
	if err := c.Validate(); err != nil {
		return fmt.Errorf("heartbeat timing: %w", err)
	}
	t := pendingTiming{period: period, tolerance: tolerance, hold: hold, index: index, since: now}
	switch {
	case m.hasTiming && m.timing.period == period && m.timing.tolerance == tolerance && m.timing.hold == hold:
		return nil
	case period == m.cfg.Period && tolerance == m.cfg.Tolerance && hold == m.cfg.HoldPeriod:
		m.hasTiming = false // back to the timing in use before the switch
		return nil
	}
	m.timing, m.hasTiming = t, true
	m.recompute(now)
	return nil
}

// switchTiming puts the waiting timing in use when its safe point has come
// (see SetTiming).
func (m *Machine[S]) switchTiming(now time.Time) {
	t := m.timing
	if !m.hasTiming || !(m.converged && m.view.RulesIndex >= t.index) && now.Before(t.since.Add(m.period(m.cfg.Tolerance))) {
		return
	}
	old := m.cfg
	m.change = timingChange{until: now.Add(m.period(old.Tolerance)), period: old.Period, tolerance: old.Tolerance, hold: old.HoldPeriod}
	m.cfg.Period, m.cfg.Tolerance, m.cfg.HoldPeriod, m.hasTiming = t.period, t.tolerance, t.hold, false
	// The send budget and schedule were in the old periods: start afresh,
	// and send now.
	m.tat = time.Time{}
	m.sendSoon(now)
	m.version++
	// What was just derived used the old periods (lag graces, holds):
	// derive it again under the new ones, since nothing else would before
	// an input or a deadline changes.
	m.recompute(now)
}

// inChange reports whether the last switch of timing is recent enough for
// peers to be on the old timing still: within the old death window.
func (m *Machine[S]) inChange(now time.Time) bool { return now.Before(m.change.until) }

// sendPeriod is the period between heartbeats: the shorter of the old and
// new during a change.
func (m *Machine[S]) sendPeriod(now time.Time) time.Duration {
	if m.inChange(now) {
		return min(m.cfg.Period, m.change.period)
	}
	return m.cfg.Period
}

// deathWindow is how long a peer may stay silent before it is dead: T
// periods, or during a change the longer of the old and new windows.
func (m *Machine[S]) deathWindow(now time.Time) time.Duration {
	w := m.period(m.cfg.Tolerance)
	if m.inChange(now) {
		w = max(w, time.Duration(m.change.tolerance)*m.change.period)
	}
	return w
}

// deathHoldLength is the hold after a drop (see deathHold and holdFor):
// deathHold hold periods, or during a change the longer of the old and new
// holds, since the dropped node may still be on the old timing.
func (m *Machine[S]) deathHoldLength(now time.Time) time.Duration {
	h := deathHold * m.cfg.HoldPeriod
	if m.inChange(now) {
		h = max(h, deathHold*m.change.hold)
	}
	return h
}

// LeaseLength is how long the data plane may keep taking new connections
// without a renewal: T-1 periods (at least one), so that a stalled node
// stops before its peers declare it dead after T; during a change of
// timing, the shorter of the old and new leases, since a peer still on the
// old timing judges this node by the old window.
func (m *Machine[S]) LeaseLength(now time.Time) time.Duration {
	lease := func(p time.Duration, t int) time.Duration { return time.Duration(max(t-1, 1)) * p }
	l := lease(m.cfg.Period, m.cfg.Tolerance)
	if m.inChange(now) {
		l = min(l, lease(m.change.period, m.change.tolerance))
	}
	return l
}
