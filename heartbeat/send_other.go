//go:build !linux

package heartbeat

import (
	"net"
	"net/netip"
)

// batcher sends one write per peer here.
type batcher struct{}

func (*batcher) sendEvery(conn net.PacketConn, b []byte, to []netip.AddrPort, failed func(netip.AddrPort, error)) int {
	return sendEach(conn, b, to, failed)
}
