package heartbeat

import "time"

// Stalls: an agent stopped (SIGSTOP), a paused VM, a process starved of
// CPU. Its XDP program runs on meanwhile; once its data-plane lease ends
// (T-1 periods) it takes no new connections and keeps serving the ones it
// holds, and after T periods its peers declare it dead and take its
// buckets. Two rules keep the two sides apart:
//   - the peers take its buckets dirty for HeldGrace (PeerStatus.MayHold):
//     new connections go to them, the stalled node's connections stay its;
//   - the stalled node, when it runs again, finds that it sent nothing for
//     longer than its lease: it releases everything and listens again, as
//     after a start, before it takes anything (checkStall). The agent renews
//     the lease only for tables that hold the machine's accepting set, so
//     the release is in the kernel before the lease is.

// HeldGrace is how long after a peer's death its peers keep treating it as
// possibly still serving its connections (PeerStatus.MayHold), unless a
// probe finds nothing listening there (ProbeGone: the agent, and its XDP
// program, are gone). A stalled node's connections survive a stall of up to
// about T periods plus HeldGrace; the price is that for a node that did
// die, its clients' packets are dropped rather than answered with a reset
// for as long.
const HeldGrace = 5 * time.Second

// ProbeResult is what a probe of a silent peer through the second channel
// (its peer API) found.
type ProbeResult uint8

const (
	// ProbeSilent: no answer in time (a stalled agent, a lost host or
	// link). Not alive, but its data plane may still serve connections.
	ProbeSilent ProbeResult = iota
	// ProbeAlive: it answered.
	ProbeAlive
	// ProbeGone: nothing listens (connection refused), or it answered that
	// it takes no part in membership: its XDP program holds nothing.
	ProbeGone
)

// holds is PeerStatus.MayHold for p at now.
func (m *Machine[S]) holds(p *peer, now time.Time) bool {
	if p.msg == nil || p.diedAt.IsZero() || now.Sub(p.diedAt) > HeldGrace || m.kept(p, now) {
		return false // a peer kept through its restart window keeps its buckets
	}
	if p.probeGone && p.probeAt.After(p.lastHeard) {
		return false
	}
	return !p.live || !p.msg.Settled
}

// checkStall notices that this node sent no heartbeat for longer than its
// data-plane lease: it was stalled, and its peers may have declared it
// dead and taken its buckets. It empties the accepting set and listens
// again before it takes anything, as a node that just started; and it
// adopts its view afresh, so that it acquires only once every member has
// acknowledged a heartbeat sent after the stall (what it heard before, or
// found waiting in its socket, may be old).
func (m *Machine[S]) checkStall(now time.Time) {
	if m.lastSent.IsZero() || m.lastSent.Equal(m.stalled) || now.Sub(m.lastSent) <= m.LeaseLength(now) {
		return
	}
	m.stalled = m.lastSent
	m.stalls++
	var zero S
	m.accept, m.acceptEmpty, m.acquired, m.inheriting = zero, true, false, false
	m.settled, m.listenFrom, m.hasView = false, now, false
	m.version++
}
