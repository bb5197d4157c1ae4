package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/rules"
)

// hostRecheck is how often the host checks the interface and lo again while
// something is wrong: the retry of a failed repair. At rest, with nothing
// wrong, it checks only on a link event or an address change on lo (an idle
// agent polls nothing).
const hostRecheck = time.Second

// arpReopenPause: a responder (ARP or NDP) that fails again this soon
// after the last failure is reopened at the next check, not at once.
const arpReopenPause = 100 * time.Millisecond

// attachXDP attaches the data plane to the cluster interface and keeps it
// attached from then on (start re-attaches it to a recreated interface).
// Call before start.
func (h *host) attachXDP(x xdpLink) error {
	if err := x.Attach(h.ifname); err != nil {
		return err
	}
	h.xdp, h.xdpIndex = x, h.ifindex
	h.publish()
	return nil
}

// trackMAC wraps the data plane so that the host knows which MAC accepted
// frames are rewritten to: a data plane still rewriting to an old MAC makes
// the node unhealthy (hostHealthy).
func (h *host) trackMAC(dp dataplane) dataplane { return macTracker{dp, h} }

type macTracker struct {
	dataplane
	h *host
}

func (m macTracker) Update(t *filter.Tables, ifMAC net.HardwareAddr) error {
	if err := m.dataplane.Update(t, ifMAC); err != nil {
		return err
	}
	mac := slices.Clone(ifMAC)
	m.h.pushed.Store(&mac)
	return nil
}

// adoptMAC tells the host which MAC adopted tables rewrite to (they were
// not pushed by this process).
func (h *host) adoptMAC(mac net.HardwareAddr) {
	mac = slices.Clone(mac)
	h.pushed.Store(&mac)
}

// start runs the host's goroutine until ctx ends or stop is called: it
// watches the cluster interface (netlink) and re-arms what a link event
// broke: the ARP and NDP responders after a failed read (a link down and up), the
// sysctls, XDP and the cluster MAC membership on a recreated interface,
// and the MAC (changed tells the agent, which pushes tables with it).
func (h *host) start(ctx context.Context, changed func()) {
	ctx, h.cancel = context.WithCancel(ctx)
	h.done = make(chan struct{})
	go func() {
		defer close(h.done)
		h.run(ctx, changed)
	}()
}

// stop ends the host's goroutine and waits for it. The host stays set up
// until teardown.
func (h *host) stop() error {
	h.cancel()
	<-h.done
	return nil
}

// setVIPs makes the host follow the cluster's VIPs and MAC mode (the
// replicated rules state): VIPs on lo, ARP, cluster MAC and igmp group
// membership. It does not wait; the host's goroutine applies the latest
// list. Safe to call at any time, with the same list as often as wanted.
func (h *host) setVIPs(vips []netip.Addr, mode rules.MACMode) {
	set := vipSet{slices.Clone(vips), mode}
	for {
		select {
		case h.vipsCh <- set:
			return
		default:
		}
		select {
		case <-h.vipsCh: // a list not yet applied: replace it
		default:
		}
	}
}

// announce asks for a gratuitous ARP for every IPv4 VIP and an unsolicited
// Neighbor Advertisement for every IPv6 one (a view changed). It does not
// wait.
func (h *host) announce() {
	select {
	case h.announceCh <- struct{}{}:
	default:
	}
}

// hostHealthy reports whether the node's side of the data plane works: the
// program attached to the cluster interface, the ARP and NDP responders
// answering, and the data plane rewriting to the interface's current MAC. The agent
// advertises itself healthy only when this is.
func (h *host) hostHealthy() (bool, string) {
	if st := h.status.Load(); !st.ok {
		return false, st.reason
	}
	mac, pushed := h.mac.Load(), h.pushed.Load()
	if pushed == nil {
		return false, "no tables pushed to the data plane yet"
	}
	if !bytes.Equal(*mac, *pushed) {
		return false, fmt.Sprintf("data plane rewrites to %s, the interface's mac is %s", net.HardwareAddr(*pushed), net.HardwareAddr(*mac))
	}
	return true, ""
}

// arpCounters returns the ARP responder's counters by verdict, and how many
// times it was reopened after a failure.
func (h *host) arpCounters() map[string]uint64 {
	m := h.arpStats.counters()
	m["restarts"] = h.arpRestart.Load()
	return m
}

// ndpCounters returns the NDP responder's counters by verdict, and how many
// times it was reopened after a failure.
func (h *host) ndpCounters() map[string]uint64 {
	m := h.ndpStats.counters()
	m["restarts"] = h.ndpRestart.Load()
	return m
}

