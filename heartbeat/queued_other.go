//go:build !linux

package heartbeat

import (
	"net"
	"net/netip"
)

// readQueued: elsewhere every heartbeat is read by a blocking Receive.
func readQueued(net.PacketConn, []byte) (int, netip.AddrPort, bool) {
	return 0, netip.AddrPort{}, false
}

// readWait: elsewhere Receive uses ReadFrom.
func readWait(net.PacketConn, []byte) (int, netip.AddrPort, bool, error) {
	return 0, netip.AddrPort{}, false, nil
}
