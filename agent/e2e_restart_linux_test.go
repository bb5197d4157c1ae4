package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalnet/shoal/deploy/lab"
)

// TestE2EHitlessRestart: a restart armed, SIGTERM (what `systemctl
// restart` sends), then the same binary started again, on a node holding
// 50 keep-alive connections while new connections keep coming, twice: once
// as `systemctl restart shoal` does it (the unit's ExecStop= arms it, with
// a systemctl that reports a restart job) and the new agent adopts the
// pinned tables, and once armed by `shoal restart` as if the new binary
// had another XDP program (the record says the pins are another program's:
// the new agent takes over the link and rebuilds the tables from the
// record). No request fails, no held connection breaks or moves, and the
// three nodes cover every bucket again after each. For an IPv4 and an IPv6
// VIP.
func TestE2EHitlessRestart(t *testing.T) {
	forFamilies(t, testHitlessRestart)
}

func testHitlessRestart(t *testing.T, family lab.Family) {
	l := upLabWith(t, lab.Options{Nodes: 3, Family: family})
	conns := dialUntilNode3(t, l, 50)
	h := hold(t, l, conns, 100*time.Millisecond)
	t.Logf("%d keep-alive connections, %d on node3", len(conns), len(byNode(conns)["node3"]))

	waitLoad := startLoad(context.Background(), t, l, lab.LoadArgs{Duration: 10 * time.Second, Concurrency: 4, Timeout: 5 * time.Second})
	p := proc(t, l, "node3", "agent")
	for _, tc := range []struct {
		name, want string
		arm        func()
		between    func()
	}{
		{"same program", "adopted the pinned data plane", func() { unitExecStop(t, l, "node3") }, nil},
		{"another program", "rebuilt from the restart record", func() { mustShoal(t, l, "node3", "restart") }, func() { otherProgram(t, node(t, l, "node3").DataDir) }},
	} {
		time.Sleep(time.Second)
		tc.arm()
		stopped := time.Now()
		stopAgent(t, l, "node3", syscall.SIGTERM)
		exited := time.Since(stopped)
		if tc.between != nil {
			tc.between()
		}
		startAgent(t, l, "node3")
		poll(t, 15*time.Second, tc.name+": three nodes cover every bucket after the restart", func() error { return covered(l, "node1", "node2", "node3") })
		t.Logf("%s: old agent exited %v after SIGTERM, all covered %v after it", tc.name, exited.Round(time.Millisecond), time.Since(stopped).Round(time.Millisecond))
		if exited > 2*time.Second {
			t.Errorf("%s: the stopping agent took %v to exit; a restart should exit at once", tc.name, exited)
		}
		b, err := os.ReadFile(p.Log)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), tc.want) {
			t.Errorf("%s: node3's log does not say %q", tc.name, tc.want)
		}
	}
	res := waitLoad()
	t.Logf("load: %d requests, %d failed, %d delayed by a SYN retransmission", res.Requests, res.Failures, res.Delayed)
	if res.Failures != 0 {
		t.Errorf("%d of %d new-connection requests failed across the restarts: %v %v", res.Failures, res.Requests, res.Errors, res.FailureList)
	}
	h.close()
	h.check(t)
	b, err := os.ReadFile(p.Log)
	if err != nil {
		t.Fatal(err)
	}
	log := string(b)
	if strings.Contains(log, "handed off") {
		t.Error("a restart handed off like a graceful stop")
	}
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "level=ERROR") {
			t.Errorf("node3 logged an error: %s", line)
		}
	}
}

// unitExecStop runs the ExecStop= command of deploy/shoal.service against
// node, as systemd does during `systemctl restart shoal`: with a systemctl
// on PATH that reports a restart job for the unit.
func unitExecStop(t *testing.T, l *lab.Lab, node string) {
	t.Helper()
	unit, err := os.ReadFile("../deploy/shoal.service")
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, line := range strings.Split(string(unit), "\n") {
		if cmd, ok := strings.CutPrefix(line, "ExecStop=-"); ok {
			args = strings.Fields(cmd)[1:] // the unit's binary is this test's
		}
	}
	if args == nil {
		t.Fatal("deploy/shoal.service has no ExecStop=-")
	}
	dir := t.TempDir()
	script := "#!/bin/sh\n[ \"$1\" = list-jobs ] && echo '  41 shoal.service restart running'\n"
	if err := os.WriteFile(filepath.Join(dir, "systemctl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	out, code := shoalEnv(t, l, node, []string{"PATH=" + dir + ":" + os.Getenv("PATH")}, args...)
	if code != 0 || !strings.Contains(out, "restart armed") {
		t.Fatalf("the unit's ExecStop= (shoal %s) with a restart job: exit %d: %s", strings.Join(args, " "), code, out)
	}
}

// otherProgram makes the restart record in dataDir say the pinned data
// plane is another program's, as after an upgrade that changed it.
func otherProgram(t *testing.T, dataDir string) {
	t.Helper()
	path := filepath.Join(dataDir, "host-state.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // the bitmaps' 64-bit words do not survive a float64
	if err := dec.Decode(&rec); err != nil {
		t.Fatal(err)
	}
	r, ok := rec["restart"].(map[string]any)
	if !ok {
		t.Fatalf("no restart in the host record: %s", b)
	}
	r["pinned"].(map[string]any)["program"] = "an older program"
	if b, err = json.Marshal(rec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
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
