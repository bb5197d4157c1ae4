package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync/atomic"

	"github.com/mdlayher/packet"
	"golang.org/x/time/rate"
)

// ARP replies are rate limited, so that a flood of requests (or of forged
// ones) costs the node a bounded amount of work and sends a bounded amount
// of traffic. A LAN of 10,000 clients refreshing every 30 s asks ~330 times
// a second.
const (
	arpReplyRate  = 1000 // replies per second, sustained
	arpReplyBurst = 200
)

// arpStats counts the responder's verdicts; it outlives the sockets, which
// are reopened when they fail.
type arpStats struct {
	n [numARPVerdicts]atomic.Uint64
}

func (s *arpStats) counters() map[string]uint64 {
	m := make(map[string]uint64, numARPVerdicts)
	for v := range numARPVerdicts {
		m[v.String()] = s.n[v].Load()
	}
	return m
}

// arpResponder answers ARP for the VIPs on the cluster interface. Its packet
// socket also holds the interface's membership of each cluster MAC, so the
// membership ends with the agent, however it ends: a dead agent's node stops
// taking frames for the cluster MAC.
type arpResponder struct {
	conn    *packet.Conn
	ifindex int
	ownMAC  func() net.HardwareAddr // the interface's current MAC
	limit   *rate.Limiter
	stats   *arpStats
	vips    atomic.Pointer[vipSet]
	joined  []string // the cluster MACs the socket joined; owned by the host

	done chan struct{} // closed when serve returns
	err  error         // why serve returned; read after done
}

// listenARP opens the responder on ifi for vips and starts answering.
func listenARP(ifi *net.Interface, vips vipSet, ownMAC func() net.HardwareAddr, limit *rate.Limiter, stats *arpStats) (*arpResponder, error) {
	conn, err := packet.Listen(ifi, packet.Raw, etherTypeARP, nil)
	if err != nil {
		return nil, fmt.Errorf("open arp socket on %s: %w", ifi.Name, err)
	}
	a := &arpResponder{conn: conn, ifindex: ifi.Index, ownMAC: ownMAC, limit: limit, stats: stats, done: make(chan struct{})}
	a.vips.Store(&vipSet{})
	if err := a.setVIPs(vips); err != nil {
		conn.Close()
		return nil, fmt.Errorf("%s: %w", ifi.Name, err)
	}
	go func() {
		defer close(a.done)
		a.err = a.serve()
	}()
	return a, nil
}

// setVIPs makes the responder answer for the VIPs of set and holds the
// membership of exactly their cluster MACs in its mode. Not safe for
// concurrent use with itself.
func (a *arpResponder) setVIPs(set vipSet) error {
	set.vips = slices.Clone(set.vips)
	var want []string
	for _, v := range set.vips {
		if m := ClusterMAC(v, set.mode).String(); !slices.Contains(want, m) {
			want = append(want, m)
		}
	}
	var errs []error
	joined := a.joined[:0:0]
	for _, m := range a.joined {
		mac, _ := net.ParseMAC(m)
		if slices.Contains(want, m) {
			joined = append(joined, m)
		} else if err := a.conn.LeaveGroup(mac); err != nil {
			errs = append(errs, fmt.Errorf("leave cluster mac %s: %w", m, err))
			joined = append(joined, m)
		}
	}
	for _, m := range want {
		if slices.Contains(joined, m) {
			continue
		}
		mac, _ := net.ParseMAC(m)
		if err := a.conn.JoinGroup(mac); err != nil {
			errs = append(errs, fmt.Errorf("join cluster mac %s: %w", m, err))
			continue
		}
		joined = append(joined, m)
	}
	a.joined = joined
	a.vips.Store(&set)
	return errors.Join(errs...)
}

// serve answers requests until the socket fails or is closed (nil).
func (a *arpResponder) serve() error {
	buf := make([]byte, 1600)
	for {
		n, _, err := a.conn.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("read arp: %w", err)
		}
		set := a.vips.Load()
		reply, v := arpReply(buf[:n], a.ownMAC(), set.vips, set.mode)
		if v == arpReplied {
			if !a.limit.Allow() {
				v = arpRateLimited
			} else if _, err := a.conn.WriteTo(reply, &packet.Addr{HardwareAddr: reply[0:6]}); err != nil {
				continue // not answered: counted as nothing
			}
		}
		a.stats.n[v].Add(1)
	}
}

// announce sends a gratuitous ARP for each IPv4 VIP of vips (the NDP
// responder announces the IPv6 ones), at its cluster MAC in the
// responder's mode.
func (a *arpResponder) announce(vips []netip.Addr) error {
	var errs []error
	mode := a.vips.Load().mode
	for _, vip := range vips {
		if !vip.Is4() {
			continue
		}
		f := gratuitousARP(a.ownMAC(), vip, mode)
		if _, err := a.conn.WriteTo(f, &packet.Addr{HardwareAddr: broadcastMAC}); err != nil {
			errs = append(errs, fmt.Errorf("gratuitous arp for %s: %w", vip, err))
		}
	}
	return errors.Join(errs...)
}

// close closes the socket (leaving the cluster MACs) and waits for serve.
func (a *arpResponder) close() error {
	err := a.conn.Close()
	<-a.done
	return err
}
