package heartbeat

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"time"
)

// Stats are a Transport's counters, for metrics.
type Stats struct {
	Sent       uint64 // datagrams sent
	SendErrors uint64 // datagrams the socket refused
	Received   uint64 // datagrams read
	Accepted   uint64 // heartbeats handed on (decoded and authenticated)
	// Rejected counts dropped heartbeats by reason: the codec's, and the
	// machine's (stale, unknown node, self) as reported through Reject.
	Rejected [NumReasons]uint64
}

// Transport sends and receives heartbeats over UDP (any PacketConn). It is
// fed peer addresses; it discovers nothing. Send may run concurrently with
// Serve or Receive (one goroutine receives, by either).
type Transport struct {
	conn      net.PacketConn
	clusterID uint32
	keys      atomic.Pointer[Keyring]
	rbuf      []byte // Receive's

	sent, sendErrors, received, accepted atomic.Uint64
	rejected                             [NumReasons]atomic.Uint64
}

// Listen opens a UDP socket on addr ("host:port"; port 0 picks one).
func Listen(addr string, clusterID uint32, kr *Keyring) (*Transport, error) {
	conn, err := net.ListenPacket("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for heartbeats on %s: %w", addr, err)
	}
	growBuffers(conn)
	return New(conn, clusterID, kr), nil
}

// socketBuffer is the heartbeat socket's receive buffer: about 2,000
// heartbeats of a 64-node cluster.
const socketBuffer = 4 << 20

// New wraps an open PacketConn.
func New(conn net.PacketConn, clusterID uint32, kr *Keyring) *Transport {
	t := &Transport{conn: conn, clusterID: clusterID}
	t.keys.Store(kr)
	return t
}

// SetKeyring makes kr the keys heartbeats are signed (with its primary) and
// accepted with, from the next one on. Safe while Send and Serve run.
func (t *Transport) SetKeyring(kr *Keyring) { t.keys.Store(kr) }

// Keyring returns the keys in use.
func (t *Transport) Keyring() *Keyring { return t.keys.Load() }

// LocalAddr is the address heartbeats are received on.
func (t *Transport) LocalAddr() net.Addr { return t.conn.LocalAddr() }

// Close closes the socket; Serve returns.
func (t *Transport) Close() error { return t.conn.Close() }

// Send encodes msg once and sends it to every address.
func (t *Transport) Send(msg *Message, to []netip.AddrPort) error {
	b, err := Encode(msg, t.keys.Load())
	if err != nil {
		return err
	}
	var errs []error
	for _, ap := range to {
		if _, err := t.conn.WriteTo(b, net.UDPAddrFromAddrPort(ap)); err != nil {
			t.sendErrors.Add(1)
			errs = append(errs, fmt.Errorf("send heartbeat to %s: %w", ap, err))
			continue
		}
		t.sent.Add(1)
	}
	return errors.Join(errs...)
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
		n, addr, err := t.conn.ReadFrom(t.rbuf)
		if err != nil {
			return nil, netip.AddrPort{}, fmt.Errorf("read heartbeat: %w", err)
		}
		t.received.Add(1)
		msg, err := Decode(t.rbuf[:n], t.keys.Load(), t.clusterID)
		if err != nil {
			t.Reject(ReasonOf(err))
			continue
		}
		t.accepted.Add(1)
		var from netip.AddrPort
		if ua, ok := addr.(*net.UDPAddr); ok {
			from = ua.AddrPort()
		}
		return msg, from, nil
	}
}

// SetReceiveDeadline sets when a Receive waiting for a heartbeat gives up;
// the zero time: never.
func (t *Transport) SetReceiveDeadline(d time.Time) error { return t.conn.SetReadDeadline(d) }

// Interrupt ends a Receive waiting now, or the next one, until the next
// SetReceiveDeadline: it returns os.ErrDeadlineExceeded. Safe from any
// goroutine: whoever hands the receiving goroutine work calls it after.
func (t *Transport) Interrupt() { t.conn.SetReadDeadline(longAgo) }

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
	s := Stats{Sent: t.sent.Load(), SendErrors: t.sendErrors.Load(), Received: t.received.Load(), Accepted: t.accepted.Load()}
	for r := range s.Rejected {
		s.Rejected[r] = t.rejected[r].Load()
	}
	return s
}
