package agent_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/shoalnet/shoal/deploy/lab"
)

// TestE2EStallSIGSTOP: node3's agent is stopped with SIGSTOP for 3 s, then
// continued, under new-connection load and with long-lived connections
// busy, some on node3. Its data-plane lease ends before its peers declare
// it dead, so its XDP program takes no new connection while they take its
// buckets, and keeps serving the connections it holds; the peers take them
// dirty, leaving those connections to it. No packet is accepted by two
// nodes: the nodes' accepted packets add up to what the client sent, less
// the SYNs nobody took while the lease had ended and the peers had not yet
// taken over (each retransmitted: the client's TCPSynRetrans). A SYN that
// was taken but answered after the client's timer (or dropped by the
// listener) is counted twice by that sum; each such SYN shows on the nodes'
// kernels as a SYN-ACK sent again or a listen drop, so the sum may exceed
// what the client sent by no more than those. No request fails, no held
// connection breaks, and node3 is back in the cluster after.
func TestE2EStallSIGSTOP(t *testing.T) {
	l := upLab(t, 3)
	poll(t, 10*time.Second, "three nodes cover every bucket", func() error { return covered(l, "node1", "node2", "node3") })
	var conns []*heldConn
	for len(byNode(conns)["node3"]) < 5 {
		if len(conns) > 120 {
			t.Fatalf("120 connections, %d on node3", len(byNode(conns)["node3"]))
		}
		batch := dialFromClient(t, l, 10)
		for _, c := range batch {
			if err := c.get(l.VIP.String()); err != nil {
				t.Fatal(err)
			}
		}
		conns = append(conns, batch...)
	}
	sent0, syn0 := netstat(t, l.Client.Namespace, "Ip", "OutRequests"), netstat(t, l.Client.Namespace, "TcpExt", "TCPSynRetrans")
	acc0, late0 := map[string]uint64{}, map[string]uint64{}
	for _, n := range l.Nodes {
		c := handCounts(t, l, n.Name)
		acc0[n.Name] = c.accepted + c.in
		late0[n.Name] = answeredLate(t, n.Namespace)
	}
	h := hold(t, l, conns, 100*time.Millisecond)
	agentPID := proc(t, l, "node3", "agent").PID
	t.Cleanup(func() { syscall.Kill(agentPID, syscall.SIGCONT) })
	waitLoad := startLoad(context.Background(), t, l, lab.LoadArgs{Duration: 6 * time.Second, Concurrency: 4, Rate: 200, Timeout: 3 * time.Second})
	time.Sleep(500 * time.Millisecond)
	if err := syscall.Kill(agentPID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	poll(t, 5*time.Second, "node1 and node2 cover every bucket", func() error { return covered(l, "node1", "node2") })
	t.Logf("node1 and node2 own every bucket %v after node3's agent stopped", time.Since(stopped).Round(time.Millisecond))
	time.Sleep(time.Until(stopped.Add(3 * time.Second)))
	if err := syscall.Kill(agentPID, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	r := waitLoad()
	poll(t, 10*time.Second, "node3 back", func() error { return covered(l, "node1", "node2", "node3") })
	if st, err := client(t, l, "node3").Status(context.Background()); err != nil {
		t.Error(err)
	} else if st.Stalls != 1 {
		t.Errorf("node3 after SIGCONT: %d stalls, want 1", st.Stalls)
	}
	h.close()
	t.Logf("load: %d requests, %d failed, by node %v; %d held connections, %d on node3", r.Requests, r.Failures, r.ByNode, len(conns), len(byNode(conns)["node3"]))
	h.check(t)
	var sent, accepted, synRetrans, late uint64
	poll(t, 5*time.Second, "packet counts settle", func() error {
		sent = netstat(t, l.Client.Namespace, "Ip", "OutRequests") - sent0
		synRetrans = netstat(t, l.Client.Namespace, "TcpExt", "TCPSynRetrans") - syn0
		accepted, late = 0, 0
		for _, n := range l.Nodes {
			c := handCounts(t, l, n.Name)
			accepted += c.accepted + c.in - acc0[n.Name] // taken, handed over or not
			late += answeredLate(t, n.Namespace) - late0[n.Name]
		}
		if sum := accepted + synRetrans; sum < sent || sum > sent+late {
			return fmt.Errorf("nodes accepted %d packets in all, the client sent %d and retransmitted %d SYNs, the nodes answered %d SYNs late (more accepted: some twice; fewer: other packets nobody took)", accepted, sent, synRetrans, late)
		}
		return nil
	})
	t.Logf("client sent %d packets to the VIP, %d of them SYNs retransmitted; the nodes accepted %d in all and answered %d SYNs late", sent, synRetrans, accepted, late)
	if r.Failures != 0 {
		t.Errorf("%d of %d requests failed (%v)", r.Failures, r.Requests, r.Errors)
	}
}

// answeredLate counts, in a node's namespace, the SYNs its kernel took but
// did not answer in time: SYN-ACKs sent again (its TCPSynRetrans: for a
// SYN retransmitted by the client, or on its own timer) and SYNs the
// listener dropped.
func answeredLate(t *testing.T, ns string) uint64 {
	t.Helper()
	return netstat(t, ns, "TcpExt", "TCPSynRetrans") + netstat(t, ns, "TcpExt", "ListenDrops")
}
