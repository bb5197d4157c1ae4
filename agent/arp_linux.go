package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/mdlayher/packet"
)

// arpResponder answers ARP for the VIPs on the cluster interface. Its packet
// socket also holds the interface's membership of each cluster MAC, so the
// membership ends with the agent, however it ends: a dead agent's node stops
// taking frames for the cluster MAC.
type arpResponder struct {
	conn *packet.Conn
	ifi  *net.Interface
	vips []netip.Addr

	replied, ignored, malformed atomic.Uint64
}

func listenARP(ifi *net.Interface, vips []netip.Addr) (*arpResponder, error) {
	conn, err := packet.Listen(ifi, packet.Raw, etherTypeARP, nil)
	if err != nil {
		return nil, fmt.Errorf("open arp socket on %s: %w", ifi.Name, err)
	}
	for _, vip := range vips {
		if err := conn.JoinGroup(ClusterMAC(vip)); err != nil {
			conn.Close()
			return nil, fmt.Errorf("join cluster mac %s on %s: %w", ClusterMAC(vip), ifi.Name, err)
		}
	}
	return &arpResponder{conn: conn, ifi: ifi, vips: vips}, nil
}

// serve answers requests until ctx ends or the socket is closed.
func (a *arpResponder) serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { a.conn.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, 1600)
	for {
		n, _, err := a.conn.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("read arp: %w", err)
		}
		reply, v := arpReply(buf[:n], a.ifi.HardwareAddr, a.vips)
		switch v {
		case arpReplied:
			if _, err := a.conn.WriteTo(reply, &packet.Addr{HardwareAddr: reply[0:6]}); err == nil {
				a.replied.Add(1)
			}
		case arpNotForVIP:
			a.ignored.Add(1)
		default:
			a.malformed.Add(1)
		}
	}
}

// announce sends a gratuitous ARP for every VIP.
func (a *arpResponder) announce() error {
	var errs []error
	for _, vip := range a.vips {
		f := gratuitousARP(a.ifi.HardwareAddr, vip)
		if _, err := a.conn.WriteTo(f, &packet.Addr{HardwareAddr: broadcastMAC}); err != nil {
			errs = append(errs, fmt.Errorf("gratuitous arp for %s: %w", vip, err))
		}
	}
	return errors.Join(errs...)
}

func (a *arpResponder) close() error { return a.conn.Close() }
