//go:build !linux

package heartbeat

import "net"

func growBuffers(conn net.PacketConn) {
	if uc, ok := conn.(*net.UDPConn); ok {
		uc.SetReadBuffer(socketBuffer)
	}
}
