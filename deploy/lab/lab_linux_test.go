package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalnet/shoal/internal/netnstest"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// needRoot skips a test that builds namespaces when it cannot.
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the lab builds network namespaces: run as root")
	}
	if _, err := ip(context.Background(), "netns", "list"); err != nil {
		t.Skipf("iproute2 unusable: %v", err)
	}
}

// upForTest builds a lab without agents whose binary is this test binary,
// and removes it in t.Cleanup whatever happens.
func upForTest(t testing.TB, nodes int) *Lab {
	t.Helper()
	return upForTestFamily(t, nodes, Family4)
}

// upLab starts a lab of opts in a temporary directory and removes it in
// t.Cleanup, whatever happens.
func upLab(ctx context.Context, t *testing.T, opts Options) *Lab {
	t.Helper()
	opts.Base = t.TempDir()
	l, err := Up(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Down(context.Background()); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	return l
}

// upForTestFamily is upForTest for a lab of a family.
func upForTestFamily(t testing.TB, nodes int, family Family) *Lab {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(helperEnv, "1") // inherited by the processes the lab starts
	l, err := Up(context.Background(), Options{Nodes: nodes, NoAgents: true, Binary: self, Base: t.TempDir(), Family: family})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Down(context.Background()); err != nil {
			t.Errorf("Down: %v", err)
		}
		assertGone(t, l.ID)
	})
	return l
}

// assertGone fails if anything of lab id is left: namespaces or files.
func assertGone(t testing.TB, id string) {
	t.Helper()
	out, err := ip(context.Background(), "netns", "list")
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range parseNetnsList(out) {
		if strings.HasPrefix(ns, id+"-") {
			t.Errorf("namespace %s left behind", ns)
		}
	}
}

// ping sends one ICMP (ICMPv6) echo to dst from inside ns and waits for
// the reply.
func ping(t testing.TB, ns string, dst netip.Addr) error {
	return netnstest.Do(t, ns, func() error {
		network, laddr, proto := "ip4:icmp", "0.0.0.0", 1
		var echo, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
		if dst.Is6() {
			network, laddr, proto = "ip6:ipv6-icmp", "::", 58
			echo, reply = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
		}
		c, err := icmp.ListenPacket(network, laddr)
		if err != nil {
			return err
		}
		defer c.Close()
		id := os.Getpid() & 0xffff
		msg := icmp.Message{Type: echo, Body: &icmp.Echo{ID: id, Seq: 1, Data: []byte("shoal-lab")}}
		b, err := msg.Marshal(nil)
		if err != nil {
			return err
		}
		if _, err := c.WriteTo(b, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 1500)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return fmt.Errorf("no echo reply from %s: %w", dst, err)
			}
			m, err := icmp.ParseMessage(proto, buf[:n])
			if err != nil || m.Type != reply || from.String() != dst.String() {
				continue
			}
			if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id {
				return nil
			}
		}
	})
}

func TestTopology(t *testing.T) {
	for _, f := range []Family{Family4, Family6} {
		t.Run("family "+string(f), func(t *testing.T) { testTopology(t, f) })
	}
}

