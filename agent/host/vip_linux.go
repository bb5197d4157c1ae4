package host

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/rules"
)

// Config is what Setup needs.
type Config struct {
	Interface string       // the cluster interface
	DataDir   string       // where the host record lives
	VIPs      []netip.Addr // the cluster's VIPs, from the replicated rules
	MACMode   rules.MACMode
	Log       *slog.Logger
	// Announcer opens the announcer on the cluster interface (its index
	// changes when the interface is recreated).
	Announcer func(ifindex int, mac func() net.HardwareAddr) (Announcer, error)
}

// xdpLink is what the host needs of the data plane: keeping the program
// attached to the cluster interface.
type xdpLink interface {
	Attach(ifname string) error
	Detach() error
	Mode() filter.AttachMode
}

// Announcer claims the VIPs on the network (announce.L2: ARP, NDP, IGMP
// with the cluster MAC). The host calls it from its goroutine, while the
// VIPs it follows are on lo.
type Announcer interface {
	// Follow makes it claim vips, in the cluster's MAC mode, while this
	// node is eligible.
	Follow(vips []netip.Addr, mode rules.MACMode, eligible bool) error
	// Announce announces vips at once (nil: every VIP).
	Announce(vips []netip.Addr)
	// Relink moves it to a recreated cluster interface.
	Relink(ifindex int)
	// Health is nil while it answers, or says what is wrong.
	Health() error
	// Counters are its counters by protocol, then by what happened.
	Counters() map[string]map[string]uint64
	// Memberships are the multicast MACs it holds on the interface, which
	// a restart keeps there while no agent holds them.
	Memberships() []string
	Close() error
}

// Host is the node's side of the cluster interface: the VIPs on lo, the
// sysctls, the announcer and the XDP attachment. Everything it changes is
// written to its record first, so that teardown, in this process or after
// a crash in the next one, undoes exactly what the agent did and nothing
// else.
//
// After Start, one goroutine (run) owns the fields above the line; the
// others are published for any reader.
type Host struct {
	ifname string
	log    *slog.Logger
	rec    *hostRecord
	xdp    xdpLink
	ann    Announcer
	listen func(ifindex int, mac func() net.HardwareAddr) (Announcer, error)

	ifindex   int              // of the interface the sysctls, announcer and XDP are on
	sysctlsOK bool             // set on ifindex
	xdpIndex  int              // the ifindex XDP is attached to, 0 if none
	vips      []netip.Addr     // the cluster's VIPs
	mode      rules.MACMode    // the cluster's MAC mode
	eligible  bool             // this node's eligibility, as last told
	followed  bool             // the announcer follows vips
	annClosed bool             // the announcer is closed (teardown)
	foreign   []netip.Addr     // VIPs found on lo that are not the agent's
	lastErr   map[string]error // last logged problem by kind, to log changes once

	mac    atomic.Pointer[net.HardwareAddr] // the interface's MAC now
	pushed atomic.Pointer[net.HardwareAddr] // the MAC the data plane last got
	status atomic.Pointer[hostStatus]
	checks atomic.Uint64 // syncs run (tests: none at rest)

	vipsCh     chan vipSet // SetVIPs to run, latest wins
	eligibleCh chan bool   // SetEligible to run, latest wins
	announceCh chan struct{}
	cancel     func()
	done       chan struct{} // closed when run returns
}

// vipSet is the VIPs the host claims and the MAC mode they resolve in;
// both come from the replicated rules.
type vipSet struct {
	vips []netip.Addr
	mode rules.MACMode
}

// hostStatus is the host's health as run last found it.
type hostStatus struct {
	ok     bool
	reason string
}

