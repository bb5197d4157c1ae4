package heartbeat

import (
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestListenGrowsReceiveBuffer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SO_RCVBUFFORCE needs CAP_NET_ADMIN: run as root")
	}
	kr, err := NewKeyring([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := Listen("127.0.0.1:0", 1, kr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	rc, err := tr.socket().(*net.UDPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var got int
	var gerr error
	rc.Control(func(fd uintptr) { got, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF) })
	if gerr != nil {
		t.Fatal(gerr)
	}
	if got < socketBuffer {
		t.Errorf("receive buffer %d bytes, want at least %d", got, socketBuffer)
	}
}
