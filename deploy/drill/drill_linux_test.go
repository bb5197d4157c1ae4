package drill

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoalnet/shoal/deploy/lab"
)

// tWriter sends progress lines to t.Log.
type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

var (
	buildOnce sync.Once
	shoalBin  string
	buildErr  error
	buildDir  string
)

// needLab skips unless the test can build labs, and returns the shoal
// binary (built once per test binary) and a lab base directory.
func needLab(t *testing.T) (bin, base string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the drill builds a lab of network namespaces: run as root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("iproute2 (ip) not installed")
	}
	if testing.Short() {
		t.Skip("builds shoal and a lab (~20 s each); skipped with -short")
	}
	buildOnce.Do(func() {
		if buildDir, buildErr = os.MkdirTemp("", "drilltest"); buildErr != nil {
			return
		}
		shoalBin = filepath.Join(buildDir, "shoal")
		if out, err := exec.Command("go", "build", "-o", shoalBin, "github.com/shoalnet/shoal/cmd/shoal").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/shoal: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return shoalBin, t.TempDir()
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// TestLabPlug is `shoal drill --lab plug`, briefly: a 3-node lab, traffic on
// new connections, node3's switch port down after 1.5 s. The report must
// measure the failover, show failures only around the event and every
// request succeeding once the survivors own every bucket.
func TestLabPlug(t *testing.T) {
	bin, base := needLab(t)
	t.Cleanup(func() {
		// A backstop: RunLab removes its lab itself. Only labs under this
		// test's base are touched.
		files, _ := filepath.Glob(filepath.Join(base, "shl*.json"))
		for _, f := range files {
			id := strings.TrimSuffix(filepath.Base(f), ".json")
			t.Errorf("lab %s left after RunLab", id)
			if l, err := lab.Open(base, id, nil); err == nil {
				l.Down(context.Background())
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const timeout = time.Second
	rep, err := RunLab(ctx, LabOptions{
		Scenario: Plug,
		Traffic:  Traffic{Duration: 6 * time.Second, Lead: 1500 * time.Millisecond, Concurrency: 8, Timeout: timeout},
		Lab:      lab.Options{Nodes: 3, Binary: bin, Base: base},
		Progress: tWriter{t},
	})
	if rep != nil {
		var b bytes.Buffer
		rep.WriteText(&b)
		t.Log("\n" + b.String())
	}
	if err != nil {
		t.Fatal(err)
	}
	if rep.Node != "node3" || rep.Scenario != Plug {
		t.Errorf("drill acted %q on %q, want plug on node3", rep.Scenario, rep.Node)
	}
	if rep.SettledMS <= 0 || rep.SettledMS > 10000 {
		t.Errorf("failover %v ms, want a measured time within the settle timeout", rep.SettledMS)
	}
	if rep.EventAtMS < 500 || rep.EventAtMS > 3000 {
		t.Errorf("event at %v ms of the traffic, want about 1500", rep.EventAtMS)
	}
	if rep.HeartbeatPeriod == "" {
		t.Error("report lacks the agents' heartbeat period")
	}
	// Failures: only requests that started around the event, none before
	// it (less a request's timeout), none after the survivors took over.
	for _, f := range rep.FailureList {
		if f.AtMS < rep.EventAtMS-ms(timeout) || f.AtMS > rep.EventAtMS+rep.SettledMS {
			t.Errorf("request at %.0f ms failed (%s), outside the event (%.0f ms) to settled (+%.0f ms)",
				f.AtMS, f.Error, rep.EventAtMS, rep.SettledMS)
		}
	}
	frac, n := rep.SuccessAfter(rep.SettledMS)
	if n == 0 || frac != 1 {
		t.Errorf("after the failover %.4f of %d requests succeeded, want all of some", frac, n)
	}
	// After the failover node3 answers nothing and its XDP accepts nothing;
	// before the event every node answered.
	var before = map[string]int{}
	var after3 int
	var after3pk uint64
	for _, s := range rep.Timeline {
		if s.AtMS+100 <= rep.EventAtMS {
			for n, c := range s.Responses {
				before[n] += c
			}
		}
		if s.AtMS >= rep.EventAtMS+rep.SettledMS {
			after3 += s.Responses["node3"]
			after3pk += s.Packets["node3"]
		}
	}
	for _, n := range []string{"node1", "node2", "node3"} {
		if before[n] == 0 {
			t.Errorf("%s answered nothing before the event", n)
		}
	}
	if after3 != 0 || after3pk != 0 {
		t.Errorf("after the failover node3 answered %d requests and accepted %d packets, want 0", after3, after3pk)
	}
	var sampled int
	for _, s := range rep.Timeline {
		if s.Share != nil {
			sampled++
		}
	}
	if sampled < len(rep.Timeline)/2 {
		t.Errorf("only %d of %d slots have shares from the agents' counters", sampled, len(rep.Timeline))
	}
	var svg bytes.Buffer
	if err := rep.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	ids := parseSVG(t, svg.Bytes())
	for _, id := range []string{"series-node1", "series-node2", "series-node3", "event", "settled"} {
		if _, ok := ids[id]; !ok {
			t.Errorf("plot lacks %q", id)
		}
	}
}

// TestClusterPlug drills a lab as a real cluster: `shoal drill` runs in the
// lab's client namespace with --vip, node1's socket, and pulls node3's plug
// over the authenticated peer API; the plug must be back at the end.
func TestClusterPlug(t *testing.T) {
	bin, base := needLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	l, err := lab.Up(ctx, lab.Options{Nodes: 3, Binary: bin, Base: base})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Down(context.Background()); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	node3 := l.Nodes[2]
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", l.Client.Namespace, bin,
		"--socket", l.Nodes[0].Socket, "drill", "--vip", l.VIP.String(), "--node", node3.Name,
		"--peer", fmt.Sprintf("%s:%d", node3.Addr, lab.PeerPort), "--key-file", l.KeyFile,
		"--duration", "5s", "--lead", "1500ms", "--timeout", "1s", "--json", "plug")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("shoal drill: %v\n%s", err, errb.String())
	}
	var rep Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("drill --json: %v\n%s", err, out.String())
	}
	if rep.Target != "cluster" || rep.Node != "node3" || rep.SettledMS <= 0 {
		t.Errorf("report: target %q node %q settled %v ms; want cluster, node3, a measured failover", rep.Target, rep.Node, rep.SettledMS)
	}
	if frac, n := rep.SuccessAfter(rep.SettledMS + 1000); n == 0 || frac != 1 {
		t.Errorf("a second after the failover %.4f of %d requests succeeded, want all", frac, n)
	}
	// The drill put the plug back: node3 rejoins the cluster.
	var st lab.NodeStatus
	deadline := time.Now().Add(20 * time.Second)
	for {
		all, err := l.Statuses(ctx, l.Nodes)
		if err == nil && lab.Ready(all, 3) == nil {
			break
		}
		if time.Now().After(deadline) {
			st, _ = lab.Ctl{Binary: bin}.Status(ctx, node3.Socket)
			t.Fatalf("node3 did not rejoin after the drill (plug not restored?): %+v, %v", st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLabRule is `shoal drill --lab rule`, briefly: the
// port rule's range grows under new-connection load from a client with a
// 2 s timeout. The drill must measure when every node has the new rule
// with every bucket owned, and count the requests, failed and delayed.
func TestLabRule(t *testing.T) {
	bin, base := needLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rep, err := RunLab(ctx, LabOptions{
		Scenario: Rule,
		Traffic:  Traffic{Duration: 4 * time.Second, Lead: time.Second, Concurrency: 4, Timeout: 2 * time.Second},
		Lab:      lab.Options{Nodes: 3, Binary: bin, Base: base},
		Progress: tWriter{t},
	})
	if rep != nil {
		var b bytes.Buffer
		rep.WriteText(&b)
		t.Log("\n" + b.String())
	}
	if err != nil {
		t.Fatal(err)
	}
	if rep.Scenario != Rule || rep.SettledMS <= 0 || rep.SettledMS > 10000 {
		t.Errorf("drill %q settled after %v ms; want rule, a measured time", rep.Scenario, rep.SettledMS)
	}
	if rep.Failures != 0 || rep.Requests < 100 || rep.Connects != rep.Requests {
		t.Errorf("%d of %d requests failed (%v), %d connects; want none failed of at least 100, each on its own connection",
			rep.Failures, rep.Requests, rep.Errors, rep.Connects)
	}
	var delayed int
	for _, s := range rep.Timeline {
		delayed += s.Delayed
	}
	if delayed != rep.Delayed || len(rep.DelayedList) != rep.Delayed {
		t.Errorf("delayed: %d in the timeline, %d listed, %d counted", delayed, len(rep.DelayedList), rep.Delayed)
	}
}

// TestLabRestart is `shoal drill --lab --keepalive restart`, briefly: the
// victim's agent is restarted hitlessly under keep-alive load. No request
// fails, no worker opens a second connection (none broke), the victim
// answers its connections' requests in every 100 ms of the restart (a
// graceful stop and start instead stalls them for most of a second, until
// the new agent is back), and the drill measures when the restarted node is
// back with every bucket owned.
func TestLabRestart(t *testing.T) {
	bin, base := needLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const workers = 12 // so that some keep-alive connections are the victim's
	rep, err := RunLab(ctx, LabOptions{
		Scenario: Restart,
		Traffic:  Traffic{Duration: 4 * time.Second, Lead: time.Second, Concurrency: workers, KeepAlive: true, Timeout: 2 * time.Second},
		Lab:      lab.Options{Nodes: 3, Binary: bin, Base: base},
		Progress: tWriter{t},
	})
	if rep != nil {
		var b bytes.Buffer
		rep.WriteText(&b)
		t.Log("\n" + b.String())
	}
	if err != nil {
		t.Fatal(err)
	}
	if rep.Scenario != Restart || rep.SettledMS <= 0 || rep.SettledMS > 10000 {
		t.Errorf("drill %q settled after %v ms; want restart, a measured time", rep.Scenario, rep.SettledMS)
	}
	if rep.Failures != 0 || rep.Requests < 100 || rep.Connects > workers {
		t.Errorf("%d of %d requests failed (%v), %d connects for %d workers; want none failed of at least 100, no connection opened twice",
			rep.Failures, rep.Requests, rep.Errors, rep.Connects, workers)
	}
	after, silent := 0, 0 // the victim's responses after the restart began, and its slots without any
	for _, s := range rep.Timeline {
		// Slots from the restart to the end of the traffic; the last one,
		// cut short where the traffic ended, holds a request or two.
		if s.AtMS >= rep.EventAtMS && s.AtMS+slotMillis <= rep.DurationMS {
			after += s.Responses[rep.Node]
			if s.Responses[rep.Node] == 0 {
				silent++
			}
		}
	}
	if after == 0 {
		t.Errorf("%s served no request after its restart began: no connection of the drill was its", rep.Node)
	}
	// A gap in the data plane while the new agent takes over drops the
	// victim's packets, and its clients retransmit them. A 100 ms slot
	// without a response from it is no proof of that: on two cores the new
	// agent's start-up (process, program load) can starve a node's server
	// for that long, and captures of such slots show late answers, not
	// lost packets.
	switch {
	case rep.Retransmits == nil:
		t.Errorf("the client's retransmissions are unknown: want TCP_INFO's count")
	case *rep.Retransmits > 0:
		t.Errorf("the client retransmitted %d segments: packets were dropped across the restart (%d slots without a response from %s)", *rep.Retransmits, silent, rep.Node)
	}
	t.Logf("%s served %d requests after its restart began", rep.Node, after)
}
