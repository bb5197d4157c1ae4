package agent

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync/atomic"

	"github.com/shoalnet/shoal/heartbeat"
)

// hbLink is the agent's UDP socket for heartbeats: it sends one encoded
// message to every peer and hands valid received ones to the loop, counting
// rejects by reason.
type hbLink struct {
	conn     *net.UDPConn
	sent     atomic.Uint64
	sendErrs atomic.Uint64
	received atomic.Uint64
	rejected [heartbeat.NumReasons]atomic.Uint64
}

func listenHeartbeat(addr string) (*hbLink, error) {
	ua, err := net.ResolveUDPAddr("udp4", addr)
	if err != nil {
		return nil, err
	}
	c, err := net.ListenUDP("udp4", ua)
	if err != nil {
		return nil, err
	}
	return &hbLink{conn: c}, nil
}

// Send encodes msg once and sends it to every address.
func (l *hbLink) Send(msg *heartbeat.Message, key []byte, to []netip.AddrPort) error {
	b, err := heartbeat.Encode(msg, key)
	if err != nil {
		return err
	}
	var errs []error
	for _, ap := range to {
		if _, err := l.conn.WriteToUDPAddrPort(b, ap); err != nil {
			l.sendErrs.Add(1)
			errs = append(errs, err)
			continue
		}
		l.sent.Add(1)
	}
	return errors.Join(errs...)
}

// Receive decodes heartbeats until ctx ends, passing valid ones to out.
func (l *hbLink) Receive(ctx context.Context, key []byte, clusterID uint32, out chan<- *heartbeat.Message) {
	stop := context.AfterFunc(ctx, func() { l.conn.Close() })
	defer stop()
	buf := make([]byte, heartbeat.MaxMessageSize+1)
	for {
		n, _, err := l.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		msg, err := heartbeat.Decode(buf[:n], key, clusterID)
		if err != nil {
			l.rejected[heartbeat.ReasonOf(err)].Add(1)
			continue
		}
		l.received.Add(1)
		select {
		case out <- msg:
		case <-ctx.Done():
			return
		}
	}
}

// Stats returns the link's counters by event name.
func (l *hbLink) Stats() map[string]uint64 {
	m := map[string]uint64{"sent": l.sent.Load(), "send_errors": l.sendErrs.Load(), "received": l.received.Load()}
	for r := range l.rejected {
		if n := l.rejected[r].Load(); n > 0 {
			m["rejected_"+heartbeat.Reason(r).String()] = n
		}
	}
	return m
}

func (l *hbLink) Close() error { return l.conn.Close() }
