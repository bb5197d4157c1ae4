package agent_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalnet/shoal/deploy/lab"
	"github.com/shoalnet/shoal/deploy/lab/load"
)

// TestE2EHitlessRestart: `shoal restart`, SIGTERM (what `systemctl
// restart` sends), then the same binary started again, on a node holding
// 50 keep-alive connections while new connections keep coming: no request
// fails, no held connection breaks or moves, the new agent adopts the
// pinned data plane, and the three nodes cover every bucket again.
func TestE2EHitlessRestart(t *testing.T) {
	l := upLab(t, 3)
	var conns []*heldConn
	for len(byNode(conns)["node3"]) < 50 {
		if len(conns) > 600 {
			t.Fatalf("600 connections opened, only %d on node3", len(byNode(conns)["node3"]))
		}
		batch := dialFromClient(t, l, 30)
		for _, c := range batch {
			if err := c.get(l.VIP.String()); err != nil {
				t.Fatal(err)
			}
		}
		conns = append(conns, batch...)
	}
	h := hold(t, l, conns, 100*time.Millisecond)
	t.Logf("%d keep-alive connections, %d on node3", len(conns), len(byNode(conns)["node3"]))

	loadDone := make(chan load.Result, 1)
	go func() {
		r, err := l.Load(context.Background(), lab.LoadArgs{Duration: 8 * time.Second, Concurrency: 4, Timeout: 5 * time.Second}, nil)
		if err != nil {
			t.Error(err)
		}
		loadDone <- r
	}()
	time.Sleep(time.Second)
	p := proc(t, l, "node3", "agent")
	mustShoal(t, l, "node3", "restart")
	stopped := time.Now()
	stopAgent(t, l, "node3", syscall.SIGTERM)
	exited := time.Since(stopped)
	startAgent(t, l, "node3")
	poll(t, 15*time.Second, "three nodes cover every bucket after the restart", func() error { return covered(l, "node1", "node2", "node3") })
	back := time.Since(stopped)
	res := <-loadDone
	t.Logf("restart: old agent exited %v after SIGTERM, all covered %v after it; load: %d requests, %d failed, %d delayed by a SYN retransmission",
		exited.Round(time.Millisecond), back.Round(time.Millisecond), res.Requests, res.Failures, res.Delayed)
	if res.Failures != 0 {
		t.Errorf("%d of %d new-connection requests failed across the restart: %v %v", res.Failures, res.Requests, res.Errors, res.FailureList)
	}
	if exited > 2*time.Second {
		t.Errorf("the stopping agent took %v to exit; a restart should exit at once", exited)
	}
	time.Sleep(500 * time.Millisecond) // a few more requests on every held connection
	h.close()
	h.check(t)
	b, err := os.ReadFile(p.Log)
	if err != nil {
		t.Fatal(err)
	}
	log := string(b)
	for _, want := range []string{"stopped for a restart", "adopted the pinned data plane"} {
		if !strings.Contains(log, want) {
			t.Errorf("node3's log does not say %q", want)
		}
	}
	if strings.Contains(log, "handed off") {
		t.Error("the restart handed off like a graceful stop")
	}
}

// TestE2ERestartNotBack: an agent stopped for a restart that does not come
// back within its window: the peers keep its buckets with it until the
// window ends, then take them over as after a failure; started later, it
// rejoins from scratch.
func TestE2ERestartNotBack(t *testing.T) {
	const window = 2 * time.Second
	l := upLab(t, 3)
	mustShoal(t, l, "node3", "restart", "--window", window.String())
	stopped := time.Now()
	stopAgent(t, l, "node3", syscall.SIGTERM)
	var owned time.Duration
	poll(t, window+5*time.Second, "node1 and node2 cover every bucket", func() error {
		err := covered(l, "node1", "node2")
		if err == nil {
			owned = time.Since(stopped)
		} else if since := time.Since(stopped); since < window-500*time.Millisecond {
			for _, n := range []string{"node1", "node2"} {
				st, serr := client(t, l, n).Status(context.Background())
				if serr == nil && !slices.Contains(st.View.Eligible, 3) {
					return fmt.Errorf("stop: %s dropped node3 from its view %v after the stop, inside the %v window", n, since.Round(time.Millisecond), window)
				}
			}
		}
		return err
	})
	t.Logf("window %v: node1 and node2 own every bucket %v after the stop", window, owned.Round(time.Millisecond))
	if owned < window-200*time.Millisecond {
		t.Errorf("peers took over %v after the stop, before the %v window ended", owned, window)
	}
	if owned > window+1500*time.Millisecond {
		t.Errorf("peers took over %v after the stop; want within the window (%v) + the failover bound (1.5 s)", owned, window)
	}
	r := loadRun(t, l, lab.LoadArgs{Duration: time.Second, Concurrency: 4, Timeout: 3 * time.Second})
	if r.Failures != 0 || r.ByNode["node3"] != 0 {
		t.Errorf("after the window: %d of %d requests failed (%v), node3 served %d", r.Failures, r.Requests, r.Errors, r.ByNode["node3"])
	}
	startAgent(t, l, "node3")
	poll(t, 15*time.Second, "three nodes cover every bucket", func() error { return covered(l, "node1", "node2", "node3") })
}
