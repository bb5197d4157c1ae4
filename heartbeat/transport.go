package heartbeat

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Stats are a Transport's counters, for metrics.
type Stats struct {
	Sent       uint64 // datagrams sent
	SendErrors uint64 // datagrams the socket refused
	Received   uint64 // datagrams read
	// ReceivedBytes and SentBytes: their payloads (UDP), for the cost a
	// node pays as the cluster grows (bench/scale.sh).
	ReceivedBytes, SentBytes uint64
	Accepted                 uint64 // heartbeats handed on (decoded and authenticated)
	Reopens                  uint64 // sockets reopened after a read failed
	// Rejected counts dropped heartbeats by reason: the codec's, and the
	// machine's (stale, unknown node, self) as reported through Reject.
	Rejected [NumReasons]uint64
}

// Transport sends and receives heartbeats over UDP (any PacketConn). It is
// fed peer addresses; it discovers nothing. Send may run concurrently with
// Serve or Receive (one goroutine receives, by either).
//
// A socket whose read fails (not a deadline, not a close) is replaced by a
// new one on the same address, when the Transport knows how to open one
// (Listen; WithReopen), and the receive goes on: the heartbeat path heals
// without the agent. A replacement that fails too within reopenPause ends
// Receive with the error instead of spinning on a socket that keeps
// failing: the agent's supervisor takes it from there.
type Transport struct {
	conn      atomic.Pointer[net.PacketConn]
	clusterID uint32
	keys      atomic.Pointer[Keyring]
	rbuf      []byte      // Receive's
	drained   bitmapCache // Receive's: the draining bitmaps senders sent before
	batch     batcher     // Send's

	// mu orders the socket's replacement against Close and the receive
	// deadline, so neither is lost on the socket being replaced.
	mu       sync.Mutex
	closed   bool
	deadline time.Time                      // the receive deadline last set
	reopen   func() (net.PacketConn, error) // nil: a failed read ends Receive
	reopened time.Time                      // when the socket was last replaced

	sent, sendErrors, received, accepted, reopens atomic.Uint64
	receivedBytes, sentBytes                      atomic.Uint64
	rejected                                      [NumReasons]atomic.Uint64
}

// Listen opens a UDP socket on addr ("host:port"; port 0 picks one). A
// socket that fails is reopened on the same address and port.
func Listen(addr string, clusterID uint32, kr *Keyring) (*Transport, error) {
	conn, err := listenUDP(addr)
	if err != nil {
		return nil, err
	}
	bound := conn.LocalAddr().String()
	return New(conn, clusterID, kr).WithReopen(func() (net.PacketConn, error) { return listenUDP(bound) }), nil
}

func listenUDP(addr string) (net.PacketConn, error) {
	conn, err := net.ListenPacket("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for heartbeats on %s: %w", addr, err)
	}
	growBuffers(conn)
	return conn, nil
}

// socketBuffer is the heartbeat socket's receive buffer: about 2,000
// heartbeats of a 64-node cluster.
const socketBuffer = 4 << 20

// New wraps an open PacketConn.
func New(conn net.PacketConn, clusterID uint32, kr *Keyring) *Transport {
	t := &Transport{clusterID: clusterID}
	t.conn.Store(&conn)
	t.keys.Store(kr)
	return t
}

// WithReopen makes open the way t replaces a socket whose read fails (it
// is called after the old one is closed) and returns t. Call it before
// the first Receive.
func (t *Transport) WithReopen(open func() (net.PacketConn, error)) *Transport {
	t.reopen = open
	return t
}

func (t *Transport) socket() net.PacketConn { return *t.conn.Load() }

// SetKeyring makes kr the keys heartbeats are signed (with its primary) and
// accepted with, from the next one on. Safe while Send and Serve run.
func (t *Transport) SetKeyring(kr *Keyring) { t.keys.Store(kr) }

// Keyring returns the keys in use.
func (t *Transport) Keyring() *Keyring { return t.keys.Load() }

// LocalAddr is the address heartbeats are received on.
func (t *Transport) LocalAddr() net.Addr { return t.socket().LocalAddr() }

// Close closes the socket; Serve returns.
func (t *Transport) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	return t.socket().Close()
}

// Send encodes msg once and sends it to every address. Send is not safe
// for concurrent use with itself (one goroutine sends).
func (t *Transport) Send(msg *Message, to []netip.AddrPort) error {
	b, err := Encode(msg, t.keys.Load())
	if err != nil {
		return err
	}
	var errs []error
	sent := t.batch.sendEvery(t.socket(), b, to, func(ap netip.AddrPort, err error) {
		t.sendErrors.Add(1)
		errs = append(errs, fmt.Errorf("send heartbeat to %s: %w", ap, err))
	})
	t.sent.Add(uint64(sent))
	t.sentBytes.Add(uint64(sent * len(b)))
	return errors.Join(errs...)
}

// sendEach sends b to every address in to, one write each; it calls failed
// for each one refused and returns how many went out.
func sendEach(conn net.PacketConn, b []byte, to []netip.AddrPort, failed func(netip.AddrPort, error)) int {
	sent := 0
	for _, ap := range to {
		if _, err := conn.WriteTo(b, net.UDPAddrFromAddrPort(ap)); err != nil {
			failed(ap, err)
			continue
		}
		sent++
	}
	return sent
}

