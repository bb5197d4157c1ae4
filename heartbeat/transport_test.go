package heartbeat

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// toySet is a bucket set over 16 buckets, for tests that need no filter:
// bucket b belongs to the view's member number b mod len(members).
type toySet []bool

func toyOwned(me uint32) func(View) toySet {
	return func(v View) toySet {
		s := make(toySet, 16)
		for b := range s {
			if len(v.Eligible) > 0 && v.Eligible[b%len(v.Eligible)] == me {
				s[b] = true
			}
		}
		return s
	}
}

func toyIntersect(a, b toySet) toySet {
	out := make(toySet, 16)
	for i := range out {
		out[i] = i < len(a) && i < len(b) && a[i] && b[i]
	}
	return out
}

func toyCount(s toySet) int {
	n := 0
	for _, x := range s {
		if x {
			n++
		}
	}
	return n
}

func waitFor(t *testing.T, what string, deadline time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(deadline)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for %s", deadline, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRunnersOnLoopback runs two nodes over real UDP sockets on loopback:
// they converge and split the buckets, then one stops and the other takes
// every bucket.
func TestRunnersOnLoopback(t *testing.T) {
	const cluster = 7
	var trs [2]*Transport
	var runners [2]*Runner[toySet]
	var cancels [2]context.CancelFunc
	var done [2]chan error
	for i := range trs {
		tr, err := Listen("127.0.0.1:0", cluster, simRing)
		if err != nil {
			t.Fatal(err)
		}
		trs[i] = tr
	}
	peers := map[uint32]netip.AddrPort{}
	for i, tr := range trs {
		peers[uint32(i+1)] = tr.LocalAddr().(*net.UDPAddr).AddrPort()
	}
	for i := range trs {
		id := uint32(i + 1)
		m, err := NewMachine(Config{ClusterID: cluster, Self: id, Incarnation: 1, Period: 20 * time.Millisecond, Tolerance: 10}, time.Now(), toyOwned(id), toyIntersect)
		if err != nil {
			t.Fatal(err)
		}
		r := NewRunner(m, trs[i], nil)
		r.SetPeers(peers)
		r.SetLocal(Local{Admin: Started, Healthy: true, RulesIndex: 1})
		ctx, cancel := context.WithCancel(context.Background())
		cancels[i], runners[i], done[i] = cancel, r, make(chan error, 1)
		go func() { done[i] <- r.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done[i] })
	}
	waitFor(t, "both nodes converged on {1,2} with 8 buckets each", 5*time.Second, func() bool {
		for _, r := range runners {
			st := r.Status()
			if !st.Converged || !slices.Equal(st.View.Eligible, []uint32{1, 2}) || toyCount(st.Accept) != 8 {
				return false
			}
		}
		return true
	})
	select {
	case <-runners[0].Changed():
	default:
		t.Error("Changed was never signalled")
	}
	a, b := runners[0].Status().Accept, runners[1].Status().Accept
	for i := range a {
		if a[i] == b[i] {
			t.Errorf("bucket %d: node 1 accepts=%v, node 2 accepts=%v; want exactly one", i, a[i], b[i])
		}
	}
	if s := runners[0].Stats(); s.Sent == 0 || s.Accepted == 0 {
		t.Errorf("stats %+v: want heartbeats sent and accepted", s)
	}

	cancels[1]()
	if err := <-done[1]; err != nil {
		t.Errorf("Run: %v", err)
	}
	done[1] <- nil // for the cleanup
	waitFor(t, "node 1 alone with every bucket", 5*time.Second, func() bool {
		st := runners[0].Status()
		return st.Converged && slices.Equal(st.View.Eligible, []uint32{1}) && toyCount(st.Accept) == 16 && st.Deaths >= 1
	})
}

