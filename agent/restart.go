package agent

import (
	"sync"
	"time"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/heartbeat"
)

// A hitless restart (`shoal restart`, then the service restarts): the
// stopping agent pins its data plane, announces a restart window in its
// last heartbeats (peers keep it in their views with its buckets until the
// window ends), lets its lease run to a period before the window's end,
// leaves the VIPs, sysctls and cluster MAC memberships in place and records
// all of it (restartRecord) in the host record. The next agent adopts the
// pinned data plane, and its membership machine inherits the accepting set
// the tables hold until it has settled among its peers. See
// docs/AGENT.md, "A restart that breaks no connection".

// Restart windows: what `shoal restart` asks for by default, and how long
// an armed restart waits for the stop it applies to.
const (
	restartArmFor     = time.Minute
	restartAckTimeout = time.Second // the stopping node waits this long for every peer to hear its window
)

// restartArm is an armed restart: the next stop within its time is one.
type restartArm struct {
	mu     sync.Mutex
	until  time.Time
	window time.Duration
}

// arm makes the next stop before now+restartArmFor a restart with window
// (0: the default; at most heartbeat.MaxRestartWindow).
func (r *restartArm) arm(now time.Time, window time.Duration) (control.RestartArmed, error) {
	if window == 0 {
		window = control.DefaultRestartWindow
	}
	if window < time.Second || window > heartbeat.MaxRestartWindow {
		return control.RestartArmed{}, control.BadRequest("restart window %v: want 1s to %v", window, heartbeat.MaxRestartWindow)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.until, r.window = now.Add(restartArmFor), window
	return control.RestartArmed{Window: window, Until: r.until}, nil
}

// take reports the window of an armed restart still valid at now, and
// disarms it.
func (r *restartArm) take(now time.Time) (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ok := !r.until.IsZero() && now.Before(r.until)
	r.until = time.Time{}
	return r.window, ok
}
