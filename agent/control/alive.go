package control

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"syscall"
	"time"

	"github.com/shoalnet/shoal/heartbeat"
	"github.com/shoalnet/shoal/peer"
)

// Probes: the second channel of membership (docs/MEMBERSHIP.md, "One-way
// faults"). A peer silent for T/2 periods is a suspect; the agent asks its
// peer API whether it is alive and gives the answer to the machine
// (Machine.Probe). A dead answer lets a view that dropped the peer be acted
// on at once; an alive one keeps a node that hears nobody (deaf) from
// taking every bucket.

// PathAlive is the peer API endpoint probes ask: 200 while the node takes
// part in membership, 503 while its virtual plug is pulled (a plug cuts
// heartbeats and must look like a pulled cable to probes too).
const PathAlive = "/v1/peer/alive"

// AliveHandler answers probes: alive unless off() says the node takes no
// part in membership (its virtual plug is pulled, or it has not started).
func AliveHandler(off func() bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if off() {
			WriteJSON(w, http.StatusServiceUnavailable, APIError{Error: "not in membership: virtual plug pulled or not started"})
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(struct{ Alive bool }{true})
	})
}

// NewProbeClient returns the agent's peer client for probes: mutual TLS,
// and one connection kept per peer. A fresh connection per probe cost a
// TLS handshake at both ends (a millisecond or more of CPU each), a tenth
// of the agents' CPU in a 50-node lab's join storm, when many peers are
// suspects at once (docs/BENCHMARKS-LOG.md). A kept connection answers as
// a fresh one would: a peer whose agent ended closed it, and the probe,
// a GET, is retried on a new connection, which is refused (gone); a
// stalled agent answers nothing on either (silent); a pulled plug answers
// 503 on either (gone).
func NewProbeClient(certs *peer.Certs) *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: certs.ClientConfig(), MaxIdleConnsPerHost: 1, IdleConnTimeout: probeIdle}}
}

// probeIdle is how long a probe's connection is kept unused: a suspect is
// usually probed again within seconds, if at all.
const probeIdle = 30 * time.Second

// PeerAPICheck probes with a GET of PathAlive: a node is alive when its
// peer API answers anything but 503 in time (a peer without the endpoint,
// of an older release, answers 404: it is up). It is gone when nothing
// listens there (the connection is refused: no agent runs, so no XDP
// program serves its connections either) or it answers 503 (its plug is
// pulled); any other failure (a timeout, a TLS handshake that never ends:
// a stalled agent, a lost host) leaves it silent.
func PeerAPICheck(client *http.Client) func(ctx context.Context, api string) heartbeat.ProbeResult {
	return func(ctx context.Context, api string) heartbeat.ProbeResult {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, peer.URL(api, PathAlive), nil)
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
