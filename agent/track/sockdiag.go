package track

// The sock_diag wire format (linux/inet_diag.h) the held-connection scan
// speaks: the request, the INET_DIAG_REQ_BYTECODE filter the kernel runs on
// every socket of the dump, and the reply. Pure byte layouts, so they can be
// tested anywhere; sockets_linux.go sends them.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// TCP states (include/net/tcp_states.h) as sock_diag reports them.
const (
	tcpEstablished = 1
	tcpSynSent     = 2
	tcpSynRecv     = 3
	tcpFinWait1    = 4
	tcpFinWait2    = 5
	tcpTimeWait    = 6
	tcpClose       = 7
	tcpCloseWait   = 8
	tcpLastAck     = 9
	tcpListen      = 10
	tcpClosing     = 11
)

// heldStates is the state mask of sockets that are connections this node
// must keep serving. SYN_RECV counts: a client whose handshake this node
// answered believes it is connected (and a server with TCP_DEFER_ACCEPT,
// as Apache uses for HTTP, keeps it a request socket until data arrives),
// so its next packet must still reach this node. Listeners are not
// connections; TIME_WAIT and CLOSE hold no conversation worth keeping a
// bucket for. FIN_WAIT2 also matches a closed socket the kernel keeps as a
// time-wait socket in its FIN_WAIT2 substate, still waiting for the
// client's FIN.
const heldStates = 1<<tcpEstablished | 1<<tcpSynSent | 1<<tcpSynRecv |
	1<<tcpFinWait1 | 1<<tcpFinWait2 | 1<<tcpCloseWait | 1<<tcpLastAck | 1<<tcpClosing

// Constants of linux/inet_diag.h.
const (
	inetDiagReqBytecode = 1 // INET_DIAG_REQ_BYTECODE, the request's filter attribute

	bcJmp   = 1 // INET_DIAG_BC_JMP: always take the "no" branch
	bcSCond = 7 // INET_DIAG_BC_S_COND: the local address is in a prefix

	sizeofBCOp     = 4  // struct inet_diag_bc_op {u8 code, yes; u16 no}
	sizeofHostcond = 8  // struct inet_diag_hostcond {u8 family, prefix_len; int port}, then the address
	sizeofReqV2    = 56 // struct inet_diag_req_v2
	sizeofDiagMsg  = 72 // struct inet_diag_msg

	afInet  = 2  // AF_INET
	afInet6 = 10 // AF_INET6
)

// diagRequest is struct inet_diag_req_v2 for a TCP dump: no extensions
// (idiag_ext 0: no INET_DIAG_INFO), sockets in the given states.
type diagRequest struct {
	family uint8
	states uint32
}

func (r *diagRequest) Len() int { return sizeofReqV2 }

func (r *diagRequest) Serialize() []byte {
	b := make([]byte, sizeofReqV2)
	b[0] = r.family
	b[1] = 6 // IPPROTO_TCP
	binary.NativeEndian.PutUint32(b[4:], r.states)
	return b
}

// maxBytecode bounds the filter: it travels in a netlink attribute
// (16-bit length), and its jumps are 16-bit.
const maxBytecode = 0xffff - 4

// vipBytecode returns the sock_diag filter that passes a socket exactly
// when its local address is one of vips: one INET_DIAG_BC_S_COND per VIP
// (any port, prefix /32 or /128), or-ed together. The kernel matches an
// AF_INET condition against an AF_INET6 socket's v4-mapped address
// (::ffff:a.b.c.d) too, so one filter serves the AF_INET and the AF_INET6
// dump, and a dual-stack server's IPv4 clients are seen.
//
// The kernel walks a filter along the "yes" offsets, and accepts a socket
// when a jump lands exactly on the end. Or-ing conditions therefore reads:
//
//	cond(vip1) yes: next op  no: the cond after the jump
//	jmp        no: the end (accept)
//	cond(vip2) ...
//	cond(vipN) yes: the end (accept)  no: 4 bytes past the end (reject)
func vipBytecode(vips []netip.Addr) ([]byte, error) {
	if len(vips) == 0 {
		return nil, errors.New("sock_diag filter: no VIPs")
	}
	var b []byte
	var jumps []int // offsets of the jmp ops, patched once the end is known
	for i, vip := range vips {
		if !vip.IsValid() {
			return nil, fmt.Errorf("sock_diag filter: invalid VIP %v", vip)
		}
		vip = vip.Unmap()
		family, addr := uint8(afInet6), vip.AsSlice()
		if vip.Is4() {
			family = afInet
		}
		size := sizeofBCOp + sizeofHostcond + len(addr)
		op := make([]byte, size)
		op[0], op[1] = bcSCond, byte(size)
		binary.NativeEndian.PutUint16(op[2:], uint16(size+sizeofBCOp))
		op[4], op[5] = family, byte(8*len(addr))
		binary.NativeEndian.PutUint32(op[8:], 0xffffffff) // port -1: any
		copy(op[12:], addr)
		b = append(b, op...)
		if i < len(vips)-1 {
			jumps = append(jumps, len(b))
			b = append(b, bcJmp, sizeofBCOp, 0, 0)
		}
		if len(b) > maxBytecode {
			return nil, fmt.Errorf("sock_diag filter: %d VIPs make a filter longer than %d bytes", len(vips), maxBytecode)
		}
	}
	for _, j := range jumps {
		binary.NativeEndian.PutUint16(b[j+2:], uint16(len(b)-j))
	}
	return b, nil
}

// diagSock is the part of struct inet_diag_msg the scan uses.
type diagSock struct {
	family        uint8
	state         uint8
	local, remote netip.Addr // v4-mapped addresses of AF_INET6 sockets unmapped
	lport, rport  uint16
}

// parseDiagMsg decodes one sock_diag reply.
func parseDiagMsg(b []byte) (diagSock, error) {
	if len(b) < sizeofDiagMsg {
		return diagSock{}, fmt.Errorf("sock_diag reply of %d bytes; want at least %d", len(b), sizeofDiagMsg)
	}
	s := diagSock{
		family: b[0], state: b[1],
		lport: binary.BigEndian.Uint16(b[4:]), rport: binary.BigEndian.Uint16(b[6:]),
	}
	switch s.family {
	case afInet:
		s.local = netip.AddrFrom4([4]byte(b[8:12]))
		s.remote = netip.AddrFrom4([4]byte(b[24:28]))
	case afInet6:
		s.local = netip.AddrFrom16([16]byte(b[8:24])).Unmap()
		s.remote = netip.AddrFrom16([16]byte(b[24:40])).Unmap()
	default:
		return diagSock{}, fmt.Errorf("sock_diag reply of family %d", s.family)
	}
	return s, nil
}
