package agent_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/deploy/lab"
)

// TestE2EQueryFlow: for 1,000 real connections from the lab's client, each
// from a chosen source port, `query --flow` names the node the connection
// landed on, and the node holding it says so; its "if one node failed"
// answer for node3 names where 1,000 other flows land once node3 is down;
// with node3 down, the answers again match where connections land.
func TestE2EQueryFlow(t *testing.T) {
	l := upLab(t, 3)
	const flows = 1000
	ports := func(base int) []int {
		p := make([]int, flows)
		for i := range p {
			p[i] = base + i // below the ephemeral range: nothing else uses them
		}
		return p
	}
	ask := func(node string, port int, peers bool) control.Flow {
		t.Helper()
		q := url.Values{"client": {fmt.Sprintf("%s:%d", l.Client.Addr, port)}, "to": {l.VIP.String() + ":80/tcp"}}
		if !peers {
			q.Set("peers", "0")
		}
		var f control.Flow
		if err := client(t, l, node).Do(context.Background(), "GET", "/v1/flow?"+q.Encode(), nil, &f); err != nil {
			t.Fatalf("flow from port %d: %v", port, err)
		}
		return f
	}

	// The prediction for the second phase, made while node3 is up.
	predicted := map[int]string{}
	for _, p := range ports(22000) {
		f := ask("node2", p, false)
		predicted[p] = f.IfDown["node3"]
	}

	conns := dialFromPorts(t, l, ports(20000))
	landed := map[string]int{}
	for i, c := range conns {
		if err := c.get(l.VIP.String()); err != nil {
			t.Fatalf("flow %d: %v", i, err)
		}
		landed[c.node]++
	}
	t.Logf("%d flows landed: %v", flows, landed)
	wrong := 0
	for i, c := range conns {
		port := 20000 + i
		peers := i < 20 // every node's own answer for some, while the connection is open
		f := ask("node1", port, peers)
		if f.Owner != c.node || f.Rule != 1 || !f.Converged {
			wrong++
			if wrong <= 5 {
				t.Errorf("flow from port %d: owner %q (rule %d, converged %v), landed on %q", port, f.Owner, f.Rule, f.Converged, c.node)
			}
		}
		if peers {
			for _, n := range f.Nodes {
				holds := n.Name == c.node
				if n.Error != "" || n.HoldsFlow != holds || (holds && !n.BucketHeld) || (holds && n.State != "owned" && n.State != "owned_dirty") {
					t.Errorf("flow from port %d (on %s): %s says %+v", port, c.node, n.Name, n)
				}
			}
		}
		c.c.Close()
	}
	if wrong > 0 {
		t.Errorf("%d of %d flows landed elsewhere than query --flow said", wrong, flows)
	}

	// One node down.
	stopAgent(t, l, "node3", syscall.SIGTERM)
	poll(t, 10*time.Second, "node1 and node2 cover every bucket", func() error { return covered(l, "node1", "node2") })
	conns = dialFromPorts(t, l, ports(22000))
	wrong, mispredicted := 0, 0
	for i, c := range conns {
		port := 22000 + i
		if err := c.get(l.VIP.String()); err != nil {
			t.Fatalf("flow %d with node3 down: %v", i, err)
		}
		f := ask("node1", port, false)
		if f.Owner != c.node {
			wrong++
			if wrong <= 5 {
				t.Errorf("node3 down: flow from port %d: owner %q, landed on %q", port, f.Owner, c.node)
			}
		}
		if predicted[port] != c.node {
			mispredicted++
			if mispredicted <= 5 {
				t.Errorf("flow from port %d: predicted %q if node3 failed, landed on %q", port, predicted[port], c.node)
			}
		}
		c.c.Close()
	}
	if wrong+mispredicted > 0 {
		t.Errorf("node3 down: %d of %d flows landed elsewhere than query --flow said, %d elsewhere than predicted", wrong, flows, mispredicted)
	}

	// The CLI prints the same answer.
	out := mustShoal(t, l, "node2", "query", "--flow", fmt.Sprintf("%s:%d", l.Client.Addr, 22000), l.VIP.String()+":80/tcp")
	if want := fmt.Sprintf("owner     %s ", predicted[22000]); !strings.Contains(out, want) {
		t.Errorf("query --flow output lacks %q:\n%s", want, out)
	}
}

// dialFromPorts opens one connection to the VIP from each source port,
// from the client namespace, closed when the test ends.
func dialFromPorts(t *testing.T, l *lab.Lab, ports []int) []*heldConn {
	t.Helper()
	conns := dialVIP(t, l, ports)
	t.Cleanup(func() {
		for _, c := range conns {
			c.c.Close()
		}
	})
	return conns
}
