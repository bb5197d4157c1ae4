package track

import (
	"bufio"
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// enterTestNetns moves the calling goroutine, locked to its thread for good
// (the thread ends with it), into a new network namespace with lo up and
// addrs (prefixes) on lo. Sockets it opens live there; sockets accepted
// from them too, whatever goroutine accepts.
func enterTestNetns(tb testing.TB, addrs ...string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: creates a network namespace")
	}
	runtime.LockOSThread() // never unlocked: the thread stays in the namespace
	remove, err := newNetns(addrs...)
	if remove != nil {
		tb.Cleanup(func() {
			if err := remove(); err != nil {
				tb.Error(err)
			}
		})
	}
	if err != nil {
		tb.Fatal(err)
	}
}

// newNetns moves the calling thread (locked) into a new named network
// namespace, brings lo up and puts addrs on it. remove deletes the name;
// the namespace goes once its last thread and socket have.
func newNetns(addrs ...string) (remove func() error, err error) {
	var r [3]byte
	rand.Read(r[:])
	name := "shoal-track-" + hex.EncodeToString(r[:])
	ns, err := netns.NewNamed(name)
	if err != nil {
		return nil, fmt.Errorf("new netns %s: %w", name, err)
	}
	remove = func() error {
		ns.Close()
		if err := netns.DeleteNamed(name); err != nil {
			return fmt.Errorf("delete netns %s: %w", name, err)
		}
		return nil
	}
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		return remove, err
	}
	for _, a := range addrs {
		p := netip.MustParsePrefix(a)
		ipn := &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
		// nodad: an IPv6 address must be usable at once, not tentative.
		if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: ipn, Flags: unix.IFA_F_NODAD}); err != nil {
			return remove, fmt.Errorf("add %s to lo: %w", a, err)
		}
		// The kernel adds an IPv6 address's local route a moment later.
		err := poll("a local route to "+a, func() bool {
			rs, err := netlink.RouteGet(ipn.IP)
			return err == nil && len(rs) > 0 && rs[0].Type == unix.RTN_LOCAL
		})
		if err != nil {
			return remove, err
		}
	}
	return remove, nil
}

// nsWorker runs functions on a goroutine that lives in a namespace of its
// own, for callers that cannot stay there (sub-benchmarks run on goroutines
// of their own).
type nsWorker struct{ do chan func() }

func startNSWorker(tb testing.TB, addrs ...string) *nsWorker {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: creates a network namespace")
	}
	w := &nsWorker{do: make(chan func())}
	errc := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		remove, err := newNetns(addrs...)
		if remove != nil {
			defer func() {
				if err := remove(); err != nil {
					tb.Error(err)
				}
			}()
		}
		errc <- err
		if err != nil {
			return
		}
		for f := range w.do {
			f()
		}
	}()
	if err := <-errc; err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { close(w.do) })
	return w
}

// run runs f in the worker's namespace and returns its error.
func (w *nsWorker) run(f func() error) error {
	errc := make(chan error, 1)
	w.do <- func() { errc <- f() }
	return <-errc
}

// serve accepts on ln until it closes, handing every connection to h (nil:
// keep it open until the test ends).
func serve(tb testing.TB, ln net.Listener, h func(net.Conn)) {
	var mu sync.Mutex
	var open []net.Conn
	tb.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range open {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if h != nil {
				go h(c)
				continue
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
		}
	}()
}

