package agent

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
	"github.com/shoalnet/shoal/rules"
)

// Probes: the second channel of membership (docs/MEMBERSHIP.md, "One-way
// faults"). A peer silent for T/2 periods is a suspect; the agent asks its
// peer API whether it is alive and gives the answer to the machine
// (Machine.Probe). A dead answer lets a view that dropped the peer be acted
// on at once; an alive one keeps a node that hears nobody (deaf) from
// taking every bucket.

// pathAlive is the peer API endpoint probes ask: 200 while the node takes
// part in membership, 503 while its virtual plug is pulled (a plug cuts
// heartbeats and must look like a pulled cable to probes too).
const pathAlive = "/v1/peer/alive"

// aliveHandler answers probes: alive unless off() says the node takes no
// part in membership (its virtual plug is pulled, or it has not started).
func aliveHandler(off func() bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if off() {
			control.WriteJSON(w, http.StatusServiceUnavailable, control.APIError{Error: "not in membership: virtual plug pulled or not started"})
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(struct{ Alive bool }{true})
	})
}

// probeCheck asks the peer API at api (host:port) whether its node is
// alive, giving up when ctx ends.
type probeCheck func(ctx context.Context, api string) heartbeat.ProbeResult

// newProbeClient returns the agent's peer client for probes: mutual TLS,
// and a fresh connection every time, so that a probe tests that the peer
// accepts connections now, not that an old one is still open.
func newProbeClient(certs *rules.Certs) *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: certs.ClientConfig(), DisableKeepAlives: true}}
}

// peerAPICheck probes with a GET of pathAlive: a node is alive when its
// peer API answers anything but 503 in time (a peer without the endpoint,
// of an older release, answers 404: it is up). It is gone when nothing
// listens there (the connection is refused: no agent runs, so no XDP
// program serves its connections either) or it answers 503 (its plug is
// pulled); any other failure (a timeout, a TLS handshake that never ends:
// a stalled agent, a lost host) leaves it silent.
func peerAPICheck(client *http.Client) probeCheck {
	return func(ctx context.Context, api string) heartbeat.ProbeResult {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, rules.PeerURL(api, pathAlive), nil)
		if err != nil {
			return heartbeat.ProbeSilent
		}
		resp, err := client.Do(req)
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			return heartbeat.ProbeGone
		case err != nil:
			return heartbeat.ProbeSilent
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		if resp.StatusCode == http.StatusServiceUnavailable {
			return heartbeat.ProbeGone
		}
		return heartbeat.ProbeAlive
	}
}

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

// start probes every suspect not being probed already, at the peer API
// address apiAddr gives (none: not probed), each for at most timeout. A
// probe still running when ctx ends is abandoned without an answer.
func (p *prober) start(ctx context.Context, suspects []uint32, timeout time.Duration, apiAddr func(id uint32) string) {
	for _, id := range suspects {
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
