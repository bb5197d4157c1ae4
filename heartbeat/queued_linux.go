package heartbeat

import (
	"encoding/binary"
	"net"
	"net/netip"
	"syscall"
	"unsafe"
)

// Heartbeats are read with recvfrom(MSG_DONTWAIT) made as a raw system
// call: it never blocks (the poller waits, not the call), and a raw call
// does not tell the Go scheduler it enters a system call. A call that does
// wakes the runtime's monitor thread (sysmon) from its deep sleep whenever
// the agent was idle, and the monitor then polls every 20 µs for a while:
// at 32 nodes, with a heartbeat arriving every few milliseconds, that was
// a tenth of an idle agent's CPU (perf; docs/BENCHMARKS-LOG.md).

// recvNoWait reads one datagram waiting on fd into buf without waiting:
// errno EAGAIN when none is.
func recvNoWait(fd uintptr, buf []byte) (int, netip.AddrPort, syscall.Errno) {
	var rsa syscall.RawSockaddrAny
	alen := uint32(syscall.SizeofSockaddrAny)
	var p unsafe.Pointer
	if len(buf) > 0 {
		p = unsafe.Pointer(&buf[0])
	}
	n, _, errno := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(p), uintptr(len(buf)), syscall.MSG_DONTWAIT,
		uintptr(unsafe.Pointer(&rsa)), uintptr(unsafe.Pointer(&alen)))
	if errno != 0 {
		return 0, netip.AddrPort{}, errno
	}
	var from netip.AddrPort
	switch rsa.Addr.Family {
	case syscall.AF_INET:
		a := (*syscall.RawSockaddrInet4)(unsafe.Pointer(&rsa))
		from = netip.AddrPortFrom(netip.AddrFrom4(a.Addr), portOf(a.Port))
	case syscall.AF_INET6:
		a := (*syscall.RawSockaddrInet6)(unsafe.Pointer(&rsa))
		from = netip.AddrPortFrom(netip.AddrFrom16(a.Addr), portOf(a.Port))
	}
	return int(n), from, 0
}

// portOf is a port in network byte order, as the kernel writes it.
func portOf(p uint16) uint16 {
	var b [2]byte
	*(*uint16)(unsafe.Pointer(&b[0])) = p
	return binary.BigEndian.Uint16(b[:])
}

// rawConn is conn's raw connection, if it has one.
func rawConn(conn net.PacketConn) (syscall.RawConn, bool) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil, false
	}
	raw, err := sc.SyscallConn()
	return raw, err == nil
}

// readQueued reads a datagram already waiting in conn into buf, without
// waiting for one: ok is false when none is (or conn cannot say).
func readQueued(conn net.PacketConn, buf []byte) (n int, from netip.AddrPort, ok bool) {
	raw, isRaw := rawConn(conn)
	if !isRaw {
		return 0, netip.AddrPort{}, false
	}
	var errno syscall.Errno
	// Control, not Read: Read refuses once the receive deadline has
	// passed, and a late wake-up (a busy machine) is when the heartbeats
	// waiting must be taken before silences are judged.
	if err := raw.Control(func(fd uintptr) { n, from, errno = recvNoWait(fd, buf) }); err != nil || errno != 0 || !from.IsValid() {
		// Nothing waiting (EAGAIN), or a failure the next blocking
		// Receive meets and handles.
		return 0, netip.AddrPort{}, false
	}
	return n, from, true
}

// readWait reads the next datagram on conn into buf, waiting for one in
// the poller until the receive deadline: ReadFrom without its system-call
// accounting (see recvNoWait). handled is false when conn has no raw
// connection: use ReadFrom.
func readWait(conn net.PacketConn, buf []byte) (n int, from netip.AddrPort, handled bool, err error) {
	raw, isRaw := rawConn(conn)
	if !isRaw {
		return 0, netip.AddrPort{}, false, nil
	}
	var errno syscall.Errno
	err = raw.Read(func(fd uintptr) bool {
		n, from, errno = recvNoWait(fd, buf)
		return errno != syscall.EAGAIN
	})
	if err == nil && errno != 0 {
		err = &net.OpError{Op: "read", Net: conn.LocalAddr().Network(), Source: conn.LocalAddr(), Err: errno}
	}
	return n, from, true, err
}