// dial connects from local (port 0) to the server address, from the calling
// goroutine (so in its namespace), and closes the connection at cleanup.
func dial(tb testing.TB, local, server string) net.Conn {
	tb.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", server)
	if err != nil {
		tb.Fatalf("dial %s from %s: %v", server, local, err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// connOf is the server's view of a client connection c.
func connOf(c net.Conn) Conn {
	l, r := c.LocalAddr().(*net.TCPAddr).AddrPort(), c.RemoteAddr().(*net.TCPAddr).AddrPort()
	return Conn{VIP: r.Addr().Unmap(), VIPPort: r.Port(), Client: l.Addr().Unmap(), ClientPort: l.Port()}
}

func sortConns(cs []Conn) {
	slices.SortFunc(cs, func(a, b Conn) int {
		return cmp.Or(a.VIP.Compare(b.VIP), cmp.Compare(a.VIPPort, b.VIPPort),
			a.Client.Compare(b.Client), cmp.Compare(a.ClientPort, b.ClientPort))
	})
}

// countSocks counts the sockets of a dump (both families) in the states.
func countSocks(tb testing.TB, states uint32, bc []byte) int {
	tb.Helper()
	n, err := sockCount(states, bc)
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

func sockCount(states uint32, bc []byte) (int, error) {
	n := 0
	for _, f := range []uint8{afInet, afInet6} {
		if err := sockDiag(f, states, bc, func(diagSock) { n++ }); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// poll polls cond every 10 ms until it holds, for at most 10 s.
func poll(what string, cond func() bool) error {
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out waiting for %s", what)
		}
	}
	return nil
}

func pollUntil(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	if err := poll(what, cond); err != nil {
		tb.Fatal(err)
	}
}

// TestScanConns: every connection on a VIP, whatever socket family the
// server listens with, and nothing else.
func TestScanConns(t *testing.T) {
	const (
		vip4, vip6, other = "198.18.99.100", "2001:db8::100", "198.18.99.50"
		client4, client6  = "198.18.99.1", "2001:db8::1"
	)
	enterTestNetns(t, vip4+"/32", other+"/32", client4+"/32", vip6+"/128", client6+"/128")
	vips := []netip.Addr{netip.MustParseAddr(vip4), netip.MustParseAddr(vip6)}

	// A dual-stack server ([::]:8080, AF_INET6: IPv4 clients on ::ffff:),
	// an IPv4-only server on the VIP, and one that defers accepting until
	// the client sends data (TCP_DEFER_ACCEPT, as Apache does for HTTP):
	// its connections stay request sockets in SYN_RECV meanwhile.
	dual, err := net.Listen("tcp", "[::]:8080")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, dual, nil)
	v4only, err := net.Listen("tcp4", vip4+":8081")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, v4only, func(c net.Conn) {
		if c.RemoteAddr().(*net.TCPAddr).Port == 9999 {
			c.Close() // the server closes first: its side ends in TIME_WAIT
			return
		}
		io.Copy(io.Discard, c)
		c.Close()
	})
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, 30) })
		return cmp.Or(err, serr)
	}}
	deferred, err := lc.Listen(t.Context(), "tcp4", vip4+":8082")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, deferred, nil)

	want := []Conn{
		connOf(dial(t, client4, vip4+":8080")),      // IPv4 client, AF_INET6 server socket
		connOf(dial(t, client4, vip4+":8080")),      // two of them
		connOf(dial(t, client6, "["+vip6+"]:8080")), // native IPv6 VIP
		connOf(dial(t, client4, vip4+":8081")),      // AF_INET server socket
		connOf(dial(t, client4, vip4+":8082")),      // SYN_RECV, deferred
	}
	dial(t, client4, other+":8080")        // not on a VIP
	dial(t, client6, "["+client6+"]:8080") // nor this
	bc, err := vipBytecode(vips)
	if err != nil {
		t.Fatal(err)
	}
	// A connection the server closed first: TIME_WAIT on the VIP.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(client4), Port: 9999}}
	c, err := d.Dial("tcp4", vip4+":8081")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, c)
	c.Close()
	pollUntil(t, "a TIME_WAIT socket on the VIP", func() bool { return countSocks(t, 1<<tcpTimeWait, bc) == 1 })
	// The cases are real: the deferred connection is a request socket, and
	// two listeners are on the VIP.
	if n := countSocks(t, 1<<tcpSynRecv, bc); n != 1 {
		t.Errorf("%d SYN_RECV sockets on the VIP, want 1", n)
	}
	if n := countSocks(t, 1<<tcpListen, bc); n != 2 {
		t.Errorf("%d listeners on the VIP, want 2", n)
	}

	got, err := Scan(vips)
	if err != nil {
		t.Fatal(err)
	}
	sortConns(got)
	sortConns(want)
	if d := gocmp.Diff(want, got, cmpopts.EquateComparable(netip.Addr{})); d != "" {
		t.Errorf("Scan (-want +got):\n%s", d)
	}
	if got, err := Scan(nil); err != nil || len(got) != 0 {
		t.Errorf("no VIPs: got %v, %v; want nothing", got, err)
	}
}

