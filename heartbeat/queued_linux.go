package heartbeat

import (
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// readQueued reads a datagram already waiting in conn into buf, without
// waiting for one: ok is false when none is (or conn cannot say).
func readQueued(conn net.PacketConn, buf []byte) (n int, from netip.AddrPort, ok bool) {
	sc, isSys := conn.(syscall.Conn)
	if !isSys {
		return 0, netip.AddrPort{}, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, netip.AddrPort{}, false
	}
	var sa unix.Sockaddr
	var rerr error
	// A function that returns true is called once: a single read that
	// does not wait (MSG_DONTWAIT), and no wake-up of the poller.
	if err := raw.Read(func(fd uintptr) bool {
		n, sa, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
		return true
	}); err != nil || rerr != nil {
		// Nothing waiting (EAGAIN), the deadline passed, or a failure the
		// next blocking Receive meets and handles.
		return 0, netip.AddrPort{}, false
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		from = netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		from = netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port))
	default:
		return 0, netip.AddrPort{}, false
	}
	return n, from, true
}
