package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/deploy/lab"
	"github.com/shoalnet/shoal/deploy/lab/load"
)

// TestE2ERoutedForwarding holds 60 keep-alive connections through the
// routed lab's router (a request every 100 ms each, 3 s timeout) beside a
// new-connection load (2 s timeout) across every change that moves flows
// between nodes: a drainstop of node3 (its connections finish after 3 s),
// its start, a weight change, and a rehash at the router (node2's next
// hop removed and put back). With forwarding to the owner (the default)
// no held connection breaks and no request fails; with forwarding off
// (plain ECMP, the baseline) node3's connections break as soon as it
// withdraws, and the test reports what the other changes broke.
func TestE2ERoutedForwarding(t *testing.T) {
	if _, err := exec.LookPath("vtysh"); err != nil {
		t.Skip("routed mode's lab router needs FRR: apt-get install frr")
	}
	for _, tc := range []struct {
		name      string
		noForward bool
	}{{"forward", false}, {"ecmp", true}} {
		t.Run(tc.name, func(t *testing.T) { testRoutedChanges(t, tc.noForward) })
	}
}

func testRoutedChanges(t *testing.T, noForward bool) {
	l := upLabWith(t, lab.Options{Nodes: 3, MACMode: "routed", NoForward: noForward})
	conns := dialFromClient(t, l, 60)
	h := hold(t, l, conns, 100*time.Millisecond)
	onNode3 := byNode(conns)["node3"]
	if len(onNode3) == 0 {
		t.Fatal("no held connection landed on node3: the test proves nothing")
	}
	waitLoad := startLoad(context.Background(), t, l, lab.LoadArgs{Duration: 20 * time.Second, Concurrency: 4, Timeout: 2 * time.Second})
	closed := map[*heldConn]bool{} // by the test itself
	broken := func(which []*heldConn) (n int) {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, c := range which {
			if !closed[c] && (c.err != nil || c.moved != "") {
				n++
			}
		}
		return n
	}
	hops := func(want int) {
		t.Helper()
		if err := lab.Poll(t.Context(), 15*time.Second, 50*time.Millisecond, func() error {
			hops, err := l.NextHops(t.Context(), l.VIP)
			if err == nil && len(hops) != want {
				err = fmt.Errorf("next hops %v, want %d", hops, want)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	steps := []string{}
	step := func(name string) { steps = append(steps, fmt.Sprintf("%s %d", name, broken(conns))) }

	// Drainstop: with forwarding node3 keeps announcing while it drains,
	// forwarding the new flows it still gets; without, it withdraws at once.
	time.Sleep(time.Second)
	drained := make(chan error, 1)
	timeout := "60s"
	if noForward {
		timeout = "5s" // node3's sockets outlive the connections its withdrawal broke
	}
	go func() {
		_, err := l.CLI(context.Background(), "node1", "drainstop", "--node", "node3", "--timeout", timeout)
		drained <- err
	}()
	time.Sleep(3 * time.Second)
	node3Broken := broken(onNode3)
	if !noForward {
		if hs, err := l.NextHops(t.Context(), l.VIP); err != nil || len(hs) != 3 {
			t.Errorf("next hops while node3 drains: %v %v; want all three (it announces until drained)", hs, err)
		}
	}
	step("drainstop")
	// node3's connections finish; the drain ends and node3 stops.
	h.mu.Lock()
	for _, c := range onNode3 {
		if c.err == nil && c.moved == "" {
			c.c.Close()
			closed[c] = true
		}
	}
	h.mu.Unlock()
	select {
	case err := <-drained:
		if err != nil && !noForward {
			t.Errorf("drainstop: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("drainstop did not return after node3's connections closed")
	}
	hops(2)
	if _, err := l.CLI(t.Context(), "node1", "start", "--node", "node3"); err != nil {
		t.Fatal(err)
	}
	hops(3)
	time.Sleep(time.Second)
	step("start")
	if _, err := l.CLI(t.Context(), "node2", "weight", "set", "1", "node1", "100"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	step("weight")
	node2 := l.Nodes[1].Addr
	for _, down := range []bool{true, false} {
		if err := l.SetNextHop(t.Context(), node2, down); err != nil {
			t.Fatal(err)
		}
		hops(map[bool]int{true: 2, false: 3}[down])
		time.Sleep(time.Second)
	}
	step("rehash")
	res := waitLoad()
	h.close()
	h.mu.Lock()
	for c := range closed {
		c.err = nil
	}
	h.mu.Unlock()
	t.Logf("routed, forwarding %v: held connections broken (cumulative, of 60): %s; node3's %d of %d broken while it drained; new connections: %d of %d failed",
		!noForward, strings.Join(steps, ", "), node3Broken, len(onNode3), res.Failures, res.Requests)
	if noForward {
		if node3Broken != len(onNode3) {
			t.Errorf("plain ECMP: %d of node3's %d connections survived its withdrawal", len(onNode3)-node3Broken, len(onNode3))
		}
		return
	}
	h.check(t)
	if res.Failures != 0 {
		t.Errorf("%d of %d new-connection requests failed: %v %v", res.Failures, res.Requests, res.Errors, res.FailureList)
	}

	// What the nodes say they forwarded: the changes moved flows, so some
	// went to their owners and some to a previous owner.
	var out, second, in uint64
	for _, n := range l.Nodes {
		b, err := l.CLI(t.Context(), n.Name, "query", "--json")
		if err != nil {
			t.Fatal(err)
		}
		var q control.Query
		if err := json.Unmarshal(b, &q); err != nil || q.Forwarding == nil || !q.Forwarding.On {
			t.Fatalf("%s: query's forwarding %+v, %v; want it on", n.Name, q.Forwarding, err)
		}
		for _, p := range q.Forwarding.Peers {
			out, second, in = out+p.Forwarded, second+p.SecondChance, in+p.Received
		}
		if f := q.Forwarding; f.Foreign+f.NoRoute+f.TooBig != 0 {
			t.Errorf("%s dropped forwarded packets: %+v", n.Name, f)
		}
	}
	t.Logf("forwarded %d to owners, %d as second chances; received %d", out, second, in)
	if out == 0 || second == 0 || in < out {
		t.Errorf("forwarded %d to owners, %d as second chances, received %d: want some of each, all received", out, second, in)
	}

	// query --flow on a held connection: every node that does not own its
	// bucket forwards it to the owner.
	c := conns[0]
	b, err := l.CLI(t.Context(), "node1", "query", "--json", "--flow", c.c.LocalAddr().String(), netip.AddrPortFrom(l.VIP, lab.HTTPPort).String())
	if err != nil {
		t.Fatal(err)
	}
	var f control.Flow
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	for _, n := range f.Nodes {
		if n.Name != f.Owner && (n.ForwardsTo != f.Owner || n.Forwarding == "") {
			t.Errorf("flow %s: %s forwards to %q (%s), want the owner %s", c.c.LocalAddr(), n.Name, n.ForwardsTo, n.Forwarding, f.Owner)
		}
	}
}

// TestE2ERoutedBalance: through the router, whichever node ECMP picks for
// a connection, the node that serves it is its bucket's owner: with equal
// weights and with weights 100/50/0 each node serves its weight's share,
// max/mean of served/share at most 1.05 over at least 30,000 connections.
func TestE2ERoutedBalance(t *testing.T) {
	if _, err := exec.LookPath("vtysh"); err != nil {
		t.Skip("routed mode's lab router needs FRR: apt-get install frr")
	}
	l := upLabWith(t, lab.Options{Nodes: 3, MACMode: "routed"})
	phase := func(name string, weight map[string]float64) {
		// 30,000 connections at least, in runs of 10 s: how many a run
		// makes is the machine's speed (28,602 in one CI run).
		r := load.Result{ByNode: map[string]int{}}
		for run := 0; run < 4 && r.Successes < 30000; run++ {
			rr := loadRun(t, l, lab.LoadArgs{Duration: 10 * time.Second, Concurrency: 8, Timeout: 2 * time.Second})
			r.Requests, r.Successes, r.Failures = r.Requests+rr.Requests, r.Successes+rr.Successes, r.Failures+rr.Failures
			for c, k := range rr.Errors {
				if r.Errors == nil {
					r.Errors = map[load.ErrorClass]int{}
				}
				r.Errors[c] += k
			}
			for n, k := range rr.ByNode {
				r.ByNode[n] += k
			}
		}
		if r.Failures != 0 || r.Successes < 30000 {
			t.Errorf("%s: %d of %d requests failed (%v); want 0 failed of at least 30,000", name, r.Failures, r.Requests, r.Errors)
		}
		var sum float64
		for _, w := range weight {
			sum += w
		}
		var ratios []string
		worst := 0.0
		for n, w := range weight {
			if w == 0 {
				if r.ByNode[n] != 0 {
					t.Errorf("%s: %s has weight 0 and served %d requests", name, n, r.ByNode[n])
				}
				continue
			}
			ratio := float64(r.ByNode[n]) / (float64(r.Successes) * w / sum)
			worst = max(worst, ratio)
			ratios = append(ratios, fmt.Sprintf("%s %.3f", n, ratio))
		}
		t.Logf("%s: %d connections; served/share %s; max/mean %.3f", name, r.Successes, strings.Join(ratios, ", "), worst)
		if worst > 1.05 {
			t.Errorf("%s: max/mean %.3f over %d connections, want at most 1.05", name, worst, r.Successes)
		}
	}
	phase("equal weights", map[string]float64{"node1": 1, "node2": 1, "node3": 1})
	for name, w := range map[string]string{"node1": "100", "node2": "50", "node3": "0"} {
		if _, err := l.CLI(t.Context(), "node1", "weight", "set", "1", name, w); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, 10*time.Second, "converge on the new weights", func() error { return covered(l, "node1", "node2", "node3") })
	phase("weights 100-50-0", map[string]float64{"node1": 100, "node2": 50, "node3": 0})
}