// TestScanConnsFiltersInKernel: sockets that are not on a VIP never leave
// the kernel, however many there are.
func TestScanConnsFiltersInKernel(t *testing.T) {
	const vip, client = "198.18.99.100", "198.18.99.1"
	enterTestNetns(t, vip+"/32", client+"/32")
	vips := []netip.Addr{netip.MustParseAddr(vip)}
	ln, err := net.Listen("tcp", "[::]:8080")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, ln, nil)
	held := connOf(dial(t, client, vip+":8080"))
	const unrelated = 500
	fillSockets(t, "established", unrelated)
	fillSockets(t, "timewait", unrelated)

	bc, err := vipBytecode(vips)
	if err != nil {
		t.Fatal(err)
	}
	if all := countSocks(t, ^uint32(0), nil); all < 2*unrelated {
		t.Fatalf("%d sockets in the namespace; the test made %d", all, 2*unrelated)
	}
	if n := countSocks(t, heldStates, bc); n != 1 {
		t.Errorf("the kernel passed %d sockets through the filter, want 1", n)
	}
	got, err := Scan(vips)
	if err != nil {
		t.Fatal(err)
	}
	if d := gocmp.Diff([]Conn{held}, got, cmpopts.EquateComparable(netip.Addr{})); d != "" {
		t.Errorf("Scan (-want +got):\n%s", d)
	}
}

var fillCalls atomic.Int32

// fillSockets makes n TCP sockets on 127.0.0.1 that have nothing to do
// with a VIP, in the calling goroutine's namespace: n/2 established
// loopback connections (both ends held until the test ends), or n
// connections closed by the client, left in TIME_WAIT. Every connection
// binds its own source address and port (127.<call>.0.1), so none reuses
// another's TIME_WAIT. (bench/sockfill makes 100,000 for the benchmark.)
func fillSockets(tb testing.TB, mode string, n int) {
	tb.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	conns, want := (n+1)/2, uint32(1<<tcpEstablished)
	if mode == "timewait" {
		conns, want = n, 1<<tcpTimeWait
		serve(tb, ln, func(c net.Conn) { io.Copy(io.Discard, c); c.Close() })
	} else {
		serve(tb, ln, nil)
	}
	block := fillCalls.Add(1)
	port := 20000
	dialMore := func(k int) {
		for range k {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, byte(block), 0, 1), Port: port}}
			port++
			c, err := d.Dial("tcp4", ln.Addr().String())
			if err != nil {
				tb.Fatalf("connection from port %d: %v", port-1, err)
			}
			if mode == "timewait" {
				c.Close()
			} else {
				tb.Cleanup(func() { c.Close() })
			}
		}
	}
	dialMore(conns)
	// A few client-closed connections can vanish instead of waiting in
	// TIME_WAIT (seen here: 2 in 500, once a few test namespaces had come
	// and gone): once the count stops growing, make up the shortfall.
	have, last, since := 0, -1, time.Now()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if have = countSocks(tb, want, nil); have >= n {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d %s sockets, want %d", have, mode, n)
		}
		if have != last {
			last, since = have, time.Now()
		} else if time.Since(since) > 300*time.Millisecond {
			short := n - have
			if mode != "timewait" {
				short = (short + 1) / 2 // two sockets a connection
			}
			dialMore(short)
			since = time.Now()
		}
	}
}