// Serve reads heartbeats until the socket is closed, counts the rejected
// ones and calls handle with each valid one and the address it came from
// (pass both to Machine.Receive, which checks that address). It returns nil
// once closed.
func (t *Transport) Serve(handle func(msg *Message, from netip.AddrPort)) error {
	for {
		msg, from, err := t.Receive()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		handle(msg, from)
	}
}

// Receive waits for the next valid heartbeat and returns it with the
// address it came from (pass both to Machine.Receive); it counts and skips
// the rejected ones. It returns an error matching os.ErrDeadlineExceeded
// when the receive deadline passes or Interrupt is called, and one matching
// net.ErrClosed once the socket is closed. This lets the goroutine that
// owns the machine read the socket itself, with its next deadline as the
// receive deadline, instead of being handed each heartbeat by another
// goroutine (a wake-up of a second thread per heartbeat, the most of an
// idle agent's cost besides the wake-ups themselves).
func (t *Transport) Receive() (*Message, netip.AddrPort, error) {
	if t.rbuf == nil {
		t.rbuf = make([]byte, MaxMessageSize+1) // one more, to see oversized datagrams
	}
	for {
		conn := t.socket()
		n, from, handled, err := readWait(conn, t.rbuf)
		if !handled {
			var addr net.Addr
			n, addr, err = conn.ReadFrom(t.rbuf)
			if ua, ok := addr.(*net.UDPAddr); ok {
				from = ua.AddrPort()
			}
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, net.ErrClosed) {
				return nil, netip.AddrPort{}, fmt.Errorf("read heartbeat: %w", err)
			}
			if rerr := t.replace(conn); rerr != nil {
				return nil, netip.AddrPort{}, fmt.Errorf("read heartbeat: %w (and %w)", err, rerr)
			}
			continue
		}
		msg, ok := t.decode(n)
		if !ok {
			continue
		}
		return msg, netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), nil
	}
}

// ReceiveQueued returns the next valid heartbeat already waiting in the
// socket, without waiting for one (ok false: none is), so that the
// goroutine that Receive woke takes every heartbeat that arrived meanwhile
// before it acts on them: peers send in step, and a node that woke for
// each of 63 heartbeats and stepped its machine after each paid for 63
// wake-ups and steps a period (bench/scale.sh). Rejected datagrams are
// counted and skipped.
func (t *Transport) ReceiveQueued() (*Message, netip.AddrPort, bool) {
	if t.rbuf == nil {
		t.rbuf = make([]byte, MaxMessageSize+1)
	}
	for {
		n, from, ok := readQueued(t.socket(), t.rbuf)
		if !ok {
			return nil, netip.AddrPort{}, false
		}
		msg, ok := t.decode(n)
		if !ok {
			continue
		}
		return msg, netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), true
	}
}

// decode counts the datagram of n bytes in rbuf and decodes it; a rejected
// one is counted by reason.
func (t *Transport) decode(n int) (*Message, bool) {
	t.received.Add(1)
	t.receivedBytes.Add(uint64(n))
	msg, err := decode(t.rbuf[:n], t.keys.Load(), t.clusterID, &t.drained)
	if err != nil {
		t.Reject(ReasonOf(err))
		return nil, false
	}
	t.accepted.Add(1)
	return msg, true
}

// reopenPause: a socket replaced this recently that fails again is not
// replaced again.
const reopenPause = time.Second

// replace closes conn, the socket whose read failed, and opens its
// successor with the receive deadline in force; an error when t cannot
// reopen, is closed, or replaced the socket less than reopenPause ago.
func (t *Transport) replace(conn net.PacketConn) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return net.ErrClosed
	case t.reopen == nil:
		return errors.New("no way to reopen the socket")
	case time.Since(t.reopened) < reopenPause:
		return fmt.Errorf("the socket reopened %v ago failed too", time.Since(t.reopened).Round(time.Millisecond))
	}
	conn.Close()
	next, err := t.reopen()
	if err != nil {
		return fmt.Errorf("reopen: %w", err)
	}
	if err := next.SetReadDeadline(t.deadline); err != nil {
		next.Close()
		return fmt.Errorf("reopen: %w", err)
	}
	t.conn.Store(&next)
	t.reopened = time.Now()
	t.reopens.Add(1)
	return nil
}

// SetReceiveDeadline sets when a Receive waiting for a heartbeat gives up;
// the zero time: never.
func (t *Transport) SetReceiveDeadline(d time.Time) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.deadline = d
	return t.socket().SetReadDeadline(d)
}

// Interrupt ends a Receive waiting now, or the next one, until the next
// SetReceiveDeadline: it returns os.ErrDeadlineExceeded. Safe from any
// goroutine: whoever hands the receiving goroutine work calls it after.
func (t *Transport) Interrupt() { t.SetReceiveDeadline(longAgo) }

// longAgo is a deadline that has passed.
var longAgo = time.Unix(1, 0)

// Reject counts one heartbeat dropped for reason r after decoding.
func (t *Transport) Reject(r Reason) {
	if r < NumReasons {
		t.rejected[r].Add(1)
	}
}

// Stats returns the counters.
func (t *Transport) Stats() Stats {
	s := Stats{Sent: t.sent.Load(), SendErrors: t.sendErrors.Load(), Received: t.received.Load(), Accepted: t.accepted.Load(), Reopens: t.reopens.Load(),
		ReceivedBytes: t.receivedBytes.Load(), SentBytes: t.sentBytes.Load()}
	for r := range s.Rejected {
		s.Rejected[r] = t.rejected[r].Load()
	}
	return s
}