func (h *host) run(ctx context.Context, changed func()) {
	ev, endSub := h.subscribe()
	defer func() { endSub() }()
	recheck := time.NewTimer(hostRecheck)
	defer recheck.Stop()
	for {
		var arpDone, ndpDone <-chan struct{}
		if h.arp != nil {
			arpDone = h.arp.done
		}
		if h.ndp != nil {
			ndpDone = h.ndp.done
		}
		// Check again later only while something is wrong.
		var again <-chan time.Time
		if !h.settled() {
			again = recheck.C
		}
		select {
		case <-ctx.Done():
			return
		case u, ok := <-ev.links:
			if !ok { // the subscription failed: subscribe again, after a pause
				endSub()
				if !pause(ctx) {
					return
				}
				ev, endSub = h.subscribe()
			} else if u.Attrs().Name != h.ifname && int(u.Index) != h.ifindex {
				continue
			}
		case u, ok := <-ev.addrs:
			if !ok {
				endSub()
				if !pause(ctx) {
					return
				}
				ev, endSub = h.subscribe()
			} else if u.LinkIndex != ev.lo {
				continue
			}
		case set := <-h.vipsCh:
			h.note("vips", h.applyVIPs(set))
		case <-h.announceCh:
			h.announceAll()
		case <-arpDone:
			again := h.responderFailed(h.arp.responder, &h.arpRestart, &h.arpFailed)
			h.arp.close()
			h.arp = nil
			if again {
				h.publish()
				recheck.Reset(hostRecheck)
				continue // again at once: wait for the next check
			}
		case <-ndpDone:
			again := h.responderFailed(h.ndp.responder, &h.ndpRestart, &h.ndpFailed)
			h.ndp.close()
			h.ndp = nil
			if again {
				h.publish()
				recheck.Reset(hostRecheck)
				continue // again at once: wait for the next check
			}
		case <-again:
		}
		h.sync(changed)
		recheck.Reset(hostRecheck)
	}
}

// settled reports whether the host has nothing to repair or retry (sync
// found it healthy; a failed subscription comes back as closed channels).
func (h *host) settled() bool {
	return h.status.Load().ok
}

// pause waits hostRecheck, or returns false when ctx ends first.
func pause(ctx context.Context) bool {
	t := time.NewTimer(hostRecheck)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// responderFailed logs and counts a responder whose serve returned (it is
// reopened at the next sync), and reports whether it failed again within
// arpReopenPause of its last failure: then the reopening waits for the
// next check rather than spinning on a broken socket.
func (h *host) responderFailed(r *responder, restarts *atomic.Uint64, failed *time.Time) (again bool) {
	h.log.Warn(r.proto.name+" responder failed; reopening it", "err", r.err)
	restarts.Add(1)
	again = time.Since(*failed) < arpReopenPause
	*failed = time.Now()
	return again
}

// hostEvents are the netlink events the host follows: links (the cluster
// interface) and addresses (a VIP taken off lo).
type hostEvents struct {
	links <-chan netlink.LinkUpdate
	addrs <-chan netlink.AddrUpdate
	lo    int // lo's index
}

// subscribe subscribes to link and address events; end cancels the
// subscriptions and waits for the library to let go of the channels. If
// either cannot be had, both channels come closed (run subscribes again).
func (h *host) subscribe() (hostEvents, func()) {
	links := make(chan netlink.LinkUpdate, 64)
	addrs := make(chan netlink.AddrUpdate, 64)
	linksDone, addrsDone := make(chan struct{}), make(chan struct{})
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		err = fmt.Errorf("find lo: %w", err)
	} else if err = netlink.LinkSubscribeWithOptions(links, linksDone, netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) { h.log.Debug("link events", "err", err) },
	}); err != nil {
		err = fmt.Errorf("watch link events: %w", err)
	} else if err = netlink.AddrSubscribeWithOptions(addrs, addrsDone, netlink.AddrSubscribeOptions{
		ErrorCallback: func(err error) { h.log.Debug("address events", "err", err) },
	}); err != nil {
		close(linksDone)
		for range links { // the library closes it once its socket is closed
		}
		err = fmt.Errorf("watch address events: %w", err)
	}
	if err != nil {
		h.note("subscribe", err)
		closedLinks, closedAddrs := make(chan netlink.LinkUpdate), make(chan netlink.AddrUpdate)
		close(closedLinks)
		close(closedAddrs)
		return hostEvents{links: closedLinks, addrs: closedAddrs}, func() {}
	}
	h.note("subscribe", nil)
	var once bool
	return hostEvents{links: links, addrs: addrs, lo: lo.Attrs().Index}, func() {
		if once {
			return
		}
		once = true
		close(linksDone)
		close(addrsDone)
		for range links { // the library closes each channel once its socket is closed
		}
		for range addrs {
		}
	}
}

