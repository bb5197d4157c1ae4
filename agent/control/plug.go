package control

import (
	"sync"
	"time"
)

// MaxPlugPull is the longest a virtual plug stays pulled: a pull that
// nobody undoes (a drill that died, a request replayed) restores itself.
const MaxPlugPull = 30 * time.Second

// PlugRestorer puts a pulled plug back after a bounded time. Every plug
// change re-arms it, so a timer of an earlier pull does nothing.
type PlugRestorer struct {
	mu    sync.Mutex // guards timer and gen
	timer *time.Timer
	gen   uint64
}

// arm cancels any pending restore and, when r pulls the plug, schedules
// restore after r.RestoreAfter, at most MaxPlugPull.
func (p *PlugRestorer) Arm(r PlugRequest, restore func(after time.Duration)) {
	after := restoreAfter(r)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gen++
	gen := p.gen
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	if !r.Pulled {
		return
	}
	p.timer = time.AfterFunc(after, func() {
		p.mu.Lock()
		stale := p.gen != gen
		p.mu.Unlock()
		if !stale {
			restore(after)
		}
	})
}

// restoreAfter is how long a pull lasts: what the request asks, at most
// (and by default) MaxPlugPull.
func restoreAfter(r PlugRequest) time.Duration {
	if r.RestoreAfter > 0 && r.RestoreAfter < MaxPlugPull {
		return r.RestoreAfter
	}
	return MaxPlugPull
}
