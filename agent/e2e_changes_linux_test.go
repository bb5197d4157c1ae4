package agent_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/deploy/lab"
	"github.com/shoalnet/shoal/deploy/lab/load"
)

// plannedServers are the servers TestE2EPlannedChanges runs against: each
// holds its connections in other sockets (see lab.Server).
var plannedServers = []lab.Server{lab.ServerApache, lab.ServerDualStack, lab.ServerNginx}

// plannedChange is one planned change: do makes it through the CLI and
// returns once it is made; the case then waits until the nodes named by
// settled have applied it and together cover every bucket.
type plannedChange struct {
	name    string
	do      func(t *testing.T, l *lab.Lab)
	settled []string
}

// TestE2EPlannedChanges makes every planned change in turn on one 3-node
// lab per server type, each under long-lived keep-alive connections (a
// request on each every 100 ms) and new-connection load (2 s client
// timeout): a weight change, a new hash seed, editing the port rule's
// ports and affinity, removing the rule (its traffic goes to the default host),
// adding a rule for every VIP, adding a rule for the VIP over it, drainstop,
// join and leave. Each must break no established connection and fail no
// request; drainstop must return only once the drained node's connections
// have closed, and no request may wait for a SYN retransmission (a SYN
// that fell where no node took it).
func TestE2EPlannedChanges(t *testing.T) {
	all := []string{"node1", "node2", "node3"}
	vipPort := func(l *lab.Lab) string { return l.VIP.String() + ":80" }
	changes := []plannedChange{
		{"weight", func(t *testing.T, l *lab.Lab) {
			mustShoal(t, l, "node2", "weight", "set", vipPort(l), "node1", "100")
		}, all},
		// With affinity none the client's connections spread over many
		// buckets; affinity single (client IP) then puts them all in one.
		{"hash seed", func(t *testing.T, l *lab.Lab) {
			mustShoal(t, l, "node1", "settings", "set", "--hash-seed", "424242")
		}, all},
		{"rule ports", func(t *testing.T, l *lab.Lab) {
			mustShoal(t, l, "node1", "rules", "set", "--ports", "80-81", vipPort(l))
		}, all},
		{"rule affinity", func(t *testing.T, l *lab.Lab) {
			mustShoal(t, l, "node1", "rules", "set", "--affinity", "single", vipPort(l))
		}, all},
		{"rule remove", func(t *testing.T, l *lab.Lab) {
			mustShoal(t, l, "node1", "rules", "remove", vipPort(l))
		}, all},
		{"rule for every vip", func(t *testing.T, l *lab.Lab) {
			mustShoal(t, l, "node1", "rules", "add", "--vip", "all", "--ports", "80", "--affinity", "none")
		}, all},
		{"rule for the vip over it", func(t *testing.T, l *lab.Lab) {
			mustShoal(t, l, "node1", "rules", "add", "--vip", l.VIP.String(), "--ports", "80", "--affinity", "none")
		}, all},
		{"drainstop", nil, []string{"node1", "node2"}},
		{"join", func(t *testing.T, l *lab.Lab) {
			mustShoal(t, l, "node1", "start", "--node", "node3")
		}, all},
		{"leave", nil, []string{"node1", "node2"}},
	}
	for _, server := range plannedServers {
		t.Run(string(server), func(t *testing.T) {
			l := upLabWith(t, lab.Options{Nodes: 3, Server: server})
			for _, c := range changes {
				ok := t.Run(c.name, func(t *testing.T) {
					switch c.name {
					case "drainstop":
						runDrainstop(t, l)
					case "leave":
						runLeave(t, l)
					default:
						runChange(t, l, c)
					}
				})
				if !ok {
					return // the later changes build on this one
				}
			}
		})
	}
}

// heldCount is how many long-lived connections each case holds.
const heldCount = 24

// underLoad runs change while heldCount keep-alive connections are held
// and new-connection load runs, then checks that no held connection broke
// and no request failed. change returns the held connections it closed
// itself (they do not count as broken).
func underLoad(t *testing.T, l *lab.Lab, change func(h *holder) []*heldConn) {
	t.Helper()
	h := hold(t, l, dialFromClient(t, l, heldCount), 100*time.Millisecond)
	type out struct {
		res load.Result
		err error
	}
	started := make(chan struct{})
	var startedAt time.Time
	done := make(chan out, 1)
	go func() {
		r, err := l.Load(context.Background(), lab.LoadArgs{
			Duration: 4 * time.Second, Concurrency: 4, Timeout: 2 * time.Second,
			OnStart: func() { startedAt = time.Now(); close(started) },
		}, nil)
		done <- out{r, err}
	}()
	select {
	case <-started:
	case o := <-done:
		t.Fatalf("the load ended before it started: %v", o.err)
	}
	time.Sleep(500 * time.Millisecond) // traffic before the change
	changeFrom := time.Since(startedAt)
	closed := change(h)
	changeTo := time.Since(startedAt)
	o := <-done
	h.close()
	h.mu.Lock()
	for _, c := range closed {
		c.err, c.moved = nil, ""
	}
	h.mu.Unlock()
	h.check(t)
	if o.err != nil {
		t.Fatal(o.err)
	}
	r := o.res
	t.Logf("%d held connections (%d requests on them); new connections: %d requests, %d failed, %d delayed by a SYN retransmission, connect p99 %.1f ms, by node %v",
		len(h.conns), heldRequests(h), r.Requests, r.Failures, r.Delayed, r.ConnectP99MS, r.ByNode)
	if r.Failures != 0 || r.Requests == 0 {
		t.Errorf("%d of %d new-connection requests failed: %v %v", r.Failures, r.Requests, r.Errors, r.FailureList)
	}
	if r.Delayed != 0 {
		t.Errorf("%d of %d new-connection requests waited for a SYN retransmission: a SYN fell where no node took it (the change ran %.0f-%.0f ms into the load): %+v",
			r.Delayed, r.Requests, changeFrom.Seconds()*1000, changeTo.Seconds()*1000, r.DelayedList)
	}
}

