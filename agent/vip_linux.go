package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
)

// host is the VIP setup on one machine, remembered so that teardown undoes
// exactly what setup did and nothing else.
type host struct {
	ifi       *net.Interface
	addedVIPs []netip.Addr
	sysctls   []sysctlChange
}

type sysctlChange struct {
	path, old string
}

// setupHost puts each VIP on lo as a /32 and stops the kernel from answering
// ARP for it with the interface's own MAC (arp_ignore=1: answer only for
// addresses on the receiving interface; arp_announce=2: never use the VIP as
// an ARP source). The agent answers for the VIP with the cluster MAC instead.
func setupHost(ifname string, vips []netip.Addr) (h *host, err error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("cluster interface %s: %w", ifname, err)
	}
	h = &host{ifi: ifi}
	defer func() {
		if err != nil {
			err = errors.Join(err, h.teardown())
			h = nil
		}
	}()
	for name, val := range map[string]string{"arp_ignore": "1", "arp_announce": "2"} {
		if err := h.setSysctl(filepath.Join("/proc/sys/net/ipv4/conf", ifname, name), val); err != nil {
			return h, err
		}
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return h, fmt.Errorf("find lo: %w", err)
	}
	for _, vip := range vips {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: vip.AsSlice(), Mask: net.CIDRMask(32, 32)}}
		switch err := netlink.AddrAdd(lo, addr); {
		case err == nil:
			h.addedVIPs = append(h.addedVIPs, vip)
		case errors.Is(err, os.ErrExist) || strings.Contains(err.Error(), "exists"):
			slog.Warn("vip already on lo; leaving it there on exit", "vip", vip)
		default:
			return h, fmt.Errorf("add vip %s to lo: %w", vip, err)
		}
	}
	return h, nil
}

func (h *host) setSysctl(path, val string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if err := os.WriteFile(path, []byte(val), 0o644); err != nil {
		return fmt.Errorf("set %s=%s: %w", path, val, err)
	}
	h.sysctls = append(h.sysctls, sysctlChange{path: path, old: strings.TrimSpace(string(old))})
	return nil
}

// teardown removes the VIPs it added and restores the sysctls it changed.
func (h *host) teardown() error {
	var errs []error
	if lo, err := netlink.LinkByName("lo"); err == nil {
		for _, vip := range h.addedVIPs {
			addr := &netlink.Addr{IPNet: &net.IPNet{IP: vip.AsSlice(), Mask: net.CIDRMask(32, 32)}}
			if err := netlink.AddrDel(lo, addr); err != nil {
				errs = append(errs, fmt.Errorf("remove vip %s from lo: %w", vip, err))
			}
		}
	} else {
		errs = append(errs, fmt.Errorf("find lo: %w", err))
	}
	h.addedVIPs = nil
	for i := len(h.sysctls) - 1; i >= 0; i-- {
		s := h.sysctls[i]
		if err := os.WriteFile(s.path, []byte(s.old), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore %s: %w", s.path, err))
		}
	}
	h.sysctls = nil
	return errors.Join(errs...)
}
