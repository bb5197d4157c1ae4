package announce

import (
	"errors"
	"fmt"
	"net"
	"slices"

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

// arpResponder answers ARP for the VIPs on the cluster interface. Its packet
// socket also holds the interface's membership of each cluster MAC, so the
// membership ends with the agent, however it ends: a dead agent's node stops
// taking frames for the cluster MAC.
type arpResponder struct {
	*responder
	joined []string // the cluster MACs the socket joined; owned by the host
}

// listenARP opens the responder on ifi for vips and starts answering.
func listenARP(ifi *net.Interface, vips vipSet, ownMAC func() net.HardwareAddr, limit *rate.Limiter, stats *replyStats) (*arpResponder, error) {
	conn, err := packet.Listen(ifi, packet.Raw, etherTypeARP, nil)
	if err != nil {
		return nil, fmt.Errorf("open arp socket on %s: %w", ifi.Name, err)
	}
	a := &arpResponder{responder: newResponder(arpProtocol, conn, ownMAC, limit, stats)}
	if err := a.setVIPs(vips); err != nil {
		conn.Close()
		return nil, fmt.Errorf("%s: %w", ifi.Name, err)
	}
	a.start()
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
