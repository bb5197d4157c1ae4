package heartbeat

import (
	"net"

	"golang.org/x/sys/unix"
)

// growBuffers gives the heartbeat socket room for a burst: a node that is
// slow for a moment (a long GC pause, a busy core) must find the heartbeats
// that arrived meanwhile in its queue, not dropped by a full 208 KiB default
// buffer. SO_RCVBUFFORCE passes net.core.rmem_max with CAP_NET_ADMIN, which
// the agent has; without it the kernel's maximum is used.
func growBuffers(conn net.PacketConn) {
	uc, ok := conn.(*net.UDPConn)
	if !ok {
		return
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return
	}
	raw.Control(func(fd uintptr) {
		if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, socketBuffer) != nil {
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, socketBuffer)
		}
	})
}
