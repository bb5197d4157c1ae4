package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/agent/host"
	"github.com/shoalnet/shoal/agent/node"
	"github.com/shoalnet/shoal/filter"
)

// restart arms a hitless restart (control API): the next stop keeps the
// data plane and announces a restart window.
func (a *Agent) Restart(_ context.Context, req control.RestartRequest) (control.RestartArmed, error) {
	armed, err := a.restartArm.arm(time.Now(), req.Window)
	if err != nil {
		return armed, err
	}
	a.log.Info("restart armed: the next stop keeps the data plane", "window", armed.Window, "until", armed.Until.Format(time.RFC3339))
	return armed, nil
}

// pinDir is where this node's data plane is pinned across a restart:
// pin_dir, or a directory under /sys/fs/bpf/shoal named after the data
// directory, so that agents of several nodes on one kernel (the lab) never
// share one.
func (a *Agent) pinDir() string {
	if a.cfg.PinDir != "" {
		return a.cfg.PinDir
	}
	dir, err := filepath.Abs(a.cfg.DataDir)
	if err != nil {
		dir = a.cfg.DataDir
	}
	sum := sha256.Sum256([]byte(dir))
	return filepath.Join("/sys/fs/bpf/shoal", hex.EncodeToString(sum[:8]))
}

// stopForRestart stops the node for a restart (see restart.go): pin, announce
// the window and wait (at most restartAckTimeout) for every peer to hear it,
// stop, record. It reports false, with the node still running and nothing
// pinned, when the data plane cannot be pinned: the caller hands off as in
// a graceful stop instead.
func (a *Agent) stopForRestart(window time.Duration, stopNode func() error) (bool, error) {
	dir := a.pinDir()
	if err := a.xdp.Pin(dir); err != nil {
		a.log.Error("restart: cannot pin the data plane; stopping gracefully instead", "err", err)
		return false, nil
	}
	start := time.Now()
	actx, cancel := context.WithTimeout(context.Background(), restartAckTimeout)
	acked := a.node.AnnounceRestart(actx, window)
	cancel()
	if !acked {
		// A live peer that did not hear the window would take this node's
		// buckets after T periods while the pinned tables still accept.
		a.log.Warn("restart: not every live peer acknowledged the restart window; stopping gracefully instead", "waited", restartAckTimeout)
		return false, nil // Close unpins
	}
	err := stopNode()
	accept, peersDraining, draining, healthy := a.node.Held()
	rr := &host.RestartRecord{BootID: host.BootID(), PinDir: dir, Pinned: a.xdp.Pinned(),
		LeaseEnd: start.Add(window - a.node.Period()),
		Accept:   accept, PeersDraining: peersDraining, Draining: draining, Healthy: healthy}
	if rerr := a.host.SetRestart(rr); rerr != nil {
		// Without the record the next agent cannot adopt: detach as usual
		// (the peers take over when the window ends).
		a.log.Error("restart: cannot record the restart; removing the data plane", "err", rerr)
		return true, errors.Join(err, rerr)
	}
	a.restarting = true
	a.log.Info("stopped for a restart", "window", window, "took", time.Since(start).Round(time.Millisecond), "restart", rr.String())
	return true, err
}

// startFromRestart makes the data plane ready at start: it adopts what a
// previous agent pinned for a restart, or loads a fresh one; it returns
// what the first membership machine inherits (nil: nothing) and pushes
// first tables unless adopted ones are kept.
func (a *Agent) startFromRestart(h *host.Host) (*filter.XDP, node.Dataplane, *node.Inheritance, error) {
	rr := h.TakeRestart()
	var pinned *filter.Pinned
	if rr != nil {
		pinned = rr.Pinned
	}
	xdp, ad, err := filter.LoadPinnedXDP(a.pinDir(), pinned)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("load xdp: %w", err)
	}
	dp := macTracker{xdp, h}
	fcfg := a.store.State().FilterConfig()
	var in *node.Inheritance
	switch {
	case rr != nil && ad.Tables && ad.Lease > 0:
		// The tables stay as they are: the first push is membership's,
		// from the inherited set.
		h.Pushed(ad.MAC)
		in = node.InheritFrom(rr, fcfg, time.Now().Add(ad.Lease))
		a.log.Info("adopted the pinned data plane", "lease_left", ad.Lease.Round(time.Millisecond), "accepting", in.Accepting().Buckets.Count())
		return xdp, dp, in, nil
	case rr != nil && time.Until(rr.LeaseEnd) > 0:
		// Another program: the same tables rebuilt, the same lease.
		in = node.InheritFrom(rr, fcfg, rr.LeaseEnd)
		a.log.Warn("pinned tables not adopted; rebuilt from the restart record", "why", ad.Why, "accepting", in.Accepting().Buckets.Count())
		t := filter.NewTables(fcfg, a.self, in.Accepting().Buckets, in.PeersDraining(), rr.Draining.Minus(in.Accepting().Buckets))
		if err := dp.Update(t, h.MAC()); err != nil {
			xdp.Close()
			return nil, nil, nil, fmt.Errorf("xdp tables: %w", err)
		}
		if err := xdp.RenewLease(time.Until(rr.LeaseEnd)); err != nil {
			xdp.Close()
			return nil, nil, nil, err
		}
		return xdp, dp, in, nil
	}
	if rr != nil || ad.Link {
		a.log.Warn("a restart's pinned data plane was not adopted (its window is over, or it is stale)", "why", ad.Why)
	}
	// Accept nothing until the cluster has converged.
	if err := dp.Update(filter.NewTables(fcfg, a.self, nil, nil, nil), h.MAC()); err != nil {
		xdp.Close()
		return nil, nil, nil, fmt.Errorf("xdp tables: %w", err)
	}
	return xdp, dp, nil, nil
}

// macTracker tells the host the MAC of every table push, so that a data
// plane still rewriting to an old MAC makes the node unhealthy.
type macTracker struct {
	node.Dataplane
	h *host.Host
}

func (m macTracker) Update(t *filter.Tables, ifMAC net.HardwareAddr) error {
	if err := m.Dataplane.Update(t, ifMAC); err != nil {
		return err
	}
	m.h.Pushed(ifMAC)
	return nil
}
