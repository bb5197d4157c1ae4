package track

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Scan lists the TCP connections this host holds on the VIPs, in the
// network namespace of the calling thread (the agent runs in its node's):
// AF_INET sockets and AF_INET6 sockets alike, so that a dual-stack server's
// IPv4 clients (held on ::ffff:a.b.c.d) count, reported with their IPv4
// addresses. The kernel does the filtering (heldStates, and vipBytecode on
// the local address), so the cost of a scan does not grow with sockets
// that are not on a VIP, beyond the kernel's walk of its socket table.
func Scan(vips []netip.Addr) ([]Conn, error) {
	if len(vips) == 0 {
		return nil, nil
	}
	bc, err := vipBytecode(vips)
	if err != nil {
		return nil, err
	}
	var out []Conn
	for _, family := range []uint8{afInet, afInet6} {
		err := sockDiag(family, heldStates, bc, func(s diagSock) {
			// The kernel filtered already; a socket that still is not on a
			// VIP would be a filter bug, and is no connection of ours.
			if slices.Contains(vips, s.local) {
				out = append(out, Conn{VIP: s.local, VIPPort: s.lport, Client: s.remote, ClientPort: s.rport})
			}
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// dumpAttempts bounds the retries of a dump the kernel reports as
// interrupted (the socket table changed under it): a partial list could
// miss a held connection and give its bucket away.
const dumpAttempts = 3

// sockDiag dumps the TCP sockets of one family in the given states that
// pass the filter bc (nil: every socket), calling fn for each.
func sockDiag(family uint8, states uint32, bc []byte, fn func(diagSock)) error {
	var err error
	for range dumpAttempts {
		var socks []diagSock
		socks, err = sockDiagOnce(family, states, bc)
		if err == nil {
			for _, s := range socks {
				fn(s)
			}
			return nil
		}
		if !errors.Is(err, nl.ErrDumpInterrupted) {
			break
		}
	}
	return fmt.Errorf("sock_diag dump (family %d): %w", family, err)
}

func sockDiagOnce(family uint8, states uint32, bc []byte) ([]diagSock, error) {
	req := nl.NewNetlinkRequest(nl.SOCK_DIAG_BY_FAMILY, unix.NLM_F_DUMP)
	req.AddData(&diagRequest{family: family, states: states})
	if bc != nil {
		req.AddData(nl.NewRtAttr(inetDiagReqBytecode, bc))
	}
	var socks []diagSock
	var perr error
	err := req.ExecuteIter(unix.NETLINK_INET_DIAG, nl.SOCK_DIAG_BY_FAMILY, func(msg []byte) bool {
		s, err := parseDiagMsg(msg)
		if err != nil {
			perr = err
			return false
		}
		socks = append(socks, s)
		return true
	})
	if err == nil {
		err = perr
	}
	return socks, err
}
