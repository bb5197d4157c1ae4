package agent_test

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/shoalnet/shoal/deploy/lab"
)

// TestE2ERoutedECMPBaseline measures what plain ECMP does to established
// connections in routed mode (part 1: no forwarding to the owner yet):
// 60 long-lived keep-alive connections through the lab's router, then a
// drainstop of node3 (it withdraws at once) and its start again. Every
// connection node3 held breaks when it withdraws (the router sends its
// flows elsewhere), and the rehash may move some of the others' too; the
// counts are the baseline forwarding to the owner must bring to 0.
func TestE2ERoutedECMPBaseline(t *testing.T) {
	if _, err := exec.LookPath("vtysh"); err != nil {
		t.Skip("routed mode's lab router needs FRR: apt-get install frr")
	}
	l := upLabWith(t, lab.Options{Nodes: 3, MACMode: "routed"})
	conns := dialFromClient(t, l, 60)
	h := hold(t, l, conns, 100*time.Millisecond)
	onNode3 := len(byNode(conns)["node3"])
	if onNode3 == 0 {
		t.Fatal("no held connection landed on node3: the test proves nothing")
	}
	broken := func() (n int) {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, c := range conns {
			if c.err != nil || c.moved != "" {
				n++
			}
		}
		return n
	}
	// Its connections do not end on it (their packets go elsewhere now),
	// so the drain runs to its timeout and stops the node (exit 4).
	if out, err := l.CLI(t.Context(), "node1", "drainstop", "--node", "node3", "--timeout", "1s"); err != nil && !strings.Contains(err.Error(), "still draining") {
		t.Fatalf("drainstop: %v: %s", err, out)
	}
	time.Sleep(time.Second)
	afterDrain := broken()
	brokenOn3 := 0
	h.mu.Lock()
	for _, c := range byNode(conns)["node3"] {
		if c.err != nil || c.moved != "" {
			brokenOn3++
		}
	}
	h.mu.Unlock()
	if brokenOn3 != onNode3 {
		t.Errorf("%d of node3's %d connections survived its withdrawal: plain ECMP should have moved them all", onNode3-brokenOn3, onNode3)
	}
	if _, err := l.CLI(t.Context(), "node1", "start", "--node", "node3"); err != nil {
		t.Fatal(err)
	}
	if err := lab.Poll(t.Context(), 15*time.Second, 50*time.Millisecond, func() error {
		hops, err := l.NextHops(t.Context(), l.VIP)
		if err == nil && len(hops) != 3 {
			err = fmt.Errorf("next hops %v", hops)
		}
		return err
	}); err != nil {
		t.Fatalf("node3 started: %v", err)
	}
	time.Sleep(time.Second)
	total := broken()
	h.close()
	t.Logf("routed mode, plain ECMP: drainstop of node3 broke %d of 60 held connections (all %d of node3's); its start broke %d more", afterDrain, onNode3, total-afterDrain)
}