// Setup makes the host ready for the cluster: it adopts or repairs what
// a crashed predecessor left (from the record in the data directory), sets
// the sysctls, puts each VIP on lo and opens the ARP responder. XDP is
// attached by AttachXDP; link events are handled once start runs.
func Setup(cfg Config) (h *Host, err error) {
	rec, err := loadHostRecord(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	log := cmp.Or(cfg.Log, slog.Default())
	h = &Host{
		ifname: cfg.Interface, log: log, rec: rec, listen: cfg.Announcer,
		lastErr: map[string]error{}, vipsCh: make(chan vipSet, 1), eligibleCh: make(chan bool, 1), announceCh: make(chan struct{}, 1),
		cancel: func() {}, done: make(chan struct{}),
	}
	close(h.done) // until start
	h.status.Store(&hostStatus{reason: "xdp not attached"})
	if !rec.empty() {
		log.Warn("adopting the host state a previous agent left", "record", rec.path, "vips", rec.VIPs, "sysctls", len(rec.Sysctls))
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, h.Teardown())
			h = nil
		}
	}()
	link, err := netlink.LinkByName(cfg.Interface)
	if err != nil {
		return h, fmt.Errorf("cluster interface %s: %w", cfg.Interface, err)
	}
	h.ifindex = link.Attrs().Index
	mac := slices.Clone(link.Attrs().HardwareAddr)
	h.mac.Store(&mac)
	if err := h.setSysctls(); err != nil {
		return h, err
	}
	if h.ann, err = h.listen(h.ifindex, h.MAC); err != nil {
		return h, err
	}
	if err := h.applyVIPs(vipSet{cfg.VIPs, cfg.MACMode}); err != nil {
		return h, err
	}
	if err := h.dropRestartMACs(); err != nil {
		log.Warn("cluster macs kept for a restart", "err", err)
	}
	return h, nil
}

// sysctl is one setting on the cluster interface. Restored ones go back to
// their recorded value on exit; drop_unicast_in_l2_multicast stays set, for
// IPv4 and IPv6, so a node whose agent died (and with it the XDP program
// that rewrites the cluster MAC) answers nothing sent to the cluster MAC.
// IPv6 needs nothing like arp_ignore: the kernel answers a Neighbor
// Solicitation only for an address on the interface it arrived on, and the
// VIPs are on lo (docs/AGENT.md, "IPv6 VIPs on the host", checked in the lab).
var sysctls = []struct {
	name, value string
	restore     bool
	ipv6        bool // under /proc/sys/net/ipv6; skipped when IPv6 is off
}{
	{"arp_ignore", "1", true, false},
	{"arp_announce", "2", true, false},
	{"drop_unicast_in_l2_multicast", "1", false, false},
	{"drop_unicast_in_l2_multicast", "1", false, true},
}

func sysctlPath(ifname, name string) string {
	return filepath.Join("/proc/sys/net/ipv4/conf", ifname, name)
}

func sysctl6Path(ifname, name string) string {
	return filepath.Join("/proc/sys/net/ipv6/conf", ifname, name)
}

// setSysctls sets every sysctl on the cluster interface, recording each
// restored one's value before the agent's first change of it.
func (h *Host) setSysctls() error {
	for _, s := range sysctls {
		path := sysctlPath(h.ifname, s.name)
		if s.ipv6 {
			path = sysctl6Path(h.ifname, s.name)
		}
		old, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) && s.ipv6 {
			if _, err := os.Stat("/proc/sys/net/ipv6"); errors.Is(err, os.ErrNotExist) {
				continue // IPv6 is off in this kernel: no IPv6 to answer
			}
		}
		if errors.Is(err, os.ErrNotExist) && s.name == "drop_unicast_in_l2_multicast" {
			return fmt.Errorf("read %s: %w (the fail-safe needs Linux 4.6 or later)", path, err)
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
		if s.restore {
			if err := h.rec.addSysctl(path, strings.TrimSpace(string(old))); err != nil {
				return err
			}
		}
		if err := os.WriteFile(path, []byte(s.value), 0o644); err != nil {
			return fmt.Errorf("set %s=%s: %w", path, s.value, err)
		}
	}
	h.sysctlsOK = true
	return nil
}

