package load

import (
	"context"
	"net"
	"sync"
)

// retransTally sums the segments the client's connections retransmitted
// (TCP_INFO's total_retrans; Linux only, see retransmits): a request or
// handshake segment that was lost on the way (a filter that dropped it, a
// full queue) and sent again after a retransmission timeout. A server that
// is merely slow to answer retransmits nothing, so a drill can tell a
// node's connections that lost packets from a node starved of CPU.
type retransTally struct {
	mu    sync.Mutex
	open  map[*tallied]struct{}
	total uint64
	known bool // at least one connection's count was read
}

func newRetransTally() *retransTally { return &retransTally{open: map[*tallied]struct{}{}} }

// dialer wraps dial so that every connection it opens is counted: when it
// closes, and by sum for those still open.
func (t *retransTally) dialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc := &tallied{Conn: c, t: t}
		t.mu.Lock()
		t.open[tc] = struct{}{}
		t.mu.Unlock()
		return tc, nil
	}
}

func (t *retransTally) add(c net.Conn) {
	if n, ok := retransmits(c); ok {
		t.total += uint64(n)
		t.known = true
	}
}

// sum returns the segments retransmitted so far by every connection, closed
// or open; ok is false where the system does not say.
func (t *retransTally) sum() (n uint64, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	total, known := t.total, t.known
	for c := range t.open {
		if r, ok := retransmits(c.Conn); ok {
			total += uint64(r)
			known = true
		}
	}
	return total, known
}

// tallied is a connection whose retransmissions are read before it closes.
type tallied struct {
	net.Conn
	t    *retransTally
	once sync.Once
}

func (c *tallied) Close() error {
	c.once.Do(func() {
		c.t.mu.Lock()
		c.t.add(c.Conn)
		delete(c.t.open, c)
		c.t.mu.Unlock()
	})
	return c.Conn.Close()
}
