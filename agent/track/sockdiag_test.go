package track

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"testing"
)

// auditBC mirrors the kernel's inet_diag_bc_audit (net/ipv4/inet_diag.c)
// for the ops vipBytecode emits: it walks the "yes" offsets, and every
// "no" offset must land on an op of that walk, on the end, or 4 bytes past
// it (reject).
func auditBC(bc []byte) error {
	validCC := func(cc int) bool { // an op boundary cc bytes before the end
		for off, l := 0, len(bc); l >= 0; {
			if cc > l {
				return false
			}
			if cc == l {
				return true
			}
			yes := int(bc[off+1])
			if yes < 4 || yes&3 != 0 {
				return false
			}
			l -= yes
			off += yes
		}
		return false
	}
	for off, l := 0, len(bc); l > 0; {
		if l < sizeofBCOp {
			return errors.New("truncated op")
		}
		code, yes, no := bc[off], int(bc[off+1]), int(binary.NativeEndian.Uint16(bc[off+2:]))
		min := sizeofBCOp
		switch code {
		case bcSCond:
			min += sizeofHostcond
			if l < min {
				return errors.New("truncated hostcond")
			}
			family, plen := bc[off+4], int(bc[off+5])
			alen := map[byte]int{0: 0, afInet: 4, afInet6: 16}[family]
			if family != 0 && alen == 0 {
				return fmt.Errorf("bad family %d", family)
			}
			min += alen
			if l < min || plen > 8*alen {
				return errors.New("bad hostcond")
			}
		case bcJmp:
		default:
			return fmt.Errorf("op %d", code)
		}
		if no < min || no > l+4 || no&3 != 0 {
			return fmt.Errorf("op at %d: no %d out of range", off, no)
		}
		if no < l && !validCC(l-no) {
			return fmt.Errorf("op at %d: no %d lands inside an op", off, no)
		}
		if yes < min || yes > l+4 || yes&3 != 0 {
			return fmt.Errorf("op at %d: yes %d out of range", off, yes)
		}
		off += yes
		l -= yes
	}
	return nil
}

// runBC mirrors the kernel's inet_diag_bc_run for a socket of family with
// local address local (4 or 16 bytes): true when the filter passes it.
func runBC(bc []byte, family uint8, local []byte) bool {
	match := func(a, b []byte, bits int) bool {
		full, rest := bits/8, bits%8
		if !bytes.Equal(a[:full], b[:full]) {
			return false
		}
		mask := byte(0xff << (8 - rest))
		return rest == 0 || a[full]&mask == b[full]&mask
	}
	v4mapped := []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff}
	off, l := 0, len(bc)
	for l > 0 {
		op := bc[off:]
		yes := true
		switch op[0] {
		case bcJmp:
			yes = false
		case bcSCond:
			cfamily, plen, addr := op[4], int(op[5]), op[12:]
			switch {
			case cfamily != 0 && cfamily != family:
				yes = family == afInet6 && cfamily == afInet &&
					bytes.Equal(local[:12], v4mapped) && match(local[12:], addr, plen)
			case plen == 0:
			default:
				yes = match(local, addr, plen)
			}
		}
		n := int(op[1])
		if !yes {
			n = int(binary.NativeEndian.Uint16(op[2:]))
		}
		off += n
		l -= n
	}
	return l == 0
}

