package announce

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/shoalnet/shoal/rules"
)

// recheck is how often the announcer tries again to open a responder that
// is down; at rest, with both up, it polls nothing.
const recheck = time.Second

// reopenPause: a responder (ARP or NDP) that fails again this soon after
// its last failure is reopened at the next recheck, not at once.
const reopenPause = 100 * time.Millisecond

// L2Config is what ListenL2 needs.
type L2Config struct {
	Interface string                  // the cluster interface's name
	Index     int                     // and its index
	MAC       func() net.HardwareAddr // the interface's current MAC: the frames' source
	Log       *slog.Logger
	// ARPLimit and NDPLimit bound the replies a second; nil: arpReplyRate
	// with arpReplyBurst.
	ARPLimit, NDPLimit *rate.Limiter
}

// L2 claims the VIPs on the cluster's LAN, as NLB does: it answers ARP
// and Neighbor Solicitations for them with the cluster MAC, announces them
// (gratuitous ARP, unsolicited Neighbor Advertisements), holds the
// interface's membership of the cluster MACs and, in igmp mode, of the
// VIPs' groups. Every node answers alike, so eligibility changes nothing
// here: the data plane decides which node keeps a packet.
//
// One goroutine owns the responders: it reopens one whose socket failed
// and applies what the methods ask, each call waiting until it is done.
type L2 struct {
	ifname string
	log    *slog.Logger
	mac    func() net.HardwareAddr

	// Owned by run.
	ifindex   int
	vips      []netip.Addr
	mode      rules.MACMode
	groups    *groupMember  // the igmp mode's group memberships
	arp       *arpResponder // nil while it is down
	ndp       *ndpResponder // nil while it is down
	arpFailed time.Time     // when a responder last failed
	ndpFailed time.Time
	lastErr   map[string]error // last logged problem by kind, to log changes once

	arpStats, ndpStats     *replyStats // outlive the responders
	arpLimit, ndpLimit     *rate.Limiter
	arpRestart, ndpRestart atomic.Uint64 // responders reopened after a failure
	health                 atomic.Pointer[error]

	ops  chan func()
	quit chan struct{}
	done chan struct{} // closed when run returns
}

// ListenL2 opens the responders and the group socket on the cluster
// interface, answering for no VIP until Follow.
func ListenL2(cfg L2Config) (*L2, error) {
	l := &L2{
		ifname: cfg.Interface, ifindex: cfg.Index, mac: cfg.MAC, log: cmp.Or(cfg.Log, slog.Default()),
		arpStats: &replyStats{}, arpLimit: cmp.Or(cfg.ARPLimit, rate.NewLimiter(arpReplyRate, arpReplyBurst)),
		ndpStats: &replyStats{}, ndpLimit: cmp.Or(cfg.NDPLimit, rate.NewLimiter(arpReplyRate, arpReplyBurst)),
		lastErr: map[string]error{}, ops: make(chan func()), quit: make(chan struct{}), done: make(chan struct{}),
	}
	var err error
	if l.groups, err = listenGroups(); err != nil {
		return nil, err
	}
	if err := l.openARP(); err != nil {
		l.closeSockets()
		return nil, err
	}
	if err := l.openNDP(); err != nil {
		l.closeSockets()
		return nil, err
	}
	l.publish()
	go l.run()
	return l, nil
}

// do runs f on the announcer's goroutine and waits for it; after Close it
// does nothing.
func (l *L2) do(f func()) {
	ran := make(chan struct{})
	select {
	case l.ops <- func() { f(); close(ran) }:
		<-ran
	case <-l.done:
	}
}

// Follow makes the responders answer for vips at their cluster MACs in
// mode, and joins the igmp mode's groups; a changed mode re-announces
// every VIP at its new MAC. The host calls it while the VIPs are on lo.
func (l *L2) Follow(vips []netip.Addr, mode rules.MACMode, eligible bool) error {
	var err error
	l.do(func() { err = l.follow(slices.Clone(vips), mode) })
	return err
}