// sync brings the host in line with the interface and lo as they are now,
// and publishes the health that results.
func (h *host) sync(changed func()) {
	h.checks.Add(1)
	defer h.publish()
	link, err := netlink.LinkByName(h.ifname)
	if err != nil {
		h.note("link", fmt.Errorf("cluster interface %s: %w", h.ifname, err))
		return
	}
	h.note("link", nil)
	attrs := link.Attrs()
	if attrs.Index != h.ifindex {
		h.log.Warn("cluster interface recreated: re-arming sysctls, arp, ndp, cluster mac and xdp", "interface", h.ifname, "ifindex", attrs.Index, "was", h.ifindex)
		h.ifindex, h.sysctlsOK = attrs.Index, false
		if h.arp != nil {
			h.arp.close()
			h.arp = nil
		}
		if h.ndp != nil {
			h.ndp.close()
			h.ndp = nil
		}
	}
	if mac := attrs.HardwareAddr; len(mac) == 6 && !bytes.Equal(mac, h.MAC()) {
		h.log.Warn("cluster interface mac changed", "interface", h.ifname, "mac", mac.String(), "was", h.MAC().String())
		mac = slices.Clone(mac)
		h.mac.Store(&mac)
		changed()
		h.announceAll()
	}
	if !h.sysctlsOK {
		h.note("sysctls", h.setSysctls())
	}
	if h.xdp != nil && (h.xdpIndex != h.ifindex || h.xdp.Mode() == filter.AttachNone) {
		h.xdpIndex = 0
		err := h.xdp.Detach()
		if err == nil {
			err = h.xdp.Attach(h.ifname)
		}
		if h.note("xdp", err); err == nil {
			h.xdpIndex = h.ifindex
			h.log.Info("xdp re-attached", "interface", h.ifname, "mode", h.xdp.Mode())
			changed()
		}
	}
	if h.arp == nil {
		err := h.openARP()
		if h.note("arp", err); err == nil {
			h.log.Info("arp responder reopened", "interface", h.ifname)
			h.note("announce", h.arp.announce(h.vips))
		}
	}
	if h.ndp == nil {
		err := h.openNDP()
		if h.note("ndp", err); err == nil {
			h.log.Info("ndp responder reopened", "interface", h.ifname)
			h.note("announce6", h.ndp.announce(h.vips))
		}
	}
	// Puts back a VIP someone took off lo, retries a failed change.
	h.note("vips", h.applyVIPs(vipSet{h.vips, h.mode}))
}

// announceAll announces every VIP: gratuitous ARP for the IPv4 ones, an
// unsolicited Neighbor Advertisement for the IPv6 ones.
func (h *host) announceAll() {
	if h.arp != nil {
		h.note("announce", h.arp.announce(h.vips))
	}
	if h.ndp != nil {
		h.note("announce6", h.ndp.announce(h.vips))
	}
}

// note logs a problem of a kind when it first appears or changes, and its
// end; it remembers it for publish.
func (h *host) note(kind string, err error) {
	prev, had := h.lastErr[kind]
	switch {
	case err == nil && had:
		delete(h.lastErr, kind)
		h.log.Info("host problem resolved", "kind", kind)
	case err != nil && (!had || prev.Error() != err.Error()):
		h.lastErr[kind] = err
		h.log.Error("host problem", "kind", kind, "err", err)
	}
}

// publish computes the host's health from what run last found.
func (h *host) publish() {
	var reasons []error
	for _, kind := range []string{"link", "sysctls", "xdp", "arp", "ndp", "vips"} {
		if err, ok := h.lastErr[kind]; ok {
			reasons = append(reasons, err)
		}
	}
	if h.xdp == nil || h.xdpIndex != h.ifindex {
		reasons = append(reasons, fmt.Errorf("xdp not attached to %s", h.ifname))
	}
	if h.arp == nil {
		reasons = append(reasons, errors.New("arp responder down"))
	}
	if h.ndp == nil {
		reasons = append(reasons, errors.New("ndp responder down"))
	}
	st := &hostStatus{ok: len(reasons) == 0}
	if !st.ok {
		st.reason = errors.Join(reasons...).Error()
	}
	if prev := h.status.Load(); prev.ok != st.ok {
		h.log.Info("host health changed", "healthy", st.ok, "reason", st.reason)
	}
	h.status.Store(st)
}