func TestVIPBytecode(t *testing.T) {
	v4a, v4b := netip.MustParseAddr("198.18.7.100"), netip.MustParseAddr("198.18.7.101")
	v6 := netip.MustParseAddr("2001:db8::100")
	type sock struct {
		family uint8
		local  string
	}
	tests := []struct {
		name string
		vips []netip.Addr
		pass []sock
		drop []sock
	}{
		{
			name: "one IPv4 VIP",
			vips: []netip.Addr{v4a},
			pass: []sock{{afInet, "198.18.7.100"}, {afInet6, "::ffff:198.18.7.100"}},
			drop: []sock{{afInet, "198.18.7.101"}, {afInet, "198.18.7.1"}, {afInet6, "::ffff:198.18.7.101"},
				{afInet6, "::c612:764"}, {afInet6, "2001:db8::100"}},
		},
		{
			name: "three VIPs, both families",
			vips: []netip.Addr{v4a, v6, v4b},
			pass: []sock{{afInet, "198.18.7.100"}, {afInet, "198.18.7.101"}, {afInet6, "::ffff:198.18.7.101"},
				{afInet6, "::ffff:198.18.7.100"}, {afInet6, "2001:db8::100"}},
			drop: []sock{{afInet, "198.18.7.102"}, {afInet6, "2001:db8::101"}, {afInet6, "::ffff:198.18.7.102"},
				{afInet, "127.0.0.1"}, {afInet6, "::1"}},
		},
		{
			name: "a v4-mapped VIP is its IPv4 address",
			vips: []netip.Addr{netip.MustParseAddr("::ffff:198.18.7.100")},
			pass: []sock{{afInet, "198.18.7.100"}, {afInet6, "::ffff:198.18.7.100"}},
			drop: []sock{{afInet, "198.18.7.101"}},
		},
		{
			name: "IPv6 VIP only",
			vips: []netip.Addr{v6},
			pass: []sock{{afInet6, "2001:db8::100"}},
			drop: []sock{{afInet, "198.18.7.100"}, {afInet6, "2001:db8::1:100"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bc, err := vipBytecode(tt.vips)
			if err != nil {
				t.Fatal(err)
			}
			if err := auditBC(bc); err != nil {
				t.Fatalf("the kernel would refuse the filter: %v", err)
			}
			for _, want := range []bool{true, false} {
				socks := tt.pass
				if !want {
					socks = tt.drop
				}
				for _, s := range socks {
					a := netip.MustParseAddr(s.local)
					local := a.AsSlice()
					if s.family == afInet6 {
						b := a.As16()
						local = b[:]
					}
					if got := runBC(bc, s.family, local); got != want {
						t.Errorf("family %d, local %s: passes %v, want %v", s.family, s.local, got, want)
					}
				}
			}
		})
	}
}

func TestVIPBytecodeLimits(t *testing.T) {
	if _, err := vipBytecode(nil); err == nil {
		t.Error("no VIPs: want an error")
	}
	if _, err := vipBytecode([]netip.Addr{{}}); err == nil {
		t.Error("invalid VIP: want an error")
	}
	many := make([]netip.Addr, 3000)
	for i := range many {
		many[i] = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(i >> 8), 15: byte(i)})
	}
	if _, err := vipBytecode(many); err == nil {
		t.Error("3000 IPv6 VIPs: want an error (the filter's jumps are 16-bit)")
	}
	bc, err := vipBytecode(many[:256])
	if err != nil {
		t.Fatal(err)
	}
	if err := auditBC(bc); err != nil {
		t.Fatalf("256 VIPs: the kernel would refuse the filter: %v", err)
	}
	if !runBC(bc, afInet6, many[255].AsSlice()) || runBC(bc, afInet6, netip.MustParseAddr("2001:db8::1:0").AsSlice()) {
		t.Error("256 VIPs: the last VIP must pass and another address must not")
	}
}

func TestParseDiagMsg(t *testing.T) {
	msg := func(family, state byte, lport, rport uint16, local, remote netip.Addr) []byte {
		b := make([]byte, sizeofDiagMsg)
		b[0], b[1] = family, state
		binary.BigEndian.PutUint16(b[4:], lport)
		binary.BigEndian.PutUint16(b[6:], rport)
		copy(b[8:], local.AsSlice())
		copy(b[24:], remote.AsSlice())
		return b
	}
	vip, client := netip.MustParseAddr("198.18.7.100"), netip.MustParseAddr("198.18.7.1")
	tests := []struct {
		name string
		in   []byte
		want diagSock
		err  bool
	}{
		{"AF_INET", msg(afInet, tcpEstablished, 80, 40000, vip, client),
			diagSock{family: afInet, state: tcpEstablished, local: vip, remote: client, lport: 80, rport: 40000}, false},
		{"AF_INET6 v4-mapped is unmapped", msg(afInet6, tcpSynRecv, 80, 40001,
			netip.AddrFrom16(vip.As16()), netip.AddrFrom16(client.As16())),
			diagSock{family: afInet6, state: tcpSynRecv, local: vip, remote: client, lport: 80, rport: 40001}, false},
		{"AF_INET6 native", msg(afInet6, tcpEstablished, 443, 5, netip.MustParseAddr("2001:db8::100"), netip.MustParseAddr("2001:db8::1")),
			diagSock{family: afInet6, state: tcpEstablished, local: netip.MustParseAddr("2001:db8::100"),
				remote: netip.MustParseAddr("2001:db8::1"), lport: 443, rport: 5}, false},
		{"short", msg(afInet, 1, 1, 1, vip, client)[:sizeofDiagMsg-1], diagSock{}, true},
		{"unknown family", msg(1, 1, 1, 1, vip, client), diagSock{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseDiagMsg(tt.in)
			if (err != nil) != tt.err {
				t.Fatalf("error %v, want error %v", err, tt.err)
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestDiagRequest(t *testing.T) {
	b := (&diagRequest{family: afInet6, states: heldStates}).Serialize()
	if len(b) != sizeofReqV2 || b[0] != afInet6 || b[1] != 6 || b[2] != 0 {
		t.Fatalf("request %x: want family 10, protocol 6, no extensions", b)
	}
	st := binary.NativeEndian.Uint32(b[4:])
	for _, s := range []int{tcpTimeWait, tcpClose, tcpListen} {
		if st&(1<<s) != 0 {
			t.Errorf("state %d in the mask %#x", s, st)
		}
	}
	for _, s := range []int{tcpEstablished, tcpSynRecv, tcpFinWait2, tcpCloseWait} {
		if st&(1<<s) == 0 {
			t.Errorf("state %d not in the mask %#x", s, st)
		}
	}
}