func (l *L2) follow(vips []netip.Addr, mode rules.MACMode) error {
	var errs []error
	set := vipSet{vips, mode}
	if l.groups != nil {
		if err := l.groups.set(l.ifindex, groupsOf(set)); err != nil {
			errs = append(errs, err)
		}
	}
	// A changed mode re-announces every VIP at its new MAC; the first
	// Follow announces nothing (the host announces once it is ready).
	remap := mode != l.mode && l.vips != nil
	if remap {
		l.log.Info("mac mode changed: re-announcing every vip", "mode", mode, "was", l.mode)
	}
	l.vips, l.mode = vips, mode
	if l.arp != nil {
		if err := l.arp.setVIPs(set); err != nil {
			errs = append(errs, err)
		}
	}
	if l.ndp != nil {
		if err := l.ndp.setVIPs(set); err != nil {
			errs = append(errs, err)
		}
	}
	if remap {
		l.announce(vips)
	}
	return errors.Join(errs...)
}

// Announce sends a gratuitous ARP for each IPv4 VIP of vips and an
// unsolicited Neighbor Advertisement for each IPv6 one; nil means every
// VIP (a view or the interface's MAC changed).
func (l *L2) Announce(vips []netip.Addr) {
	l.do(func() {
		if vips == nil {
			vips = l.vips
		}
		l.announce(vips)
	})
}

func (l *L2) announce(vips []netip.Addr) {
	if l.arp != nil {
		if err := l.arp.announce(vips); err != nil {
			l.log.Warn("gratuitous arp", "err", err)
		}
	}
	if l.ndp != nil {
		if err := l.ndp.announce(vips); err != nil {
			l.log.Warn("unsolicited neighbor advertisement", "err", err)
		}
	}
}

// Relink moves the announcer to a recreated cluster interface: the
// responders reopen on it, and announce every VIP.
func (l *L2) Relink(ifindex int) {
	l.do(func() {
		if ifindex == l.ifindex {
			return
		}
		l.ifindex = ifindex
		if l.arp != nil {
			l.arp.close()
			l.arp = nil
		}
		if l.ndp != nil {
			l.ndp.close()
			l.ndp = nil
		}
		l.repair()
	})
}

// Health is nil while both responders answer, or says what is wrong.
func (l *L2) Health() error { return *l.health.Load() }

// Counters returns each responder's counters by verdict, with how many
// times it was reopened after a failure, by protocol ("arp", "ndp").
func (l *L2) Counters() map[string]map[string]uint64 {
	arp, ndp := l.arpStats.counters(), l.ndpStats.counters()
	arp["restarts"], ndp["restarts"] = l.arpRestart.Load(), l.ndpRestart.Load()
	return map[string]map[string]uint64{"arp": arp, "ndp": ndp}
}

// Memberships returns the multicast MACs the responders hold on the
// interface: the cluster MACs and the IPv6 VIPs' solicited-node groups. A
// restart keeps them on the interface while no agent holds them.
func (l *L2) Memberships() []string {
	var macs []string
	l.do(func() {
		if l.arp != nil {
			macs = slices.Clone(l.arp.joined)
		}
		if l.ndp != nil {
			macs = append(macs, l.ndp.groupMACs()...)
		}
	})
	return macs
}

// Close stops the goroutine and closes the responders (leaving the
// cluster MACs and the groups).
func (l *L2) Close() error {
	select {
	case <-l.quit:
	default:
		close(l.quit)
	}
	<-l.done
	return l.closeSockets()
}

func (l *L2) run() {
	defer close(l.done)
	t := time.NewTimer(recheck)
	defer t.Stop()
	for {
		var arpDone, ndpDone <-chan struct{}
		if l.arp != nil {
			arpDone = l.arp.done
		}
		if l.ndp != nil {
			ndpDone = l.ndp.done
		}
		var again <-chan time.Time // only while a responder is down
		if l.arp == nil || l.ndp == nil {
			again = t.C
		}
		select {
		case <-l.quit:
			return
		case f := <-l.ops:
			f()
			continue
		case <-arpDone:
			wait := l.failed(l.arp.responder, &l.arpRestart, &l.arpFailed)
			l.arp.close()
			l.arp = nil
			if wait {
				l.publish()
				t.Reset(recheck)
				continue
			}
		case <-ndpDone:
			wait := l.failed(l.ndp.responder, &l.ndpRestart, &l.ndpFailed)
			l.ndp.close()
			l.ndp = nil
			if wait {
				l.publish()
				t.Reset(recheck)
				continue
			}
		case <-again:
		}
		l.repair()
		t.Reset(recheck)
	}
}

