package peer

import (
	"log/slog"
	"net"
	"sort"
	"sync"
	"time"
)

// Refusals counts what the listeners refuse (connections, handshakes and
// requests), by listener and reason, and logs them at a bounded rate: a
// flood of junk must not turn into a flood of log lines. The agent exports
// the counts as metrics.
type Refusals struct {
	log *slog.Logger
	now func() time.Time

	mu         sync.Mutex // guards everything below
	counts     map[RefusalKey]uint64
	tokens     float64 // log lines allowed now
	last       time.Time
	suppressed uint64 // refusals not logged since the last line
}

// RefusalKey names a count: the listener ("raft", "peer", "metrics") and
// the reason.
type RefusalKey struct {
	Listener, Reason string
}

// Refusals log at most refusalLogBurst lines at once and refusalLogRate
// lines a second after that.
const (
	refusalLogRate  = 1.0
	refusalLogBurst = 5.0
)

// NewRefusals returns counters that log to log.
func NewRefusals(log *slog.Logger) *Refusals {
	if log == nil {
		log = slog.Default()
	}
	return &Refusals{log: log, now: time.Now, counts: map[RefusalKey]uint64{}, tokens: refusalLogBurst}
}

// Refuse counts one refusal and logs it unless the rate is exceeded.
func (r *Refusals) Refuse(listener, reason string, remote net.Addr, err error) {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.counts[RefusalKey{listener, reason}]++
	now := r.now()
	if !r.last.IsZero() {
		r.tokens = min(refusalLogBurst, r.tokens+now.Sub(r.last).Seconds()*refusalLogRate)
	}
	r.last = now
	logIt := r.tokens >= 1
	var suppressed uint64
	if logIt {
		r.tokens--
		suppressed, r.suppressed = r.suppressed, 0
	} else {
		r.suppressed++
	}
	r.mu.Unlock()
	if logIt {
		args := []any{"listener", listener, "reason", reason}
		if remote != nil {
			args = append(args, "remote", remote.String())
		}
		if err != nil {
			args = append(args, "err", err)
		}
		if suppressed > 0 {
			args = append(args, "not_logged_since_last", suppressed)
		}
		r.log.Warn("refused", args...)
	}
}

// Counts returns a copy of the counts, sorted by listener and reason.
func (r *Refusals) Counts() []RefusalCount {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	out := make([]RefusalCount, 0, len(r.counts))
	for k, n := range r.counts {
		out = append(out, RefusalCount{RefusalKey: k, N: n})
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Listener != out[j].Listener {
			return out[i].Listener < out[j].Listener
		}
		return out[i].Reason < out[j].Reason
	})
	return out
}

// RefusalCount is one count of Refusals.Counts.
type RefusalCount struct {
	RefusalKey
	N uint64
}

// Count returns one count.
func (r *Refusals) Count(listener, reason string) uint64 {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[RefusalKey{listener, reason}]
}

// Reasons a listener refuses.
const (
	RefuseTooMany     = "too_many_connections"
	RefuseAddress     = "unregistered_address"
	RefuseHandshake   = "tls_handshake"
	RefuseNotMember   = "not_a_member"
	RefuseImpersonate = "wrong_identity"
	RefuseBody        = "body_too_large"
)

// limitListener caps the connections open at once: past max, new ones are
// closed at once and counted, so junk cannot pile up file descriptors.
type limitListener struct {
	net.Listener
	name     string
	slots    chan struct{}
	refusals *Refusals
}

// LimitListener returns ln accepting at most max connections open at once;
// refusals are counted under name.
func LimitListener(ln net.Listener, name string, max int, refusals *Refusals) net.Listener {
	return &limitListener{Listener: ln, name: name, slots: make(chan struct{}, max), refusals: refusals}
}

// Accept implements net.Listener.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &slotConn{Conn: c, release: func() { <-l.slots }}, nil
		default:
			l.refusals.Refuse(l.name, RefuseTooMany, c.RemoteAddr(), nil)
			c.Close()
		}
	}
}

// slotConn gives its slot back once, when closed.
type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
