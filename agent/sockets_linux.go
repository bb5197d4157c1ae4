package agent

import (
	"fmt"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
)

// TCP states from the kernel's tcp_states.h that sock_diag reports.
const (
	tcpTimeWait = 6
	tcpClose    = 7
	tcpListen   = 10
)

// scanConns lists, through netlink sock_diag, the TCP connections this host
// holds on the VIPs. Listeners are not connections; TIME_WAIT and closed
// sockets hold no conversation worth keeping a bucket for.
func scanConns(vips []netip.Addr) ([]conn, error) {
	socks, err := netlink.SocketDiagTCP(syscall.AF_INET)
	if err != nil {
		return nil, fmt.Errorf("sock_diag: %w", err)
	}
	var out []conn
	for _, s := range socks {
		if s.State == tcpListen || s.State == tcpTimeWait || s.State == tcpClose {
			continue
		}
		local, ok1 := netip.AddrFromSlice(s.ID.Source.To4())
		remote, ok2 := netip.AddrFromSlice(s.ID.Destination.To4())
		if !ok1 || !ok2 || !isVIP(local, vips) {
			continue
		}
		out = append(out, conn{VIP: local, VIPPort: s.ID.SourcePort, Client: remote, ClientPort: s.ID.DestinationPort})
	}
	return out, nil
}