// TestTransportCountsRejects sends bad datagrams and a valid one from an
// unregistered node, and checks each is counted under its reason.
func TestTransportCountsRejects(t *testing.T) {
	tr, err := Listen("127.0.0.1:0", 7, simRing)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMachine(Config{ClusterID: 7, Self: 1, Incarnation: 1}, time.Now(), toyOwned(1), toyIntersect)
	if err != nil {
		t.Fatal(err)
	}
	r := NewRunner(m, tr, nil)
	// Node 9 is registered elsewhere: its heartbeats from here are not its.
	r.SetPeers(map[uint32]netip.AddrPort{9: netip.MustParseAddrPort("127.0.0.1:1")})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	c, err := net.Dial("udp", tr.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	good, _ := Encode(&Message{ClusterID: 7, Node: 9, Incarnation: 1, Seq: 1}, simRing)
	unknown, _ := Encode(&Message{ClusterID: 7, Node: 10, Incarnation: 1, Seq: 1}, simRing)
	foreign, _ := Encode(&Message{ClusterID: 8, Node: 9, Seq: 1}, simRing)
	otherKey, _ := Encode(&Message{ClusterID: 7, Node: 9, Incarnation: 1, Seq: 2}, otherRing)
	badMAC := append([]byte(nil), good...)
	badMAC[len(badMAC)-1] ^= 1
	for _, b := range [][]byte{{1, 2, 3}, foreign, badMAC, good, unknown, otherKey} {
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	want := map[Reason]uint64{ReasonTruncated: 1, ReasonForeignCluster: 1, ReasonBadMAC: 1, ReasonWrongAddress: 1, ReasonUnknownNode: 1, ReasonUnknownKey: 1}
	waitFor(t, "six rejections counted by reason", 5*time.Second, func() bool {
		s := r.Stats()
		for reason, n := range want {
			if s.Rejected[reason] != n {
				return false
			}
		}
		return true
	})
}

// failOnce is a socket whose next read fails as a broken socket's would
// (not a deadline, not a close).
type failOnce struct {
	net.PacketConn
	armed atomic.Bool
}

func (f *failOnce) ReadFrom(b []byte) (int, net.Addr, error) {
	if f.armed.CompareAndSwap(true, false) {
		return 0, nil, &net.OpError{Op: "read", Net: "udp", Err: syscall.ENETDOWN}
	}
	return f.PacketConn.ReadFrom(b)
}

// TestTransportReopensAFailedSocket: a read that fails replaces the socket
// with a new one on the same address, with the receive deadline in force,
// and the heartbeats sent there after are received; without a way to
// reopen, once closed, or when the new socket fails too within
// reopenPause, the failure ends Receive.
func TestTransportReopensAFailedSocket(t *testing.T) {
	open := func(addr string) (*failOnce, string) {
		c, err := net.ListenPacket("udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return &failOnce{PacketConn: c}, c.LocalAddr().String()
	}
	send := func(to string, seq uint64) {
		b, err := Encode(&Message{ClusterID: 7, Node: 2, Incarnation: 1, Seq: seq}, simRing)
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.Dial("udp", to)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}

	first, addr := open("127.0.0.1:0")
	var reopened []string
	var last *failOnce
	tr := New(first, 7, simRing).WithReopen(func() (net.PacketConn, error) {
		c, a := open(addr) // fails if the old socket still holds the port
		reopened = append(reopened, a)
		last = c
		return c, nil
	})
	first.armed.Store(true)
	// The deadline set before the failure holds on the new socket: with no
	// heartbeat sent, Receive gives up instead of waiting for ever.
	if err := tr.SetReceiveDeadline(time.Now().Add(100 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { _, _, err := tr.Receive(); got <- err }()
	select {
	case err := <-got:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("receive after a failed read, no traffic: %v, want the deadline", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("receive after a failed read ignored the deadline set before it")
	}
	if len(reopened) != 1 || reopened[0] != addr || tr.Stats().Reopens != 1 {
		t.Fatalf("reopened on %v (%d counted), want once on %s", reopened, tr.Stats().Reopens, addr)
	}
	if err := tr.SetReceiveDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	send(addr, 9)
	msg, _, err := tr.Receive()
	if err != nil || msg.Seq != 9 {
		t.Fatalf("heartbeat on the reopened socket: %+v, %v", msg, err)
	}

	// The new socket fails too, well within reopenPause of its opening:
	// Receive ends with the error rather than reopening in a loop.
	last.armed.Store(true)
	if _, _, err := tr.Receive(); !errors.Is(err, syscall.ENETDOWN) || len(reopened) != 1 || tr.Stats().Reopens != 1 {
		t.Fatalf("second failure within %v: %v, reopened %d times (%d counted); want the read's error and no second reopen", reopenPause, err, len(reopened), tr.Stats().Reopens)
	}

	// No way to reopen: the failure is Receive's error.
	lone, _ := open("127.0.0.1:0")
	tr2 := New(lone, 7, simRing)
	lone.armed.Store(true)
	if _, _, err := tr2.Receive(); err == nil || !errors.Is(err, syscall.ENETDOWN) {
		t.Fatalf("receive with no reopen: %v, want the read's error", err)
	}

	// Closed: no reopen, net.ErrClosed.
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tr.Receive(); !errors.Is(err, net.ErrClosed) || len(reopened) != 1 {
		t.Fatalf("receive after close: %v (reopened %d times), want net.ErrClosed and no reopen", err, len(reopened))
	}
}

// TestTransportReceiveQueued: the heartbeats already waiting are taken
// without waiting, rejected ones skipped and counted, and none waiting
// says so at once.
func TestTransportReceiveQueued(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("queued reads are Linux's (MSG_DONTWAIT)")
	}
	tr, err := Listen("127.0.0.1:0", 7, simRing)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	c, err := net.Dial("udp", tr.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for seq := uint64(1); seq <= 3; seq++ {
		b, _ := Encode(&Message{ClusterID: 7, Node: 9, Incarnation: 1, Seq: seq}, simRing)
		if seq == 2 {
			c.Write([]byte{1, 2, 3}) // truncated: skipped
		}
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	tr.SetReceiveDeadline(time.Now().Add(5 * time.Second))
	first, from, err := tr.Receive()
	if err != nil || first.Seq != 1 {
		t.Fatalf("Receive: %v %v", first, err)
	}
	var seqs []uint64
	for {
		msg, qfrom, ok := tr.ReceiveQueued()
		if !ok {
			break
		}
		if qfrom != from {
			t.Errorf("queued heartbeat from %v, the first from %v", qfrom, from)
		}
		seqs = append(seqs, msg.Seq)
	}
	if fmt.Sprint(seqs) != "[2 3]" || tr.Stats().Rejected[ReasonTruncated] != 1 {
		t.Errorf("queued %v, truncated %d; want [2 3] and 1", seqs, tr.Stats().Rejected[ReasonTruncated])
	}
	start := time.Now()
	if _, _, ok := tr.ReceiveQueued(); ok || time.Since(start) > 100*time.Millisecond {
		t.Errorf("with nothing queued: ok %v after %v; want false at once", ok, time.Since(start))
	}

	// Past the receive deadline (a wake-up that came late), what waits is
	// still taken: the caller judges silences next.
	tr.SetReceiveDeadline(time.Now().Add(-time.Second))
	b, _ := Encode(&Message{ClusterID: 7, Node: 9, Incarnation: 1, Seq: 4}, simRing)
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	var late *Message
	for end := time.Now().Add(2 * time.Second); late == nil && time.Now().Before(end); {
		if msg, _, ok := tr.ReceiveQueued(); ok {
			late = msg
		}
	}
	if late == nil || late.Seq != 4 {
		t.Errorf("queued after the deadline passed: %v, want sequence 4", late)
	}
}

// TestTransportSendsToEveryPeer: one Send reaches every address, however
// many there are (they go out in batches), and an address the socket
// refuses (port 0, another family) is counted and skipped without holding
// up the rest, twice in a row (the batch's buffers are reused).
func TestTransportSendsToEveryPeer(t *testing.T) {
	tr, err := Listen("127.0.0.1:0", 7, simRing)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	const peers = 40
	var rx []*Transport
	var to []netip.AddrPort
	for i := range peers {
		r, err := Listen("127.0.0.1:0", 7, simRing)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		rx = append(rx, r)
		to = append(to, netip.MustParseAddrPort(r.LocalAddr().String()))
		switch i {
		case 10:
			to = append(to, netip.MustParseAddrPort("127.0.0.1:0"))
		case 20:
			to = append(to, netip.MustParseAddrPort("[::1]:7946"))
		}
	}
	for seq := uint64(1); seq <= 2; seq++ {
		err := tr.Send(&Message{ClusterID: 7, Node: 9, Incarnation: 1, Seq: seq}, to)
		if err == nil || !strings.Contains(err.Error(), "127.0.0.1:0") || !strings.Contains(err.Error(), "[::1]:7946") {
			t.Errorf("send %d: error %v; want the two refused addresses named", seq, err)
		}
		for i, r := range rx {
			r.SetReceiveDeadline(time.Now().Add(5 * time.Second))
			msg, _, err := r.Receive()
			if err != nil || msg.Seq != seq {
				t.Fatalf("send %d: peer %d received %v, %v", seq, i, msg, err)
			}
		}
	}
	if st := tr.Stats(); st.Sent != 2*peers || st.SendErrors != 4 {
		t.Errorf("sent %d, errors %d; want %d and 4", st.Sent, st.SendErrors, 2*peers)
	}
}

// TestTransportSendsToEveryPeerIPv6: the batch of an IPv6 socket (the
// ipv6 writer), with an IPv4 address among its peers sent alone and
// refused.
func TestTransportSendsToEveryPeerIPv6(t *testing.T) {
	tr, err := Listen("[::1]:0", 7, simRing)
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	defer tr.Close()
	var rx []*Transport
	to := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:7946")}
	for range 5 {
		r, err := Listen("[::1]:0", 7, simRing)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		rx = append(rx, r)
		to = append(to, netip.MustParseAddrPort(r.LocalAddr().String()))
	}
	err = tr.Send(&Message{ClusterID: 7, Node: 9, Incarnation: 1, Seq: 1}, to)
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:7946") {
		t.Errorf("error %v; want the IPv4 address named", err)
	}
	for i, r := range rx {
		r.SetReceiveDeadline(time.Now().Add(5 * time.Second))
		if msg, _, err := r.Receive(); err != nil || msg.Seq != 1 {
			t.Fatalf("peer %d received %v, %v", i, msg, err)
		}
	}
	if st := tr.Stats(); st.Sent != uint64(len(rx)) || st.SendErrors != 1 {
		t.Errorf("sent %d, errors %d; want %d and 1", st.Sent, st.SendErrors, len(rx))
	}
}

// TestTransportReceiveFrom: Receive and ReceiveQueued give the sender's
// address and port, IPv4 and IPv6 (the machine accepts a heartbeat only
// from its sender's registered address).
func TestTransportReceiveFrom(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "::1"} {
		tr, err := Listen(net.JoinHostPort(host, "0"), 7, simRing)
		if err != nil {
			t.Logf("%s: %v (skipped)", host, err)
			continue
		}
		c, err := net.Dial("udp", tr.LocalAddr().String())
		if err != nil {
			tr.Close()
			t.Fatal(err)
		}
		want := netip.MustParseAddrPort(c.LocalAddr().String())
		for seq := uint64(1); seq <= 2; seq++ {
			b, _ := Encode(&Message{ClusterID: 7, Node: 9, Incarnation: 1, Seq: seq}, simRing)
			if _, err := c.Write(b); err != nil {
				t.Fatal(err)
			}
		}
		tr.SetReceiveDeadline(time.Now().Add(5 * time.Second))
		_, from, err := tr.Receive()
		if err != nil || from != want {
			t.Errorf("%s: Receive from %v (%v), want %v", host, from, err, want)
		}
		if runtime.GOOS == "linux" {
			if _, qfrom, ok := tr.ReceiveQueued(); !ok || qfrom != want {
				t.Errorf("%s: ReceiveQueued from %v (%v), want %v", host, qfrom, ok, want)
			}
		}
		c.Close()
		tr.Close()
	}
}
