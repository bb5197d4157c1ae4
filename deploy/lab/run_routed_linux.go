package lab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/shoalnet/shoal/deploy/lab/load"
)

// runRouted is Run's pull loop in routed mode: every pull is made under
// traffic, on the next node in turn, and measures two things. Withdrawal:
// from the pull until the router's kernel route to the VIP no longer has
// the victim as a next hop (BFD down, bgpd withdraws, zebra replaces the
// route). Recovery: from the pull until the start of the last request that
// failed; every request started later went through (requests that waited
// for a SYN retransmission are counted in the load's result apart).
func (l *Lab) runRouted(ctx context.Context, o RunOptions, rep *Report) error {
	rep.Mode = "routed"
	all := l.NodeAddrs()
	la := LoadArgs{Duration: o.Duration, Concurrency: o.Concurrency, Rate: o.Rate}
	const lead = time.Second
	victim := len(l.Nodes) - 1
	for i := 0; i < max(o.Pulls, 1); i++ {
		if i > 0 {
			if err := l.Plug(ctx, l.Nodes[victim].Name); err != nil {
				return err
			}
			if err := l.waitNextHops(ctx, all, o.ReadyTimeout); err != nil {
				return fmt.Errorf("lab: after plugging %s back: %w", l.Nodes[victim].Name, err)
			}
			victim = (victim + len(l.Nodes) - 1) % len(l.Nodes)
		}
		name := l.Nodes[victim].Name
		survivors := slices.DeleteFunc(slices.Clone(all), func(a netip.Addr) bool { return a == l.Nodes[victim].Addr })
		during := la
		during.Duration = lead + o.Duration
		started := make(chan struct{})
		during.OnStart = func() { close(started) }
		type out struct {
			res load.Result
			err error
		}
		done := make(chan out, 1)
		go func() {
			r, _, err := l.loadEach(ctx, during, nil, o.Progress)
			done <- out{r, err}
		}()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case r := <-done:
			return fmt.Errorf("lab: the load ended before it started: %w", r.err)
		case <-started:
		}
		time.Sleep(lead)
		pulled, err := l.PullAt(ctx, name)
		if err != nil {
			return err
		}
		withdrawn, werr := l.waitKernelHops(ctx, survivors, pulled, o.FailoverTimeout)
		r := <-done
		if r.err != nil {
			return r.err
		}
		if werr != nil {
			return werr
		}
		pullAt := ms(pulled.Sub(r.res.Start))
		recovery := 0.0
		for _, f := range r.res.FailureList {
			if f.AtMS+f.LatencyMS >= pullAt {
				recovery = max(recovery, f.AtMS-pullAt)
			}
		}
		rep.Failovers = append(rep.Failovers, ms(withdrawn))
		rep.Recoveries = append(rep.Recoveries, recovery)
		if i == 0 {
			rep.Victim, rep.PullAtMS, rep.FailoverMS, rep.During = name, pullAt, ms(withdrawn), r.res
		} else {
			rep.LaterFailures += r.res.Failures
		}
		l.progress(o.Progress, "pull %d/%d (%s): the router dropped it after %.0f ms; the last request that failed started %.0f ms after the pull (%d failed, %d delayed of %d)",
			i+1, o.Pulls, name, ms(withdrawn), recovery, r.res.Failures, r.res.Delayed, r.res.Requests)
	}
	if err := l.Plug(ctx, l.Nodes[victim].Name); err != nil {
		return err
	}
	if err := l.waitNextHops(ctx, all, o.ReadyTimeout); err != nil {
		return fmt.Errorf("lab: after plugging %s back: %w", l.Nodes[victim].Name, err)
	}
	l.progress(o.Progress, "traffic after the pulls (%v)", o.Duration)
	var err error
	rep.After, _, err = l.loadEach(ctx, la, nil, o.Progress)
	return err
}

// waitNextHops waits until FRR's route to the VIP has exactly want as next
// hops.
func (l *Lab) waitNextHops(ctx context.Context, want []netip.Addr, timeout time.Duration) error {
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	return Poll(ctx, timeout, 50*time.Millisecond, func() error {
		hops, err := l.NextHops(ctx, l.VIP)
		if err != nil {
			return err
		}
		if !slices.Equal(hops, want) {
			return fmt.Errorf("next hops %v, want %v", hops, want)
		}
		return nil
	})
}

// waitKernelHops polls the router's kernel route to the VIP every 5 ms
// until its next hops are want, and returns the time since from.
func (l *Lab) waitKernelHops(ctx context.Context, want []netip.Addr, from time.Time, timeout time.Duration) (time.Duration, error) {
	ns, err := netns.GetFromName(l.Router.Namespace)
	if err != nil {
		return 0, fmt.Errorf("lab: router namespace: %w", err)
	}
	defer ns.Close()
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		return 0, fmt.Errorf("lab: netlink in %s: %w", l.Router.Namespace, err)
	}
	defer nl.Close()
	var last []netip.Addr
	err = Poll(ctx, timeout, 5*time.Millisecond, func() error {
		if last, err = kernelHops(nl, l.VIP); err != nil {
			return err
		}
		if !slices.Equal(last, want) {
			return fmt.Errorf("next hops %v", last)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("lab: the router's route to %s kept %v, want %v: %w", l.VIP, last, want, err)
	}
	return time.Since(from), nil
}

// kernelHops returns the gateways of the kernel's route to vip, sorted.
func kernelHops(nl *netlink.Handle, vip netip.Addr) ([]netip.Addr, error) {
	routes, err := nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: &net.IPNet{IP: vip.AsSlice(), Mask: net.CIDRMask(vip.BitLen(), vip.BitLen())}}, netlink.RT_FILTER_DST)
	if err != nil {
		return nil, err
	}
	var hops []netip.Addr
	for _, r := range routes {
		if a, ok := netip.AddrFromSlice(r.Gw); ok {
			hops = append(hops, a.Unmap())
		}
		for _, nh := range r.MultiPath {
			if a, ok := netip.AddrFromSlice(nh.Gw); ok {
				hops = append(hops, a.Unmap())
			}
		}
	}
	slices.SortFunc(hops, netip.Addr.Compare)
	return hops, nil
}