// sockfill runs bench/sockfill in w's namespace to make n unrelated
// sockets; established ones are held until the benchmark ends.
func sockfill(b *testing.B, w *nsWorker, mode string, n int) {
	bin := filepath.Join(b.TempDir(), "sockfill")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/shoalnet/shoal/bench/sockfill").CombinedOutput(); err != nil {
		b.Fatalf("build bench/sockfill: %v\n%s", err, out)
	}
	var cmd *exec.Cmd
	err := w.run(func() error { // started from the worker's thread: in its namespace
		cmd = exec.Command(bin, "-mode", mode, "-count", fmt.Sprint(n))
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		line, _ := bufio.NewReader(out).ReadString('\n')
		if !strings.HasPrefix(line, "ready") {
			return fmt.Errorf("sockfill -mode %s -count %d failed", mode, n)
		}
		return nil
	})
	if cmd != nil && cmd.Process != nil {
		b.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
	}
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkScanConns is the cost of one scan of a node's connections on its
// VIP (10 held, by a dual-stack server) beside unrelated sockets in the
// same namespace (100,000 in TIME_WAIT, or established) or in another one,
// for the kernel-filtered dump Scan uses, a dump filtered by state
// only, and vishvananda/netlink's SocketDiagTCP (every socket, with
// INET_DIAG_INFO), as the agent scanned before, for both families.
//
//	go test -run '^$' -bench ScanConns -benchtime 2s ./agent/
func BenchmarkScanConns(b *testing.B) {
	const vip, client = "198.18.99.100", "198.18.99.1"
	vips := []netip.Addr{netip.MustParseAddr(vip)}
	const heldConns = 10
	scans := []struct {
		name string
		scan func() (int, error)
	}{
		{"filtered", func() (int, error) {
			cs, err := Scan(vips)
			return len(cs), err
		}},
		{"states-only", func() (int, error) {
			n := 0
			for _, f := range []uint8{afInet, afInet6} {
				err := sockDiag(f, heldStates, nil, func(s diagSock) {
					if slices.Contains(vips, s.local) {
						n++
					}
				})
				if err != nil {
					return 0, err
				}
			}
			return n, nil
		}},
		{"netlink-SocketDiagTCP", func() (int, error) {
			n := 0
			for _, f := range []uint8{unix.AF_INET, unix.AF_INET6} {
				socks, err := netlink.SocketDiagTCP(f)
				if err != nil {
					return 0, err
				}
				for _, s := range socks {
					local, _ := netip.AddrFromSlice(s.ID.Source)
					if s.State != tcpListen && s.State != tcpTimeWait && s.State != tcpClose && slices.Contains(vips, local.Unmap()) {
						n++
					}
				}
			}
			return n, nil
		}},
	}
	for _, pop := range []struct {
		name      string
		mode      string
		n         int
		elsewhere bool // in another namespace than the scan's
	}{
		{"none", "", 0, false},
		{"timewait-100k", "timewait", 100000, false},
		{"established-100k", "established", 100000, false},
		{"timewait-100k-other-netns", "timewait", 100000, true},
	} {
		b.Run(pop.name, func(b *testing.B) {
			w := startNSWorker(b, vip+"/32", client+"/32")
			err := w.run(func() error {
				ln, err := net.Listen("tcp", "[::]:8080")
				if err != nil {
					return err
				}
				serve(b, ln, nil)
				for range heldConns {
					d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(client)}}
					c, err := d.Dial("tcp4", vip+":8080")
					if err != nil {
						return err
					}
					b.Cleanup(func() { c.Close() })
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			if pop.n > 0 {
				fw := w
				if pop.elsewhere {
					fw = startNSWorker(b)
				}
				sockfill(b, fw, pop.mode, pop.n)
			}
			for _, s := range scans {
				b.Run(s.name, func(b *testing.B) {
					var n int
					for b.Loop() {
						if err := w.run(func() (err error) { n, err = s.scan(); return err }); err != nil {
							b.Fatal(err)
						}
					}
					if n != heldConns {
						b.Fatalf("the scan found %d connections on the VIP, want %d", n, heldConns)
					}
				})
			}
		})
	}
}
