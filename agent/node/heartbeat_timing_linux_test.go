package node

import (
	"context"
	"net"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/shoalnet/shoal/agent/metrics"
	"github.com/shoalnet/shoal/rules"

	"golang.org/x/sys/unix"
)

// TestHeartbeatsKeepTimeUnderSlowWork: heartbeats go out every period,
// within 10%, while table pushes and socket scans that each take three
// periods run, and while metrics are scraped 20 at a time. Node 2 is only a
// UDP socket that timestamps what node 1 sends.
func TestHeartbeatsKeepTimeUnderSlowWork(t *testing.T) {
	const period = 100 * time.Millisecond
	c := newTestCluster(t, 2, period)
	// Node 2 never starts: the test takes its address and timestamps
	// node 1's heartbeats as the kernel receives them.
	addr := c.nodes[1].link.LocalAddr().String()
	c.nodes[1].link.Close()
	n1 := c.nodes[0]
	n1.dp.delay.Store(int64(3 * period))
	n1.scan.Store(int64(3 * period))
	c.start(1)

	arrivals := kernelArrivals(t, addr)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	// Rules change every 250 ms: each is a new view, so a slow scan and a
	// slow push, and the new view waits for them.
	wg.Go(func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				c.rules.set(func(st *rules.State) { st.Settings.HashSeed++ })
			}
		}
	})
	// Scrapes, 20 at a time, a round every period.
	h := metrics.Handler(n1.n)
	scrapes := atomic.Int64{}
	wg.Go(func() {
		for ctx.Err() == nil {
			var round sync.WaitGroup
			for range 20 {
				round.Go(func() {
					h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/metrics", nil))
					scrapes.Add(1)
				})
			}
			round.Wait()
			time.Sleep(period)
		}
	})

	// The first heartbeat waits for the first tables; then measure 3 s.
	select {
	case <-arrivals:
	case <-time.After(10 * time.Second):
		t.Fatal("node 1 sent no heartbeat")
	}
	var got []time.Time
	start := time.Now()
	for time.Since(start) < 3*time.Second {
		select {
		case a := <-arrivals:
			got = append(got, a)
		case <-time.After(time.Second):
			t.Fatal("node 1 sent no heartbeat for a second")
		}
	}
	cancel()
	if len(got) < 25 {
		t.Fatalf("%d heartbeats in 3 s, want about 30", len(got))
	}
	var worst time.Duration
	for i := 1; i < len(got); i++ {
		gap := got[i].Sub(got[i-1])
		worst = max(worst, gap)
		if gap > period*11/10 {
			t.Errorf("heartbeat %d of %d came %v after the previous one (period %v)", i, len(got), gap.Round(time.Millisecond), period)
		}
	}
	pushes, scans := n1.dp.updates.Load(), n1.scans.Load()
	t.Logf("%d heartbeats, longest gap %v, %d slow pushes, %d slow scans, %d scrapes", len(got), worst.Round(time.Millisecond), pushes, scans, scrapes.Load())
	if pushes < 5 || scans < 5 || scrapes.Load() < 400 {
		t.Errorf("the slow work did not run: %d pushes, %d scans, %d scrapes", pushes, scans, scrapes.Load())
	}
}

// kernelArrivals listens on addr and sends, for each datagram, the time the
// kernel received it (SO_TIMESTAMPNS): what a measurement of the sender's
// timing should use, since the reading goroutine's own scheduling delay on
// a loaded machine is as large as the tolerance measured.
func kernelArrivals(t *testing.T, addr string) <-chan time.Time {
	t.Helper()
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.ListenUDP("udp", ua)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	}); err != nil || serr != nil {
		t.Fatalf("SO_TIMESTAMPNS: %v %v", err, serr)
	}
	out := make(chan time.Time, 1000)
	go func() {
		buf, oob := make([]byte, 64<<10), make([]byte, 128)
		for {
			_, oobn, _, _, err := conn.ReadMsgUDP(buf, oob)
			if err != nil {
				return
			}
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil {
				continue
			}
			for _, m := range msgs {
				if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_TIMESTAMPNS && len(m.Data) >= int(unsafe.Sizeof(unix.Timespec{})) {
					ts := (*unix.Timespec)(unsafe.Pointer(&m.Data[0]))
					select {
					case out <- time.Unix(ts.Unix()):
					default:
					}
				}
			}
		}
	}()
	return out
}
