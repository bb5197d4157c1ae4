package lab

import (
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// freebind sets IP_FREEBIND (IPV6_FREEBIND on an IPv6 socket): bind to an
// address the host does not have yet.
func freebind(network, address string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		if strings.HasSuffix(network, "6") {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_FREEBIND, 1)
			return
		}
		serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
	}); err != nil {
		return err
	}
	return serr
}
