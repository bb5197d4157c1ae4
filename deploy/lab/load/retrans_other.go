//go:build !linux

package load

import "net"

// retransmits: only Linux says (TCP_INFO).
func retransmits(net.Conn) (uint32, bool) { return 0, false }