// failed logs and counts a responder whose serve returned, and reports
// whether it failed again within reopenPause of its last failure: then the
// reopening waits for the next recheck rather than spinning on a broken
// socket.
func (l *L2) failed(r *responder, restarts *atomic.Uint64, last *time.Time) (wait bool) {
	l.log.Warn(r.proto.name+" responder failed; reopening it", "err", r.err)
	restarts.Add(1)
	wait = time.Since(*last) < reopenPause
	*last = time.Now()
	return wait
}

// repair reopens a responder that is down and announces every VIP
// through it, then publishes the health that results.
func (l *L2) repair() {
	defer l.publish()
	if l.arp == nil {
		err := l.openARP()
		if l.note("arp", err); err == nil {
			l.log.Info("arp responder reopened", "interface", l.ifname)
			l.note("announce", l.arp.announce(l.vips))
		}
	}
	if l.ndp == nil {
		err := l.openNDP()
		if l.note("ndp", err); err == nil {
			l.log.Info("ndp responder reopened", "interface", l.ifname)
			l.note("announce6", l.ndp.announce(l.vips))
		}
	}
}

// openARP opens the ARP responder on the cluster interface.
func (l *L2) openARP() error {
	ifi, err := net.InterfaceByIndex(l.ifindex)
	if err != nil {
		return fmt.Errorf("cluster interface %s: %w", l.ifname, err)
	}
	a, err := listenARP(ifi, vipSet{l.vips, l.mode}, l.mac, l.arpLimit, l.arpStats)
	if err != nil {
		return err
	}
	l.arp = a
	return nil
}

// openNDP opens the NDP responder on the cluster interface.
func (l *L2) openNDP() error {
	ifi, err := net.InterfaceByIndex(l.ifindex)
	if err != nil {
		return fmt.Errorf("cluster interface %s: %w", l.ifname, err)
	}
	n, err := listenNDP(ifi, vipSet{l.vips, l.mode}, l.mac, l.ndpLimit, l.ndpStats)
	if err != nil {
		return err
	}
	l.ndp = n
	return nil
}

// note logs a problem of a kind when it first appears or changes, and its
// end.
func (l *L2) note(kind string, err error) {
	prev, had := l.lastErr[kind]
	switch {
	case err == nil && had:
		delete(l.lastErr, kind)
		l.log.Info("announcer problem resolved", "kind", kind)
	case err != nil && (!had || prev.Error() != err.Error()):
		l.lastErr[kind] = err
		l.log.Error("announcer problem", "kind", kind, "err", err)
	}
}

// publish computes the announcer's health from the responders.
func (l *L2) publish() {
	var reasons []error
	for _, kind := range []string{"arp", "ndp"} {
		if err, ok := l.lastErr[kind]; ok {
			reasons = append(reasons, err)
		}
	}
	if l.arp == nil {
		reasons = append(reasons, errors.New("arp responder down"))
	}
	if l.ndp == nil {
		reasons = append(reasons, errors.New("ndp responder down"))
	}
	err := errors.Join(reasons...)
	l.health.Store(&err)
}

// closeSockets closes the responders and the group socket.
func (l *L2) closeSockets() error {
	var errs []error
	if l.arp != nil {
		if err := l.arp.close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("close arp socket: %w", err))
		}
		l.arp = nil
	}
	if l.ndp != nil {
		if err := l.ndp.close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("close ndp socket: %w", err))
		}
		l.ndp = nil
	}
	if l.groups != nil {
		if err := l.groups.close(); err != nil {
			errs = append(errs, fmt.Errorf("close igmp socket: %w", err))
		}
		l.groups = nil
	}
	return errors.Join(errs...)
}
