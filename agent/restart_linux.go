package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/shoalnet/shoal/filter"
)

// restart arms a hitless restart (control API): the next stop keeps the
// data plane and announces a restart window.
func (a *Agent) restart(_ context.Context, req RestartRequest) (RestartArmed, error) {
	armed, err := a.restartArm.arm(time.Now(), req.Window)
	if err != nil {
		return armed, err
	}
	a.log.Info("restart armed: the next stop keeps the data plane", "window", armed.Window, "until", armed.Until.Format(time.RFC3339))
	return armed, nil
}

// pinDir is where this node's data plane is pinned across a restart:
// pin_dir, or a directory under /sys/fs/bpf/shoal named after the data
// directory, so that agents of several nodes on one kernel (the lab) never
// share one.
func (a *Agent) pinDir() string {
	if a.cfg.PinDir != "" {
		return a.cfg.PinDir
	}
	dir, err := filepath.Abs(a.cfg.DataDir)
	if err != nil {
		dir = a.cfg.DataDir
	}
	sum := sha256.Sum256([]byte(dir))
	return filepath.Join("/sys/fs/bpf/shoal", hex.EncodeToString(sum[:8]))
}

// bootID names the running kernel.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// stopForRestart stops the node for a restart (see restart.go): pin, announce
// the window and wait (at most restartAckTimeout) for every peer to hear it,
// stop, record. It reports false, with the node still running and nothing
// pinned, when the data plane cannot be pinned: the caller hands off as in
// a graceful stop instead.
func (a *Agent) stopForRestart(window time.Duration, stopNode func() error) (bool, error) {
	dir := a.pinDir()
	if err := a.xdp.Pin(dir); err != nil {
		a.log.Error("restart: cannot pin the data plane; stopping gracefully instead", "err", err)
		return false, nil
	}
	start := time.Now()
	actx, cancel := context.WithTimeout(context.Background(), restartAckTimeout)
	acked := a.node.announceRestart(actx, window)
	cancel()
	if !acked {
		// A live peer that did not hear the window would take this node's
		// buckets after T periods while the pinned tables still accept.
		a.log.Warn("restart: not every live peer acknowledged the restart window; stopping gracefully instead", "waited", restartAckTimeout)
		return false, nil // Close unpins
	}
	err := stopNode()
	st := a.node.rec.kernel()
	rr := &restartRecord{BootID: bootID(), PinDir: dir, Pinned: a.xdp.Pinned(),
		LeaseEnd: start.Add(window - a.node.mem.machinePeriod()),
		Accept:   st.accept, PeersDraining: st.peersDraining, Draining: st.draining, Healthy: st.healthy}
	if rerr := a.host.rec.setRestart(rr); rerr != nil {
		// Without the record the next agent cannot adopt: detach as usual
		// (the peers take over when the window ends).
		a.log.Error("restart: cannot record the restart; removing the data plane", "err", rerr)
		return true, errors.Join(err, rerr)
	}
	a.restarting = true
	a.log.Info("stopped for a restart", "window", window, "took", time.Since(start).Round(time.Millisecond), "restart", rr.String())
	return true, err
}

// takeRestart returns the restart a previous agent recorded, if it is one
// of this boot, and forgets it: the pins are adopted (or removed) once, and
// a crash after this start is repaired as any crash.
func (h *host) takeRestart() *restartRecord {
	rr := h.rec.Restart
	if rr == nil {
		return nil
	}
	if err := h.rec.setRestart(nil); err != nil {
		h.log.Warn("forget the restart record", "err", err)
	}
	if rr.BootID != bootID() || rr.Pinned == nil {
		h.log.Warn("restart record of another boot (or without pins): starting afresh", "record", rr.String())
		return nil
	}
	return rr
}

// leave is teardown for a restart: the host's goroutine stops and the ARP
// and NDP sockets close, but the cluster MACs and the MACs of the IPv6
// VIPs' solicited-node groups stay on the interface's multicast list
// (recorded first), so solicitations still reach the node in between;
// the VIPs on lo and the sysctls stay as they are, recorded for the next
// agent.
func (h *host) leave() error {
	var errs []error
	if err := h.stop(); err != nil { // nothing changes the memberships from here on
		errs = append(errs, err)
	}
	var macs []string
	if h.arp != nil {
		macs = slices.Clone(h.arp.joined)
	}
	if h.ndp != nil {
		macs = append(macs, h.ndp.groupMACs()...)
	}
	if len(macs) > 0 {
		if err := h.rec.setMACs(macs); err != nil {
			errs = append(errs, err)
		} else {
			for _, m := range macs {
				if err := multicastMember(h.ifname, m, true); err != nil {
					errs = append(errs, fmt.Errorf("keep cluster mac %s on %s: %w", m, h.ifname, err))
				}
			}
		}
	}
	return errors.Join(append(errs, h.closeSockets())...)
}

