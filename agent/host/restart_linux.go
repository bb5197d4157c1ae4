package host

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// bootID names the running kernel.
func BootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// TakeRestart returns the restart a previous agent recorded, if it is one
// of this boot, and forgets it: the pins are adopted (or removed) once, and
// a crash after this start is repaired as any crash.
func (h *Host) TakeRestart() *RestartRecord {
	rr := h.rec.Restart
	if rr == nil {
		return nil
	}
	if err := h.rec.setRestart(nil); err != nil {
		h.log.Warn("forget the restart record", "err", err)
	}
	if rr.BootID != BootID() || rr.Pinned == nil {
		h.log.Warn("restart record of another boot (or without pins): starting afresh", "record", rr.String())
		return nil
	}
	return rr
}

// Leave is teardown for a restart: the host's goroutine stops and the
// announcer closes, but the cluster MACs and the MACs of the IPv6
// VIPs' solicited-node groups stay on the interface's multicast list
// (recorded first), so solicitations still reach the node in between;
// the VIPs on lo and the sysctls stay as they are, recorded for the next
// agent.
func (h *Host) Leave() error {
	var errs []error
	if err := h.Stop(); err != nil { // nothing changes the memberships from here on
		errs = append(errs, err)
	}
	macs := h.ann.Memberships()
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
func (h *Host) dropRestartMACs() error {
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

// SetRestart records what an agent stopping for a restart leaves the next
// one (nil forgets it).
func (h *Host) SetRestart(rr *RestartRecord) error { return h.rec.setRestart(rr) }
