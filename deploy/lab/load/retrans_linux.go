package load

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// retransmits returns the segments c retransmitted over its life.
func retransmits(c net.Conn) (uint32, bool) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	cerr := raw.Control(func(fd uintptr) {
		info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	})
	if cerr != nil || err != nil {
		return 0, false
	}
	return info.Total_retrans, true
}