// dropRestartMACs removes the cluster MACs a previous agent kept on the
// multicast list for a restart (or left after a crash during one), once
// this agent's ARP socket holds its own memberships.
func (h *host) dropRestartMACs() error {
	if len(h.rec.MACs) == 0 {
		return nil
	}
	var errs []error
	for _, m := range h.rec.MACs {
		if err := multicastMember(h.ifname, m, false); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("remove cluster mac %s from %s: %w", m, h.ifname, err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return h.rec.setMACs(nil)
}

// multicastMember adds (or removes) mac on ifname's multicast list as
// `ip maddr add` does (SIOCADDMULTI): a membership of the device, not of a
// socket, so it outlives the process.
func multicastMember(ifname, mac string, add bool) error {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return fmt.Errorf("bad mac %q", mac)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var ifr struct {
		Name [unix.IFNAMSIZ]byte
		Addr unix.RawSockaddr
		_    [8]byte // struct ifreq's union is 24 bytes
	}
	copy(ifr.Name[:], ifname)
	ifr.Addr.Family = unix.AF_UNSPEC
	for i, b := range hw {
		ifr.Addr.Data[i] = int8(b)
	}
	req := uintptr(unix.SIOCDELMULTI)
	if add {
		req = unix.SIOCADDMULTI
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(unsafe.Pointer(&ifr))); errno != 0 {
		return errno
	}
	return nil
}

// startFromRestart makes the data plane ready at start: it adopts what a
// previous agent pinned for a restart, or loads a fresh one; it returns
// what the first membership machine inherits (nil: nothing) and pushes
// first tables unless adopted ones are kept.
func (a *Agent) startFromRestart(h *host) (*filter.XDP, dataplane, *inheritance, error) {
	rr := h.takeRestart()
	var pinned *filter.Pinned
	if rr != nil {
		pinned = rr.Pinned
	}
	xdp, ad, err := filter.LoadPinnedXDP(a.pinDir(), pinned)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("load xdp: %w", err)
	}
	dp := h.trackMAC(xdp)
	fcfg := a.store.State().FilterConfig()
	var in *inheritance
	switch {
	case rr != nil && ad.Tables && ad.Lease > 0:
		// The tables stay as they are: the first push is membership's,
		// from the inherited set.
		h.adoptMAC(ad.MAC)
		in = inheritFrom(rr, fcfg, time.Now().Add(ad.Lease))
		a.log.Info("adopted the pinned data plane", "lease_left", ad.Lease.Round(time.Millisecond), "accepting", in.accept.Buckets.Count())
		return xdp, dp, in, nil
	case rr != nil && time.Until(rr.LeaseEnd) > 0:
		// Another program: the same tables rebuilt, the same lease.
		in = inheritFrom(rr, fcfg, rr.LeaseEnd)
		a.log.Warn("pinned tables not adopted; rebuilt from the restart record", "why", ad.Why, "accepting", in.accept.Buckets.Count())
		t := filter.NewTables(fcfg, a.self, in.accept.Buckets, in.peersDraining, minus(rr.Draining, in.accept.Buckets))
		if err := dp.Update(t, h.MAC()); err != nil {
			xdp.Close()
			return nil, nil, nil, fmt.Errorf("xdp tables: %w", err)
		}
		if err := xdp.RenewLease(time.Until(rr.LeaseEnd)); err != nil {
			xdp.Close()
			return nil, nil, nil, err
		}
		return xdp, dp, in, nil
	}
	if rr != nil || ad.Link {
		a.log.Warn("a restart's pinned data plane was not adopted (its window is over, or it is stale)", "why", ad.Why)
	}
	// Accept nothing until the cluster has converged.
	if err := dp.Update(filter.NewTables(fcfg, a.self, nil, nil, nil), h.MAC()); err != nil {
		xdp.Close()
		return nil, nil, nil, fmt.Errorf("xdp tables: %w", err)
	}
	return xdp, dp, nil, nil
}
