package heartbeat

import (
	"net"
	"net/netip"
	"syscall"
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
	var sa syscall.Sockaddr
	var rerr error
	// A single read that does not wait (MSG_DONTWAIT) and no wake-up of
	// the poller. Control, not Read: Read refuses once the receive
	// deadline has passed, and a late wake-up (a busy machine) is when the
	// heartbeats waiting must be taken before silences are judged.
	if err := raw.Control(func(fd uintptr) {
		// syscall's, not x/sys/unix's Recvfrom: the latter asks the
		// socket's protocol (a getsockopt) for every address it returns,
		// one system call more per heartbeat.
		n, sa, rerr = syscall.Recvfrom(int(fd), buf, syscall.MSG_DONTWAIT)
	}); err != nil || rerr != nil {
		// Nothing waiting (EAGAIN), or a failure the next blocking
		// Receive meets and handles.
		return 0, netip.AddrPort{}, false
	}
	switch a := sa.(type) {
	case *syscall.SockaddrInet4:
		from = netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *syscall.SockaddrInet6:
		from = netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port))
	default:
		return 0, netip.AddrPort{}, false
	}
	return n, from, true
}
