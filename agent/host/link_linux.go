package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
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

// AttachXDP attaches the data plane to the cluster interface and keeps it
// attached from then on (start re-attaches it to a recreated interface).
// Call before start.
func (h *Host) AttachXDP(x xdpLink) error {
	if err := x.Attach(h.ifname); err != nil {
		return err
	}
	h.xdp, h.xdpIndex = x, h.ifindex
	h.publish()
	return nil
}

// Pushed tells the host which MAC the data plane's tables now rewrite
// accepted frames to (pushed by this process, or adopted from a restart):
// a data plane still rewriting to an old MAC makes the node unhealthy
// (Healthy).
func (h *Host) Pushed(mac net.HardwareAddr) {
	mac = slices.Clone(mac)
	h.pushed.Store(&mac)
}

// Start runs the host's goroutine until ctx ends or Stop is called: it
// watches the cluster interface (netlink) and re-arms what a link event
// broke: the sysctls, XDP and the announcer on a recreated interface, and
// the MAC (changed tells the agent, which pushes tables with it).
func (h *Host) Start(ctx context.Context, changed func()) {
	ctx, h.cancel = context.WithCancel(ctx)
	h.done = make(chan struct{})
	go func() {
		defer close(h.done)
		h.run(ctx, changed)
	}()
}

// Stop ends the host's goroutine and waits for it. The host stays set up
// until teardown.
func (h *Host) Stop() error {
	h.cancel()
	<-h.done
	return nil
}

// SetVIPs makes the host follow the cluster's VIPs and MAC mode (the
// replicated rules state): VIPs on lo and the announcer. It does not wait; the host's goroutine applies the latest
// list. Safe to call at any time, with the same list as often as wanted.
func (h *Host) SetVIPs(vips []netip.Addr, mode rules.MACMode) {
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

// SetEligible tells the host whether this node may take traffic, which
// the announcer follows. It does not wait.
func (h *Host) SetEligible(ok bool) {
	for {
		select {
		case h.eligibleCh <- ok:
			return
		default:
		}
		select {
		case <-h.eligibleCh:
		default:
		}
	}
}

// Announce asks the announcer to announce every VIP again (a view
// changed). It does not wait.
func (h *Host) Announce() {
	select {
	case h.announceCh <- struct{}{}:
	default:
	}
}

// Healthy reports whether the node's side of the data plane works: the
// program attached to the cluster interface, the announcer answering, and
// the data plane rewriting to the interface's current MAC. The agent
// advertises itself healthy only when this is.
func (h *Host) Healthy() (bool, string) {
	if st := h.status.Load(); !st.ok {
		return false, st.reason
	}
	if err := h.ann.Health(); err != nil {
		return false, err.Error()
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

// Counters returns the announcer's counters by protocol ("arp", "ndp"),
// then by what happened.
func (h *Host) Counters() map[string]map[string]uint64 { return h.ann.Counters() }

func (h *Host) run(ctx context.Context, changed func()) {
	ev, endSub := h.subscribe()
	defer func() { endSub() }()
	recheck := time.NewTimer(hostRecheck)
	defer recheck.Stop()
	for {
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
		case ok := <-h.eligibleCh:
			// Only the announcer cares (BGP announces while eligible;
			// L2 answers alike either way): nothing on the host to check.
			if ok != h.eligible {
				h.eligible = ok
				h.note("announce", h.ann.Follow(h.vips, h.mode, ok))
			}
			continue
		case <-h.announceCh:
			h.ann.Announce(nil)
		case <-again:
		}
		h.sync(changed)
		recheck.Reset(hostRecheck)
	}
}

// settled reports whether the host has nothing to repair or retry (sync
// found it healthy; a failed subscription comes back as closed channels).
func (h *Host) settled() bool {
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
func (h *Host) subscribe() (hostEvents, func()) {
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
func (h *Host) sync(changed func()) {
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
		h.log.Warn("cluster interface recreated: re-arming sysctls, the announcer and xdp", "interface", h.ifname, "ifindex", attrs.Index, "was", h.ifindex)
		h.ifindex, h.sysctlsOK = attrs.Index, false
		h.ann.Relink(h.ifindex)
	}
	if mac := attrs.HardwareAddr; len(mac) == 6 && !bytes.Equal(mac, h.MAC()) {
		h.log.Warn("cluster interface mac changed", "interface", h.ifname, "mac", mac.String(), "was", h.MAC().String())
		mac = slices.Clone(mac)
		h.mac.Store(&mac)
		changed()
		h.ann.Announce(nil)
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
	// Puts back a VIP someone took off lo, retries a failed change.
	h.note("vips", h.applyVIPs(vipSet{h.vips, h.mode}))
}

// note logs a problem of a kind when it first appears or changes, and its
// end; it remembers it for publish.
func (h *Host) note(kind string, err error) {
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
func (h *Host) publish() {
	var reasons []error
	for _, kind := range []string{"link", "sysctls", "xdp", "vips"} {
		if err, ok := h.lastErr[kind]; ok {
			reasons = append(reasons, err)
		}
	}
	if h.xdp == nil || h.xdpIndex != h.ifindex {
		reasons = append(reasons, fmt.Errorf("xdp not attached to %s", h.ifname))
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