// applyVIPs makes the VIPs on lo, and those the ARP responder answers for,
// the cluster's: it adds the missing ones (recorded first), adopts those
// the record says a previous agent added, removes the agent's that are no
// longer cluster VIPs, and leaves alone any VIP someone else put on lo. It
// joins the igmp mode's groups, and a changed MAC mode re-announces every
// VIP at its new MAC. Calling it again with the same set changes nothing.
func (h *Host) applyVIPs(set vipSet) error {
	vips := slices.Clone(set.vips)
	slices.SortFunc(vips, netip.Addr.Compare)
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	addrs, err := netlink.AddrList(lo, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("list addresses of lo: %w", err)
	}
	onLo := map[netip.Addr]bool{}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ones, bits := a.Mask.Size(); ones == ip.BitLen() && bits == ip.BitLen() {
			onLo[ip] = true
		}
	}
	var errs []error
	var added []netip.Addr
	for _, vip := range vips {
		switch {
		case onLo[vip] && h.rec.hasVIP(vip):
			// Ours: added by this agent or adopted from a crashed one.
		case onLo[vip]:
			if !slices.Contains(h.foreign, vip) {
				h.foreign = append(h.foreign, vip)
				h.log.Warn("vip already on lo, not put there by shoal; leaving it there on exit", "vip", vip)
			}
		default:
			if err := h.rec.addVIP(vip); err != nil {
				return err
			}
			if err := netlink.AddrAdd(lo, vipAddr(vip)); err != nil && !errors.Is(err, unix.EEXIST) {
				errs = append(errs, fmt.Errorf("add vip %s to lo: %w", vip, err))
				continue
			}
			added = append(added, vip)
		}
	}
	// ARP and NDP answer for a VIP only while it is on lo: from after the
	// additions above until before the removals below.
	h.foreign = slices.DeleteFunc(h.foreign, func(v netip.Addr) bool { return !slices.Contains(vips, v) })
	if len(added) > 0 && h.vips != nil {
		h.log.Info("vips added to lo", "vips", added)
	}
	h.vips, h.mode = vips, set.mode
	if err := h.ann.Follow(vips, set.mode, h.eligible); err != nil {
		errs = append(errs, err)
	}
	if h.followed && len(added) > 0 {
		h.ann.Announce(added)
	}
	h.followed = true
	for _, vip := range slices.Clone(h.rec.VIPs) {
		if slices.Contains(vips, vip) {
			continue
		}
		if err := removeVIP(lo, vip); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := h.rec.dropVIP(vip); err != nil {
			return err
		}
		h.log.Info("vip removed from lo: no longer a cluster vip", "vip", vip)
	}
	return errors.Join(errs...)
}

// vipAddr is vip as lo holds it: a host address (/32, /128). An IPv6 VIP
// is added without duplicate address detection (lo does none anyway): it is
// the cluster's address, not one to defend, and usable at once.
func vipAddr(vip netip.Addr) *netlink.Addr {
	a := &netlink.Addr{IPNet: &net.IPNet{IP: vip.AsSlice(), Mask: net.CIDRMask(vip.BitLen(), vip.BitLen())}}
	if vip.Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	return a
}

// removeVIP takes vip off lo; one already gone is fine.
func removeVIP(lo netlink.Link, vip netip.Addr) error {
	err := netlink.AddrDel(lo, vipAddr(vip))
	if err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove vip %s from lo: %w", vip, err)
	}
	return nil
}

// MAC returns the cluster interface's current MAC: the data plane rewrites
// accepted frames to it and ARP replies come from it.
func (h *Host) MAC() net.HardwareAddr { return *h.mac.Load() }

// Teardown stops the host's goroutine, closes the announcer (leaving the
// cluster MACs and the groups), removes the VIPs the agent put on lo and restores the
// sysctls it changed; with nothing left to undo, the record goes too.
// drop_unicast_in_l2_multicast stays set (see sysctls).
func (h *Host) Teardown() error {
	errs := []error{h.closeSockets()}
	if lo, err := netlink.LinkByName("lo"); err == nil {
		for _, vip := range slices.Clone(h.rec.VIPs) {
			if err := removeVIP(lo, vip); err != nil {
				errs = append(errs, err)
				continue
			}
			if err := h.rec.dropVIP(vip); err != nil {
				errs = append(errs, err)
			}
		}
	} else {
		errs = append(errs, fmt.Errorf("find lo: %w", err))
	}
	for i := len(h.rec.Sysctls) - 1; i >= 0; i-- {
		s := h.rec.Sysctls[i]
		err := os.WriteFile(s.Path, []byte(s.Value), 0o644)
		if err != nil && !errors.Is(err, os.ErrNotExist) { // a vanished interface took its sysctls along
			errs = append(errs, fmt.Errorf("restore %s: %w", s.Path, err))
			continue
		}
		if err := h.rec.dropSysctl(s.Path); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// closeSockets stops the host's goroutine and closes the announcer
// (leaving the cluster MACs and the groups).
func (h *Host) closeSockets() error {
	var errs []error
	if err := h.Stop(); err != nil {
		errs = append(errs, err)
	}
	if h.ann != nil && !h.annClosed {
		h.annClosed = true
		if err := h.ann.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
