package announce

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"

	"github.com/mdlayher/packet"
	"golang.org/x/time/rate"

	"github.com/shoalnet/shoal/rules"
)

// protocol is what sets the ARP responder and the NDP responder apart;
// the loop that reads requests, answers them and counts the verdicts, and
// the announcements, are the same for both.
type protocol struct {
	name string // in errors: "arp", "ndp"
	// reply decides a frame and, when it is a request to answer, frames
	// the reply (arpReply, ndpReply).
	reply func(frame []byte, ownMAC net.HardwareAddr, vips []netip.Addr, mode rules.MACMode) ([]byte, replyVerdict)
	// announces picks the VIPs the protocol announces: its family's.
	announces func(vip netip.Addr) bool
	// announcement frames the announcement of vip (gratuitousARP,
	// unsolicitedNA), sent to announceTo.
	announcement func(ownMAC net.HardwareAddr, vip netip.Addr, mode rules.MACMode) []byte
	announceTo   net.HardwareAddr
	announceName string // in errors
}

var (
	arpProtocol = &protocol{
		name: "arp", reply: arpReply,
		announces:    netip.Addr.Is4,
		announcement: gratuitousARP, announceTo: broadcastMAC, announceName: "gratuitous arp",
	}
	ndpProtocol = &protocol{
		name: "ndp", reply: ndpReply,
		announces:    func(vip netip.Addr) bool { return vip.Is6() && !vip.Is4In6() },
		announcement: unsolicitedNA, announceTo: allNodesMAC, announceName: "unsolicited neighbor advertisement",
	}
)

// responder answers a protocol's requests for the VIPs on a packet socket
// of the cluster interface, within a rate limit, and counts what it did
// with each frame. The ARP and NDP responders embed it and keep what only
// they need (their group memberships).
type responder struct {
	proto  *protocol
	conn   *packet.Conn
	ownMAC func() net.HardwareAddr // the interface's current MAC
	limit  *rate.Limiter
	stats  *replyStats
	vips   atomic.Pointer[vipSet] // what it answers for; set by the owner's setVIPs

	done chan struct{} // closed when serve returns
	err  error         // why serve returned; read after done
}

// newResponder makes a responder on conn, answering for no VIP yet;
// start starts it.
func newResponder(proto *protocol, conn *packet.Conn, ownMAC func() net.HardwareAddr, limit *rate.Limiter, stats *replyStats) *responder {
	r := &responder{proto: proto, conn: conn, ownMAC: ownMAC, limit: limit, stats: stats, done: make(chan struct{})}
	r.vips.Store(&vipSet{})
	return r
}

// start runs serve until the socket fails or is closed; done is closed
// then, and err says why.
func (r *responder) start() {
	go func() {
		defer close(r.done)
		r.err = r.serve()
	}()
}

// serve answers requests until the socket fails or is closed (nil).
func (r *responder) serve() error {
	buf := make([]byte, 1600)
	for {
		n, _, err := r.conn.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("read %s: %w", r.proto.name, err)
		}
		set := r.vips.Load()
		reply, v := r.proto.reply(buf[:n], r.ownMAC(), set.vips, set.mode)
		if v == replied {
			if !r.limit.Allow() {
				v = rateLimited
			} else if _, err := r.conn.WriteTo(reply, &packet.Addr{HardwareAddr: reply[0:6]}); err != nil {
				continue // not answered: counted as nothing
			}
		}
		r.stats.n[v].Add(1)
	}
}

// announce sends the protocol's announcement for each VIP of vips in its
// family (gratuitous ARP for the IPv4 ones, an unsolicited Neighbor
// Advertisement for the IPv6 ones), at its cluster MAC in the responder's
// mode.
func (r *responder) announce(vips []netip.Addr) error {
	var errs []error
	mode := r.vips.Load().mode
	for _, vip := range vips {
		if !r.proto.announces(vip) {
			continue
		}
		f := r.proto.announcement(r.ownMAC(), vip, mode)
		if _, err := r.conn.WriteTo(f, &packet.Addr{HardwareAddr: r.proto.announceTo}); err != nil {
			errs = append(errs, fmt.Errorf("%s for %s: %w", r.proto.announceName, vip, err))
		}
	}
	return errors.Join(errs...)
}

// close closes the socket and waits for serve.
func (r *responder) close() error {
	err := r.conn.Close()
	<-r.done
	return err
}
