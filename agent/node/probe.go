package node

import (
	"context"
	"sync"
	"time"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
)

// Probes: the second channel of membership (docs/MEMBERSHIP.md, "One-way
// faults"). A peer silent for T/2 periods is a suspect; the agent asks its
// peer API whether it is alive and gives the answer to the machine
// (Machine.Probe). A dead answer lets a view that dropped the peer be acted
// on at once; an alive one keeps a node that hears nobody (deaf) from
// taking every bucket.

// probeCheck asks the peer API at api (host:port) whether its node is
// alive, giving up when ctx ends.
type probeCheck func(ctx context.Context, api string) heartbeat.ProbeResult

// probeTimeout is how long a probe may take: it starts when the peer has
// been silent for T/2 periods and must answer a period before the peer
// would be declared dead (T periods), so (T/2-1) periods, at least half a
// period.
func probeTimeout(c heartbeat.Config) time.Duration {
	return max(time.Duration(c.Tolerance)*c.Period/2-c.Period, c.Period/2)
}

// probeResult is the answer of one probe.
type probeResult struct {
	id     uint32
	result heartbeat.ProbeResult
}

// prober runs probes off the membership loop, one goroutine per probe, and
// hands their answers back on results. start and done are called by the
// goroutine that owns the machine; nothing in a probe waits on it.
type prober struct {
	check   probeCheck
	results chan probeResult
	notify  func()          // called after each result is handed over
	busy    map[uint32]bool // peers being probed; owned by the caller's goroutine
	wg      sync.WaitGroup
}

func newProber(check probeCheck) *prober {
	return &prober{check: check, results: make(chan probeResult, 16), notify: func() {}, busy: map[uint32]bool{}}
}

// maxProbes bounds the probes in flight. A probe is a TLS handshake for
// both ends (a millisecond or more of CPU each); when a burst of work
// makes heartbeats late across a big cluster, every node suspected every
// peer at once and the handshakes (a fifth of a 32-node lab's CPU in such
// a storm, docs/BENCHMARKS-LOG.md) kept the heartbeats late. Suspects past
// the bound are probed as earlier probes answer, if still suspects then:
// most late peers are heard again first. A probe of a dead host that
// refuses the connection answers in a round trip; one that does not answer
// adds nothing the death at T periods does not.
const maxProbes = 4

// start probes the suspects not being probed already, at the peer API
// address apiAddr gives (none: not probed), each for at most timeout, up to
// maxProbes at a time. A probe still running when ctx ends is abandoned
// without an answer.
func (p *prober) start(ctx context.Context, suspects []uint32, timeout time.Duration, apiAddr func(id uint32) string) {
	for _, id := range suspects {
		if len(p.busy) >= maxProbes {
			return
		}
		addr := apiAddr(id)
		if p.busy[id] || addr == "" {
			continue
		}
		p.busy[id] = true
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			pctx, cancel := context.WithTimeout(ctx, timeout)
			r := p.check(pctx, addr)
			cancel()
			select {
			case p.results <- probeResult{id: id, result: r}:
				p.notify()
			case <-ctx.Done():
			}
		}()
	}
}

// done marks r's peer as no longer being probed; call it for every result
// taken from results.
func (p *prober) done(r probeResult) { delete(p.busy, r.id) }

// wait waits for every probe to end; cancel their ctx first.
func (p *prober) wait() { p.wg.Wait() }

// probeSuspects starts a probe of every suspect the machine names. A
// plugged node probes nobody: its plug cuts it off from the cluster.
func (m *membership) probeSuspects(ctx context.Context) {
	if m.probes == nil || m.plugged {
		return
	}
	m.probes.start(ctx, m.machine.Suspects(), probeTimeout(m.machine.Config()), func(id uint32) string {
		if n := m.rs.Node(filter.NodeID(id)); n != nil {
			return n.APIAddr
		}
		return ""
	})
}

// takeProbe gives a probe's answer to the machine, unless the plug was
// pulled meanwhile.
func (m *membership) takeProbe(r probeResult) {
	m.probes.done(r)
	if !m.plugged {
		m.machine.Probe(m.now(), r.id, r.result)
	}
}