func heldRequests(h *holder) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.conns {
		n += c.n
	}
	return n
}

// rulesIndex is node1's rules index: after a CLI command through node1
// returns, the index the change was applied at or later.
func rulesIndex(t *testing.T, l *lab.Lab) uint64 {
	t.Helper()
	st, err := client(t, l, "node1").Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st.RulesIndex
}

// waitApplied waits until the named nodes' data planes hold rules index
// idx or later and together they cover every bucket.
func waitApplied(t *testing.T, l *lab.Lab, idx uint64, names []string) {
	t.Helper()
	poll(t, 15*time.Second, "the change applied everywhere", func() error {
		for _, name := range names {
			st, err := client(t, l, name).Status(context.Background())
			if err != nil {
				return err
			}
			if st.TablesIndex < idx {
				return fmt.Errorf("%s data plane at rules index %d, want %d", name, st.TablesIndex, idx)
			}
		}
		return covered(l, names...)
	})
}

func runChange(t *testing.T, l *lab.Lab, c plannedChange) {
	underLoad(t, l, func(*holder) []*heldConn {
		c.do(t, l)
		waitApplied(t, l, rulesIndex(t, l), c.settled)
		return nil
	})
}

// runDrainstop drains node3 while it holds some of the connections: the
// node keeps them and counts them, drainstop does not return while they
// are open, and returns with the node stopped once they close.
func runDrainstop(t *testing.T, l *lab.Lab) {
	underLoad(t, l, func(h *holder) []*heldConn {
		on3 := byNode(h.conns)["node3"]
		if len(on3) == 0 {
			t.Fatalf("none of %d held connections is on node3", len(h.conns))
		}
		type result struct {
			out  string
			code int
		}
		drained := make(chan result, 1)
		go func() {
			out, code := shoal(t, l, "node1", "drainstop", "--node", "node3", "--timeout", "60s")
			drained <- result{out, code}
		}()
		poll(t, 5*time.Second, "node3 draining, counting its connections", func() error {
			st, err := client(t, l, "node3").Status(context.Background())
			if err != nil {
				return err
			}
			if st.Admin != "draining" || st.Connections < len(on3) {
				return fmt.Errorf("node3 is %s with %d connections, want draining with %d or more", st.Admin, st.Connections, len(on3))
			}
			return nil
		})
		// A bounded look for a wrong early return.
		select {
		case r := <-drained:
			t.Fatalf("drainstop returned while node3 held %d connections: exit %d: %s", len(on3), r.code, r.out)
		case <-time.After(1500 * time.Millisecond):
		}
		h.mu.Lock()
		for _, c := range on3 {
			c.c.Close() // the holder's next request on it fails: not a break
		}
		h.mu.Unlock()
		select {
		case r := <-drained:
			if r.code != 0 || !strings.Contains(r.out, "stopped after") {
				t.Errorf("drainstop: exit %d: %s", r.code, r.out)
			}
		case <-time.After(15 * time.Second):
			st, err := client(t, l, "node3").Status(context.Background())
			t.Fatalf("drainstop did not return after node3's connections closed: node3 %+v (%v)", st, err)
		}
		if st, err := client(t, l, "node3").Status(context.Background()); err != nil || st.Admin != "stopped" {
			t.Errorf("node3 after drainstop: %s, %v; want stopped", st.Admin, err)
		}
		waitApplied(t, l, rulesIndex(t, l), []string{"node1", "node2"})
		return on3
	})
}

// runLeave drains node3 (its share of the held connections closed first,
// as an operator's drainstop would wait for) and takes it out of the
// cluster with `shoal leave`: the registry shrinks, so buckets move between
// the nodes that stay, under their connections.
//
// node3 is drained before the load starts: the drainstop case measures a
// drain under load. A drain that ends within a scan of its start (node3
// holding nothing) can still stop the node under a connection whose
// handshake the last scan did not see (1 request timed out in 2 of 2 CI
// runs): an open defect, written up in docs/BENCHMARKS.md.
func runLeave(t *testing.T, l *lab.Lab) {
	mustShoal(t, l, "node1", "drainstop", "--node", "node3", "--timeout", "20s")
	waitApplied(t, l, rulesIndex(t, l), []string{"node1", "node2"})
	underLoad(t, l, func(h *holder) []*heldConn {
		on3 := byNode(h.conns)["node3"]
		if len(on3) > 0 {
			t.Errorf("%d held connections on the stopped node3", len(on3))
		}
		mustShoal(t, l, "node3", "leave")
		poll(t, 15*time.Second, "node3 out of the registry", func() error {
			var q control.Query
			if err := client(t, l, "node1").Do(context.Background(), "GET", "/v1/query", nil, &q); err != nil {
				return err
			}
			for _, n := range q.Nodes {
				if n.Name == "node3" {
					return fmt.Errorf("node3 still registered (%s)", n.Admin)
				}
			}
			return nil
		})
		waitApplied(t, l, rulesIndex(t, l), []string{"node1", "node2"})
		return on3
	})
}