// testTopology: the namespaces, links and addresses of a lab of family f;
// the client reaches the nodes (over IPv6 in family 6), their HTTP server
// and loses a node whose plug is pulled; Down removes it all.
func testTopology(t *testing.T, family Family) {
	needRoot(t)
	l := upForTestFamily(t, 2, family)
	// addr is the address the client reaches a host on.
	addr := func(h Host) netip.Addr {
		if family == Family6 {
			return h.Addr6
		}
		return h.Addr
	}

	// Namespaces and links.
	out, err := ip(context.Background(), "netns", "list")
	if err != nil {
		t.Fatal(err)
	}
	have := parseNetnsList(out)
	for _, ns := range []string{l.Switch, l.Client.Namespace, l.Nodes[0].Namespace, l.Nodes[1].Namespace} {
		if !slices.Contains(have, ns) {
			t.Errorf("namespace %s missing from %v", ns, have)
		}
	}
	for _, h := range append([]Host{l.Client}, l.Nodes...) {
		out, err := ip(context.Background(), "-n", l.Switch, "-o", "link", "show", h.BridgePort)
		if err != nil || !strings.Contains(out, "master "+Bridge) || !strings.Contains(out, "state UP") {
			t.Errorf("bridge port %s: %q %v", h.BridgePort, out, err)
		}
		out, err = ip(context.Background(), "-n", h.Namespace, "-o", "addr", "show", "dev", Interface)
		if err != nil || !strings.Contains(out, h.Addr.String()+"/24") {
			t.Errorf("%s: address %s missing: %q %v", h.Name, h.Addr, out, err)
		}
		if family == Family6 && (!strings.Contains(out, h.Addr6.String()+"/64") || strings.Contains(out, "tentative")) {
			t.Errorf("%s: ipv6 address %s missing or tentative: %q", h.Name, h.Addr6, out)
		}
		out, err = ip(context.Background(), "-n", h.Namespace, "-o", "link", "show", "lo")
		if err != nil || !strings.Contains(out, "LOOPBACK,UP") {
			t.Errorf("%s: lo not up: %q %v", h.Name, out, err)
		}
	}

	// The client reaches the nodes over the bridge.
	for _, n := range l.Nodes {
		if err := ping(t, l.Client.Namespace, addr(n)); err != nil {
			t.Errorf("ping %s from the client: %v", n.Name, err)
		}
	}

	// A node's HTTP server, started as the lab starts it, answers the client.
	n := l.Nodes[0]
	p, err := l.Start(n.Name, "serve", "lab", "serve", "--name", n.Name, "--listen", netip.AddrPortFrom(addr(n), 80).String())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() error {
		if !alive(p) {
			return errors.New("serve exited: " + tail(p.Log, 400))
		}
		return netnstest.Do(t, l.Client.Namespace, func() error {
			c, err := net.DialTimeout("tcp", netip.AddrPortFrom(addr(n), 80).String(), time.Second)
			if err == nil {
				c.Close()
			}
			return err
		})
	})
	res, err := l.Load(context.Background(), LoadArgs{URL: URL(addr(n)), Duration: 300 * time.Millisecond, Concurrency: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests == 0 || res.Failures != 0 || res.ByNode[n.Name] != res.Successes {
		t.Errorf("load from the client: %d requests, %d failures, by node %v", res.Requests, res.Failures, res.ByNode)
	}

	// A pulled plug cuts the node off; plugging it back restores it.
	if err := l.Pull(context.Background(), n.Name); err != nil {
		t.Fatal(err)
	}
	if err := ping(t, l.Client.Namespace, addr(n)); err == nil {
		t.Errorf("%s answers with its plug pulled", n.Name)
	}
	if err := ping(t, l.Client.Namespace, addr(l.Nodes[1])); err != nil {
		t.Errorf("%s unreachable after pulling %s: %v", l.Nodes[1].Name, n.Name, err)
	}
	if err := l.Plug(context.Background(), n.Name); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() error { return ping(t, l.Client.Namespace, addr(n)) })

	// Status sees it all.
	st := l.Status(context.Background())
	for ns, up := range st.NamespaceUp {
		if !up {
			t.Errorf("status: namespace %s missing", ns)
		}
	}
	if !st.ProcAlive[p.PID] {
		t.Errorf("status: serve pid %d not alive", p.PID)
	}

	// Down stops the server too.
	if err := l.Down(context.Background()); err != nil {
		t.Fatal(err)
	}
	if alive(p) {
		t.Errorf("serve pid %d survived Down", p.PID)
	}
	assertGone(t, l.ID)
	if _, err := os.Stat(StatePath(l.Base, l.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state file left: %v", err)
	}
	if _, err := os.Stat(l.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("work dir left: %v", err)
	}
}

// TestUpFailsHalfway: a failure while building removes what was built.
func TestUpFailsHalfway(t *testing.T) {
	needRoot(t)
	var made []string
	testHookNamespace = func(ns string) error {
		if len(made) == 2 {
			return errors.New("injected failure")
		}
		made = append(made, ns)
		return nil
	}
	t.Cleanup(func() { testHookNamespace = nil })
	base := t.TempDir()
	_, err := Up(context.Background(), Options{Nodes: 2, NoAgents: true, Binary: "/bin/false", Base: base})
	if err == nil || !strings.Contains(err.Error(), "injected failure") {
		t.Fatalf("Up = %v, want the injected failure", err)
	}
	if len(made) != 2 {
		t.Fatalf("made %v before the failure", made)
	}
	id, _ := labOfNamespace(made[0])
	assertGone(t, id)
	if _, err := os.Stat(StatePath(base, id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state file left: %v", err)
	}
}

// TestDownAfterCrash: a lab whose state file is lost (a crash) is still
// removed, found by its namespace prefix, processes included.
func TestDownAfterCrash(t *testing.T) {
	needRoot(t)
	l := upForTest(t, 1)
	p, err := l.Start("node1", "serve", "lab", "serve", "--name", "node1", "--listen", l.Nodes[0].Addr.String()+":80")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(StatePath(l.Base, l.ID)); err != nil {
		t.Fatal(err)
	}
	ids, err := List(l.Base)
	if err != nil || !slices.Contains(ids, l.ID) {
		t.Fatalf("List = %v %v, want it to find %s by its namespaces", ids, err, l.ID)
	}
	orphan, err := Open(l.Base, l.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := orphan.Down(context.Background()); err != nil {
		t.Fatal(err)
	}
	assertGone(t, l.ID)
	waitFor(t, 5*time.Second, func() error {
		if alive(p) {
			return fmt.Errorf("serve pid %d still running", p.PID)
		}
		return nil
	})
}

// waitFor polls check until it returns nil or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, check func() error) {
	t.Helper()
	if err := Poll(context.Background(), timeout, 20*time.Millisecond, check); err != nil {
		t.Fatal(err)
	}
}

func TestSignal(t *testing.T) {
	needRoot(t)
	l := upForTest(t, 1)
	p, err := l.Start("node1", "serve", "lab", "serve", "--name", "node1", "--listen", l.Nodes[0].Addr.String()+":80")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Signal("node1", "agent", syscall.SIGKILL); err == nil {
		t.Error("Signal found an agent in a lab without agents")
	}
	if err := l.Signal("node1", "serve", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Exited(p):
	case <-time.After(5 * time.Second):
		t.Fatal("serve still running after SIGKILL")
	}
	if err := l.Signal("node1", "serve", syscall.SIGKILL); err == nil {
		t.Error("Signal found a dead process")
	}
}

// TestUpLeavesOthersNamespaces: a namespace that already exists under a
// lab's name (another lab that drew the same id) makes Up fail, and Up's
// cleanup must not delete it.
func TestUpLeavesOthersNamespaces(t *testing.T) {
	needRoot(t)
	var taken string
	testHookNamespace = func(ns string) error {
		if taken == "" && strings.HasSuffix(ns, "-client") {
			taken = ns
			if _, err := ip(context.Background(), "netns", "add", ns); err != nil {
				return err
			}
			t.Cleanup(func() { ip(context.Background(), "netns", "del", ns) })
		}
		return nil
	}
	t.Cleanup(func() { testHookNamespace = nil })
	_, err := Up(context.Background(), Options{Nodes: 1, NoAgents: true, Binary: "/bin/false", Base: t.TempDir()})
	if err == nil {
		t.Fatal("Up succeeded over an existing namespace")
	}
	out, err := ip(context.Background(), "netns", "list")
	if err != nil {
		t.Fatal(err)
	}
	have := parseNetnsList(out)
	if !slices.Contains(have, taken) {
		t.Errorf("Up's cleanup deleted %s, which it did not make", taken)
	}
	id, _ := labOfNamespace(taken)
	for _, ns := range have {
		if strings.HasPrefix(ns, id+"-") && ns != taken {
			t.Errorf("namespace %s left behind", ns)
		}
	}
}
