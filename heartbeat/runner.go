package heartbeat

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Runner drives a Machine with the real clock and a Transport: it sends the
// heartbeat when due, hands received heartbeats to the Machine, calls Tick at
// every deadline the Machine asks for, and publishes the Status. Its methods
// are safe for concurrent use.
type Runner[S any] struct {
	m   *Machine[S]
	t   *Transport
	now func() time.Time
	log *slog.Logger

	mu         sync.Mutex // guards m, peers, published, sleepUntil
	peers      map[uint32]netip.AddrPort
	published  uint64
	sleepUntil time.Time // when the loop will next run by itself

	status  atomic.Pointer[Status[S]]
	changed chan struct{}
	kick    chan struct{}
}

// NewRunner returns a Runner for m over t. Run takes ownership of t.
func NewRunner[S any](m *Machine[S], t *Transport, log *slog.Logger) *Runner[S] {
	if log == nil {
		log = slog.Default()
	}
	r := &Runner[S]{m: m, t: t, now: time.Now, log: log, changed: make(chan struct{}, 1), kick: make(chan struct{}, 1)}
	st := m.Status()
	r.status.Store(&st)
	r.published = st.Version
	return r
}

// Status returns the latest Status. Its Accept must not be modified.
func (r *Runner[S]) Status() Status[S] { return *r.status.Load() }

// Changed is signalled (coalesced) whenever Status().Version changes.
func (r *Runner[S]) Changed() <-chan struct{} { return r.changed }

// Stats returns the transport's counters.
func (r *Runner[S]) Stats() Stats { return r.t.Stats() }

// SetLocal sets what this node advertises. l.Draining is kept, not copied:
// pass a new map rather than modifying it afterwards.
func (r *Runner[S]) SetLocal(l Local) {
	r.mu.Lock()
	r.m.SetLocal(r.now(), l)
	r.publishLocked()
	r.mu.Unlock()
	r.poke()
}

// SetPeers sets the node registry and where each peer listens (this node's
// own entry, if present, is skipped). The map is kept, not copied.
func (r *Runner[S]) SetPeers(peers map[uint32]netip.AddrPort) {
	r.mu.Lock()
	r.peers = peers
	r.m.SetPeers(r.now(), peers)
	r.publishLocked()
	r.mu.Unlock()
	r.poke()
}

func (r *Runner[S]) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *Runner[S]) publishLocked() {
	if v := r.m.Version(); v != r.published {
		st := r.m.Status()
		r.status.Store(&st)
		r.published = v
		select {
		case r.changed <- struct{}{}:
		default:
		}
	}
}

// Run sends, receives and ticks until ctx is done, then closes the
// transport. It returns the receive error, if any, or nil.
func (r *Runner[S]) Run(ctx context.Context) error {
	recvErr := make(chan error, 1)
	go func() {
		recvErr <- r.t.Serve(func(msg *Message, from netip.AddrPort) {
			r.mu.Lock()
			now := r.now()
			err := r.m.Receive(now, msg, from)
			// Wake the loop only if the machine now needs it sooner (a
			// view change makes the next heartbeat due at once).
			due := r.m.Wake().Before(r.sleepUntil)
			r.publishLocked()
			r.mu.Unlock()
			if err != nil {
				r.t.Reject(ReasonOf(err))
				return
			}
			if due {
				r.poke()
			}
		})
	}()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		r.mu.Lock()
		now := r.now()
		r.m.Tick(now)
		var msg *Message
		var to []netip.AddrPort
		if !now.Before(r.m.NextSend()) {
			msg = r.m.Outgoing(now)
			for id, ap := range r.peers {
				if id != r.m.cfg.Self {
					to = append(to, ap)
				}
			}
		}
		wake := r.m.Wake()
		r.sleepUntil = wake
		r.publishLocked()
		r.mu.Unlock()
		if msg != nil {
			if err := r.t.Send(msg, to); err != nil {
				r.log.Debug("heartbeat send", "err", err)
			}
		}
		timer.Reset(max(wake.Sub(r.now()), 0))
		select {
		case <-ctx.Done():
			r.t.Close()
			return <-recvErr
		case err := <-recvErr:
			return err
		case <-timer.C:
		case <-r.kick:
		}
	}
}
