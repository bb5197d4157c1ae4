package lab

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// freebind sets IP_FREEBIND: bind to an address the host does not have yet.
func freebind(network, address string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
	}); err != nil {
		return err
	}
	return serr
}
