package heartbeat

import (
	"errors"
	"net"
	"net/netip"
	"slices"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// batchWriter sends many datagrams in one system call (sendmmsg).
type batchWriter interface {
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

// batcher sends a heartbeat to every peer in one system call (sendmmsg):
// a write per peer was a system call, and the runtime's work around it,
// per peer per period, most of what a send cost besides the kernel's work
// for each datagram. Its buffers are reused from one send to the next; it
// is not safe for concurrent use.
type batcher struct {
	conn net.PacketConn // the socket w writes to
	v4   bool           // the socket's family
	w    batchWriter
	ms   []ipv4.Message
	to   []netip.AddrPort
}

// sendEvery sends b to every address in to; it calls failed for each one
// the socket refused and returns how many went out. An address of another
// family than the socket's, or a socket that is no UDP socket, is sent to
// alone.
func (bt *batcher) sendEvery(conn net.PacketConn, b []byte, to []netip.AddrPort, failed func(netip.AddrPort, error)) int {
	if conn != bt.conn {
		uc, ok := conn.(*net.UDPConn)
		la, _ := conn.LocalAddr().(*net.UDPAddr)
		if !ok || la == nil {
			return sendEach(conn, b, to, failed)
		}
		bt.conn, bt.v4 = conn, la.IP.To4() != nil
		if bt.v4 {
			bt.w = ipv4.NewPacketConn(uc)
		} else {
			bt.w = ipv6.NewPacketConn(uc)
		}
	}
	// Room for every message; the ones kept from the last send keep their
	// Buffers slices.
	bt.ms, bt.to = slices.Grow(bt.ms[:0], len(to)), bt.to[:0]
	sent := 0
	for _, ap := range to {
		if ap.Addr().Unmap().Is4() != bt.v4 {
			sent += sendEach(conn, b, []netip.AddrPort{ap}, failed)
			continue
		}
		bt.ms = bt.ms[:len(bt.ms)+1]
		m := &bt.ms[len(bt.ms)-1]
		if len(m.Buffers) != 1 {
			m.Buffers = make([][]byte, 1)
		}
		m.Buffers[0], m.Addr = b, net.UDPAddrFromAddrPort(netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
		bt.to = append(bt.to, ap)
	}
	for rest, left := bt.ms, bt.to; len(rest) > 0; {
		n, err := bt.w.WriteBatch(rest, 0)
		n = max(n, 0)
		sent += n
		rest, left = rest[n:], left[n:]
		switch {
		case err != nil && len(rest) > 0:
			// The first datagram not sent is the one refused.
			failed(left[0], err)
			rest, left = rest[1:], left[1:]
		case err != nil || n == 0:
			if err == nil {
				err = errors.New("the socket took none of the batch")
			}
			for _, ap := range left {
				failed(ap, err)
			}
			return sent
		}
	}
	return sent
}
