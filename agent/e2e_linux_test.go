package agent_test

// End-to-end tests: real agents in a lab of network namespaces (deploy/lab),
// driven through the CLI and the control API, with traffic from the lab's
// client. They need root; CI runs them for real.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/deploy/lab"
	"github.com/shoalnet/shoal/deploy/lab/load"
	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/internal/netnstest"
)

var shoalBin string

func TestMain(m *testing.M) {
	flag.Parse()
	code := func() int {
		if os.Geteuid() == 0 && !testing.Short() && os.Getenv(envPageURL) == "" { // the status page's browser half needs no binary
			dir, err := os.MkdirTemp("", "shoal-e2e-")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer os.RemoveAll(dir)
			shoalBin = filepath.Join(dir, "shoal")
			out, err := exec.Command("go", "build", "-o", shoalBin, "github.com/shoalnet/shoal/cmd/shoal").CombinedOutput()
			if err != nil {
				fmt.Fprintf(os.Stderr, "build shoal: %v\n%s", err, out)
				return 1
			}
		}
		return m.Run()
	}()
	os.Exit(code)
}

// upLab builds a lab of n nodes with the default port rule (tcp 80,
// multiple hosts, affinity none) and removes it when the test ends.
func upLab(t *testing.T, n int) *lab.Lab {
	t.Helper()
	return upLabWith(t, lab.Options{Nodes: n})
}

// families are the VIP families the end-to-end tests that matter most run
// in: an IPv4 lab and an IPv6 one.
var families = []lab.Family{lab.Family4, lab.Family6}

// forFamilies runs test once per family, as subtests "ipv4" and "ipv6".
func forFamilies(t *testing.T, test func(t *testing.T, f lab.Family)) {
	for _, f := range families {
		t.Run("ipv"+string(f), func(t *testing.T) { test(t, f) })
	}
}

// clientAddr is the client's address in the VIP's family.
func clientAddr(l *lab.Lab) netip.Addr {
	if l.VIP.Is6() {
		return l.Client.Addr6
	}
	return l.Client.Addr
}

// vipCounter counts, with an nftables counter in the client namespace, the
// TCP packets the client sends to the VIP (TCP only: neighbour discovery to
// an IPv6 VIP is not the VIP's traffic). The table goes with the test.
func vipCounter(t *testing.T, l *lab.Lab) func() uint64 {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nftables' nft (apt-get install nftables; .ci/run installs it)")
	}
	nft := func(script string) (string, error) {
		cmd := exec.Command("ip", "netns", "exec", l.Client.Namespace, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("nft: %v: %s", err, out)
		}
		return string(out), nil
	}
	fam := "ip"
	if l.VIP.Is6() {
		fam = "ip6"
	}
	const table = "shoal_e2e_acct"
	if _, err := nft(fmt.Sprintf("table inet %s {\n counter vip {}\n chain out {\n  type filter hook output priority 0; policy accept;\n  %s daddr %s meta l4proto tcp counter name vip\n }\n}\n", table, fam, l.VIP)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nft("delete table inet " + table) })
	return func() uint64 {
		t.Helper()
		out, err := nft("list counter inet " + table + " vip")
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(out[strings.Index(out, "packets"):])
		n, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			t.Fatalf("nft counter %q: %v", out, err)
		}
		return n
	}
}

// upLabWith is upLab with more options.
// labServer is the web server of the labs that do not name one; the
// planned-change tests run Apache, nginx and a dual-stack server always.
var labServer = flag.String("server", "", "the web server of the end-to-end labs that do not name one: builtin, dualstack, nginx or apache")

func upLabWith(t *testing.T, o lab.Options) *lab.Lab {
	t.Helper()
	if o.Server == "" {
		o.Server = lab.Server(*labServer)
	}
	if os.Geteuid() != 0 {
		t.Skip("end-to-end lab tests need root (network namespaces, XDP)")
	}
	if testing.Short() {
		t.Skip("end-to-end lab tests are skipped in -short mode")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("end-to-end lab tests need iproute2's ip")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o.Binary, o.Base = shoalBin, t.TempDir()
	if dir := os.Getenv("SHOAL_TEST_LOGS"); dir != "" && o.KeepLogs == "" {
		// A failed test's logs, whole (SHOAL_LOG_LEVEL=debug: each step
		// of a handoff), kept by the lab's Down.
		o.KeepLogs = filepath.Join(dir, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
	}
	l, err := lab.Up(ctx, o)
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range l.Procs {
				if p.Role == "agent" {
					b, _ := os.ReadFile(p.Log)
					t.Logf("%s agent log (tail):\n%s", p.Host, tailString(string(b), 3000))
				}
			}
		} else {
			l.KeepLogs = ""
		}
		if err := l.Down(context.Background()); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	return l
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func node(t *testing.T, l *lab.Lab, name string) lab.Host {
	t.Helper()
	h, ok := l.HostByName(name)
	if !ok {
		t.Fatalf("no host %s", name)
	}
	return h
}

func client(t *testing.T, l *lab.Lab, name string) *control.Client {
	return control.NewClient(node(t, l, name).Socket)
}

// shoal runs the CLI against a node and returns its output and exit code.
func shoal(t *testing.T, l *lab.Lab, name string, args ...string) (string, int) {
	t.Helper()
	return shoalEnv(t, l, name, nil, args...)
}

// shoalEnv is shoal with env added to the CLI's environment.
func shoalEnv(t *testing.T, l *lab.Lab, name string, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(shoalBin, append([]string{"--socket", node(t, l, name).Socket}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		t.Fatalf("shoal %v: %v", args, err)
	}
	return string(out), 0
}

func mustShoal(t *testing.T, l *lab.Lab, name string, args ...string) string {
	t.Helper()
	out, code := shoal(t, l, name, args...)
	if code != 0 {
		t.Fatalf("shoal %s: exit %d: %s", strings.Join(args, " "), code, out)
	}
	return out
}

// poll calls check until it returns nil or the timeout passes.
func poll(t *testing.T, timeout time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// covered returns nil when the named nodes are converged on a view of
// exactly them and together accept every bucket of every rule, each once.
func covered(l *lab.Lab, names ...string) error {
	total := map[filter.RuleID]int{}
	var eligible int
	for _, name := range names {
		h, _ := l.HostByName(name)
		st, err := control.NewClient(h.Socket).Status(context.Background())
		if err != nil {
			return err
		}
		if !st.Converged {
			return fmt.Errorf("%s not converged", name)
		}
		eligible = len(st.View.Eligible)
		for id, n := range st.Accepting {
			total[id] += n
		}
	}
	if eligible != len(names) {
		return fmt.Errorf("view has %d nodes, want %d", eligible, len(names))
	}
	if len(total) == 0 {
		return fmt.Errorf("no bucket accepted")
	}
	for id, n := range total {
		if n != filter.NumBuckets {
			return fmt.Errorf("rule %d: %d buckets accepted in all, want %d", id, n, filter.NumBuckets)
		}
	}
	return nil
}

// proc returns the lab process of a role on a host.
func proc(t *testing.T, l *lab.Lab, host, role string) lab.Proc {
	t.Helper()
	for i := len(l.Procs) - 1; i >= 0; i-- {
		if p := l.Procs[i]; p.Host == host && p.Role == role {
			return p
		}
	}
	t.Fatalf("no %s process on %s", role, host)
	return lab.Proc{}
}

// stopAgent signals a node's agent and waits for it to exit.
func stopAgent(t *testing.T, l *lab.Lab, host string, sig syscall.Signal) {
	t.Helper()
	p := proc(t, l, host, "agent")
	if err := syscall.Kill(p.PID, sig); err != nil {
		t.Fatalf("signal %s agent: %v", host, err)
	}
	select {
	case <-l.Exited(p):
	case <-time.After(15 * time.Second):
		t.Fatalf("%s agent did not exit after %v", host, sig)
	}
}

func startAgent(t *testing.T, l *lab.Lab, host string) {
	t.Helper()
	if _, err := l.Start(host, "agent", "agent", "--config", node(t, l, host).Config); err != nil {
		t.Fatal(err)
	}
}

// netstat reads a counter from /proc/net/snmp or /proc/net/netstat in a
// namespace, e.g. Ip OutRequests, TcpExt TCPSynRetrans.
func netstat(t *testing.T, ns, group, field string) uint64 {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/proc/net/snmp", "/proc/net/netstat").Output()
	if err != nil {
		t.Fatalf("read /proc/net/snmp and netstat in %s: %v", ns, err)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		g, rest, ok := strings.Cut(line, ": ")
		if !ok || g != group {
			continue
		}
		if names == nil {
			names = strings.Fields(rest)
			continue
		}
		for i, v := range strings.Fields(rest) {
			if names[i] == field {
				n, _ := strconv.ParseUint(v, 10, 64)
				return n
			}
		}
	}
	t.Fatalf("no %s %s in /proc/net/snmp or netstat", group, field)
	return 0
}

// packets returns a node's data-plane totals: accepted and dropped.
// packetCounts are a node's packet counters over every rule: the frames
// from the clients it judged (accepted, dropped, handed over to another
// node: out), and the SYNs other nodes handed over to it (taken: in, and
// refused).
type packetCounts struct{ accepted, dropped, out, in, refused uint64 }

func handCounts(t *testing.T, l *lab.Lab, name string) packetCounts {
	t.Helper()
	var p control.Params
	if err := client(t, l, name).Do(context.Background(), "GET", "/v1/params", nil, &p); err != nil {
		t.Fatal(err)
	}
	var c packetCounts
	for _, pc := range p.Packets {
		c.accepted += pc.Accepted
		for _, n := range pc.Dropped {
			c.dropped += n
		}
		c.out, c.in, c.refused = c.out+pc.Handed["out"], c.in+pc.Handed["in"], c.refused+pc.Handed["refused"]
	}
	return c
}

func loadRun(t *testing.T, l *lab.Lab, a lab.LoadArgs) load.Result {
	t.Helper()
	r, err := l.Load(context.Background(), a, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func checkShare(t *testing.T, r load.Result, want map[string]float64, tol float64) {
	t.Helper()
	for name, w := range want {
		got := float64(r.ByNode[name]) / float64(r.Successes)
		if got < w-tol || got > w+tol {
			t.Errorf("%s served %.1f%% of requests, want %.1f%% +- %.0f", name, 100*got, 100*w, 100*tol)
		}
	}
}

// TestE2EBalanceAndPacketAccounting: requests on new connections all
// succeed, equal weights split them evenly, weights 100/50/0 are followed,
// and every packet the client sends to the VIP is accepted by exactly one
// node: the nodes' XDP counters add up to the client's own count. For an
// IPv4 and an IPv6 VIP.
func TestE2EBalanceAndPacketAccounting(t *testing.T) {
	forFamilies(t, testBalanceAndPacketAccounting)
}

func testBalanceAndPacketAccounting(t *testing.T, family lab.Family) {
	l := upLabWith(t, lab.Options{Nodes: 3, Family: family})
	sentToVIP := vipCounter(t, l)
	if mac, err := l.Neighbor(context.Background(), l.VIP.String()); err != nil || mac != "" && mac != lab.ClusterMAC(l.VIP) {
		t.Errorf("client's ARP entry for the VIP: %q (%v), want the cluster MAC %s", mac, err, lab.ClusterMAC(l.VIP))
	}
	phase := func(name string, want map[string]float64) {
		t.Run(name, func(t *testing.T) {
			// Buckets that moved (as nodes joined, or weights changed)
			// drain first: until then a packet of a connection that is
			// gone is taken by no node.
			if err := l.WaitSettled(context.Background(), 10*time.Second); err != nil {
				t.Fatalf("no bucket draining or taken dirty: %v", err)
			}
			sent0 := sentToVIP()
			c0 := map[string]packetCounts{}
			for _, n := range l.Nodes {
				c0[n.Name] = handCounts(t, l, n.Name)
			}
			r := loadRun(t, l, lab.LoadArgs{Duration: 5 * time.Second, Concurrency: 8, Timeout: 3 * time.Second})
			if r.Failures != 0 || r.Successes < 3000 {
				t.Errorf("%d of %d requests failed (%v); want 0 failed of at least 3000", r.Failures, r.Requests, r.Errors)
			}
			checkShare(t, r, want, 0.05)
			mac, _ := l.Neighbor(context.Background(), l.VIP.String())
			if mac != lab.ClusterMAC(l.VIP) {
				t.Errorf("client resolved the VIP to %q, want the cluster MAC %s", mac, lab.ClusterMAC(l.VIP))
			}
			// Let the last FINs and ACKs land, then count.
			// Every node judges each frame once (accepts, drops or hands
			// it over); each is taken by exactly one node, itself or the
			// one it was handed to; and every SYN handed over arrives.
			var sent, accepted, out, in uint64
			poll(t, 5*time.Second, "packet counts settle", func() error {
				sent = sentToVIP() - sent0
				accepted, out, in = 0, 0, 0
				var refused uint64
				for _, n := range l.Nodes {
					c, b := handCounts(t, l, n.Name), c0[n.Name]
					accepted += c.accepted - b.accepted + c.in - b.in
					out, in, refused = out+c.out-b.out, in+c.in-b.in, refused+c.refused-b.refused
					if seen := c.accepted - b.accepted + c.dropped - b.dropped + c.out - b.out; seen != sent {
						return fmt.Errorf("%s judged %d packets, the client sent %d", n.Name, seen, sent)
					}
				}
				if accepted != sent {
					return fmt.Errorf("nodes took %d packets in all (%d of them handed over), the client sent %d", accepted, in, sent)
				}
				if in+refused != out {
					return fmt.Errorf("%d SYNs handed over, %d taken and %d refused where they went", out, in, refused)
				}
				return nil
			})
			t.Logf("client sent %d packets to the VIP; the nodes took %d in all, %d of them SYNs handed over (%d handed over)", sent, accepted, in, out)
		})
	}
	phase("equal weights", map[string]float64{"node1": 1.0 / 3, "node2": 1.0 / 3, "node3": 1.0 / 3})

	for name, w := range map[string]string{"node1": "100", "node2": "50", "node3": "0"} {
		mustShoal(t, l, "node1", "weight", "set", "1", name, w)
	}
	poll(t, 10*time.Second, "converge on the new weights", func() error {
		if err := covered(l, "node1", "node2", "node3"); err != nil {
			return err
		}
		st, err := client(t, l, "node3").Status(context.Background())
		if err != nil {
			return err
		}
		if st.Accepting[1] != 0 {
			return fmt.Errorf("node3 still accepts %d buckets of rule 1", st.Accepting[1])
		}
		return nil
	})
	phase("weights 100-50-0", map[string]float64{"node1": 2.0 / 3, "node2": 1.0 / 3, "node3": 0})

	// `shoal simulate` names the node a real connection lands on.
	// Source ports below the ephemeral range, so the load generator holds none.
	for port := 21000; port < 21010; port++ {
		flow := netip.AddrPortFrom(clientAddr(l), uint16(port)).String()
		out := mustShoal(t, l, "node2", "simulate", "--json", flow, netip.AddrPortFrom(l.VIP, 80).String())
		var sim control.Simulation
		if err := json.Unmarshal([]byte(out), &sim); err != nil {
			t.Fatalf("simulate --json: %v: %s", err, out)
		}
		c := dialFromClientPort(t, l, 1, port)[0]
		if err := c.get(vipHost(l)); err != nil {
			t.Fatal(err)
		}
		c.c.Close()
		if c.node != sim.Owner || sim.Rule != 1 {
			t.Errorf("flow %s: simulate says rule %d owner %q, the connection landed on %q", flow, sim.Rule, sim.Owner, c.node)
		}
	}
}

// heldConn is a long-lived keep-alive HTTP connection from the client,
// driven by hand so that a broken connection is seen, never silently
// replaced as an HTTP client library would.
type heldConn struct {
	c     net.Conn
	br    *bufio.Reader
	node  string // the node that served its first request
	moved string // a later request served by another node
	err   error
	n     int
}

func (h *heldConn) get(host string) error {
	h.c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintf(h.c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host); err != nil {
		return err
	}
	resp, err := http.ReadResponse(h.br, nil)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	node := resp.Header.Get(load.NodeHeader)
	switch {
	case h.node == "":
		h.node = node
	case node != h.node:
		h.moved = node
	}
	h.n++
	return nil
}

// vipHost is the VIP as an HTTP Host header names it.
func vipHost(l *lab.Lab) string {
	if l.VIP.Is6() {
		return "[" + l.VIP.String() + "]"
	}
	return l.VIP.String()
}

// dialFromClient opens n connections to the VIP from the client namespace.
// A socket belongs to the namespace of the thread that creates it, so the
// dialing goroutine is pinned to a thread moved into the client namespace.
// dialUntilNode3 opens keep-alive connections from the client to the VIP,
// 30 at a time, each with a first request, until at least n are on node3
// (at most 600 in all).
func dialUntilNode3(t *testing.T, l *lab.Lab, n int) []*heldConn {
	t.Helper()
	var conns []*heldConn
	for len(byNode(conns)["node3"]) < 50 {
		if len(conns) > 600 {
			t.Fatalf("600 connections opened, only %d on node3", len(byNode(conns)["node3"]))
		}
		batch := dialFromClient(t, l, 30)
		for _, c := range batch {
			if err := c.get(vipHost(l)); err != nil {
				t.Fatal(err)
			}
		}
		conns = append(conns, batch...)
	}
	return conns
}

// startLoad runs l.Load with args from the client in the background and
// returns once the load has started; wait returns its result. A load that
// fails, or ends before it starts, ends the test.
func startLoad(ctx context.Context, t *testing.T, l *lab.Lab, args lab.LoadArgs) (wait func() load.Result) {
	t.Helper()
	type out struct {
		r   load.Result
		err error
	}
	started := make(chan struct{})
	done := make(chan out, 1)
	args.OnStart = func() { close(started) }
	go func() {
		r, err := l.Load(ctx, args, nil)
		done <- out{r, err}
	}()
	select {
	case <-started:
	case o := <-done:
		t.Fatalf("the load ended before it started: %v", o.err)
	}
	return func() load.Result {
		t.Helper()
		o := <-done
		if o.err != nil {
			t.Fatalf("load: %v", o.err)
		}
		return o.r
	}
}

func dialFromClient(t *testing.T, l *lab.Lab, n int) []*heldConn {
	t.Helper()
	return dialFromClientPort(t, l, n, 0)
}

// dialFromClientPort is dialFromClient from a given source port (0: any).
func dialFromClientPort(t *testing.T, l *lab.Lab, n, port int) []*heldConn {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		ports[i] = port
	}
	return dialVIP(t, l, ports)
}

// dialVIP opens one connection to the VIP's port 80 from the client
// namespace for each source port (0: any).
func dialVIP(t *testing.T, l *lab.Lab, ports []int) []*heldConn {
	t.Helper()
	var conns []*heldConn
	err := inClientNamespace(t, l, func() error {
		for _, port := range ports {
			d := net.Dialer{Timeout: 3 * time.Second}
			if port != 0 {
				d.LocalAddr = &net.TCPAddr{Port: port}
			}
			c, err := d.Dial("tcp", net.JoinHostPort(l.VIP.String(), "80"))
			if err != nil {
				return fmt.Errorf("from port %d: %w", port, err)
			}
			conns = append(conns, &heldConn{c: c, br: bufio.NewReader(c)})
		}
		return nil
	})
	if err != nil {
		for _, c := range conns {
			c.c.Close()
		}
		t.Fatalf("dial the VIP from the client: %v", err)
	}
	return conns
}

// holder keeps held connections busy: one request on each every interval.
type holder struct {
	conns []*heldConn
	stop  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
}

func hold(t *testing.T, l *lab.Lab, conns []*heldConn, every time.Duration) *holder {
	h := &holder{conns: conns, stop: make(chan struct{})}
	for _, c := range conns {
		if err := c.get(vipHost(l)); err != nil {
			t.Fatalf("first request on a held connection: %v", err)
		}
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				select {
				case <-h.stop:
					return
				case <-tick.C:
				}
				if err := c.get(vipHost(l)); err != nil {
					h.mu.Lock()
					c.err = err
					h.mu.Unlock()
					return
				}
			}
		}()
	}
	t.Cleanup(func() { h.close() })
	return h
}

func (h *holder) close() {
	select {
	case <-h.stop:
	default:
		close(h.stop)
	}
	h.wg.Wait()
	for _, c := range h.conns {
		c.c.Close()
	}
}

// check reports every held connection that broke or moved.
func (h *holder) check(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	broken := 0
	for i, c := range h.conns {
		if c.err != nil || c.moved != "" {
			broken++
			if broken <= 5 {
				t.Errorf("held connection %d (on %s, %d requests): error %v, moved to %q", i, c.node, c.n, c.err, c.moved)
			}
		}
	}
	if broken > 0 {
		t.Errorf("%d of %d long-lived connections broke", broken, len(h.conns))
	}
}

func byNode(conns []*heldConn) map[string][]*heldConn {
	m := map[string][]*heldConn{}
	for _, c := range conns {
		m[c.node] = append(m[c.node], c)
	}
	return m
}

// TestE2EDrainstop: a node with 50 long-lived connections is drained while
// new requests keep coming: no request fails, no connection is reset, its
// connections finish on it, new ones go elsewhere, and drainstop returns
// when they are gone with the node stopped. For an IPv4 and an IPv6 VIP.
func TestE2EDrainstop(t *testing.T) {
	forFamilies(t, testDrainstop)
}

func testDrainstop(t *testing.T, family lab.Family) {
	l := upLabWith(t, lab.Options{Nodes: 3, Family: family})
	conns := dialUntilNode3(t, l, 50)
	h := hold(t, l, conns, 100*time.Millisecond)
	onNode3 := byNode(conns)["node3"]
	t.Logf("%d long-lived connections, %d on node3", len(conns), len(onNode3))

	waitLoad := startLoad(context.Background(), t, l, lab.LoadArgs{Duration: 8 * time.Second, Concurrency: 4, Timeout: 5 * time.Second})
	loadStart := time.Now() // the load's timeline counts from its start
	time.Sleep(time.Second)
	drainStart := time.Since(loadStart)
	type result struct {
		out  string
		code int
	}
	drained := make(chan result, 1)
	go func() {
		out, code := shoal(t, l, "node3", "drainstop", "--timeout", "60s")
		drained <- result{out, code}
	}()
	// While its connections are open the node keeps draining.
	poll(t, 5*time.Second, "node3 draining with its connections", func() error {
		st, err := client(t, l, "node3").Status(context.Background())
		if err != nil {
			return err
		}
		if st.Admin != "draining" || st.Connections < len(onNode3) {
			return fmt.Errorf("node3 is %s with %d connections", st.Admin, st.Connections)
		}
		return nil
	})
	time.Sleep(3 * time.Second)
	select {
	case r := <-drained:
		t.Fatalf("drainstop returned while connections were open: exit %d: %s", r.code, r.out)
	default:
	}
	// The node3 connections finish; the others stay open.
	for _, c := range onNode3 {
		c.c.SetDeadline(time.Now()) // interrupts the holder's next request cleanly
	}
	h.mu.Lock()
	for _, c := range onNode3 {
		c.c.Close()
	}
	h.mu.Unlock()
	var r result
	select {
	case r = <-drained:
	case <-time.After(20 * time.Second):
		t.Fatal("drainstop did not return after the node's connections closed")
	}
	if r.code != 0 || !strings.Contains(r.out, "stopped after") {
		t.Errorf("drainstop: exit %d: %s", r.code, r.out)
	}
	st, err := client(t, l, "node3").Status(context.Background())
	if err != nil || st.Admin != "stopped" {
		t.Errorf("node3 after drainstop: %+v, %v; want stopped", st, err)
	}
	res := waitLoad()
	if res.Failures != 0 {
		t.Errorf("%d of %d new-connection requests failed during the drain: %v %v", res.Failures, res.Requests, res.Errors, res.FailureList)
	}
	// New connections left node3 once the cluster converged on the drain.
	late := 0
	for _, s := range res.Timeline {
		if time.Duration(s.AtMS*float64(time.Millisecond)) > drainStart+2*time.Second {
			late += s.ByNode["node3"]
		}
	}
	if late != 0 {
		t.Errorf("node3 took %d new connections more than 2 s after drainstop began", late)
	}
	// Every connection not on node3 lived on; those on node3 were served
	// by node3 until they closed.
	h.close()
	h.mu.Lock()
	for _, c := range onNode3 {
		c.err = nil // closed by the test itself
	}
	h.mu.Unlock()
	h.check(t)
}

// TestE2EJoinWeightLeaveKeepConnections: a node joining, a weight change
// and another node leaving break none of the established connections. For
// an IPv4 and an IPv6 VIP.
func TestE2EJoinWeightLeaveKeepConnections(t *testing.T) {
	forFamilies(t, testJoinWeightLeaveKeepConnections)
}

func testJoinWeightLeaveKeepConnections(t *testing.T, family lab.Family) {
	l := upLabWith(t, lab.Options{Nodes: 3, Family: family})
	stopAgent(t, l, "node3", syscall.SIGTERM)
	poll(t, 10*time.Second, "two nodes cover every bucket", func() error { return covered(l, "node1", "node2") })

	h := hold(t, l, dialFromClient(t, l, 60), 100*time.Millisecond)
	waitLoad := startLoad(context.Background(), t, l, lab.LoadArgs{Duration: 6 * time.Second, Concurrency: 4, Timeout: 5 * time.Second})

	startAgent(t, l, "node3") // joins again
	poll(t, 20*time.Second, "three nodes cover every bucket", func() error { return covered(l, "node1", "node2", "node3") })
	mustShoal(t, l, "node2", "weight", "set", "1", "node1", "100")
	poll(t, 10*time.Second, "converge on the new weight", func() error {
		st, err := client(t, l, "node1").Status(context.Background())
		if err != nil {
			return err
		}
		if st.Accepting[1] < filter.NumBuckets/2-10 {
			return fmt.Errorf("node1 accepts %d buckets of rule 1", st.Accepting[1])
		}
		return covered(l, "node1", "node2", "node3")
	})
	res := waitLoad()
	if res.Failures != 0 {
		t.Errorf("%d of %d new-connection requests failed during join and weight change: %v", res.Failures, res.Requests, res.Errors)
	}
	if res.ByNode["node3"] == 0 {
		t.Error("the node that joined served no new connection")
	}
	// node3 holds none of the held connections (they were opened without
	// it), so it leaving must break none of them.
	stopAgent(t, l, "node3", syscall.SIGTERM)
	poll(t, 10*time.Second, "two nodes cover every bucket", func() error { return covered(l, "node1", "node2") })
	time.Sleep(500 * time.Millisecond)
	h.close()
	h.check(t)
}

// TestE2EKill9: an agent killed with SIGKILL takes its XDP program and
// multicast membership with it; the survivors cover its buckets and the
// dead node's kernel takes nothing of the VIP's traffic.
func TestE2EKill9(t *testing.T) {
	l := upLab(t, 3)
	node3 := node(t, l, "node3")
	stopAgent(t, l, "node3", syscall.SIGKILL)
	killed := time.Now()
	poll(t, 10*time.Second, "survivors cover every bucket", func() error { return covered(l, "node1", "node2") })
	t.Logf("survivors own every bucket %v after the kill", time.Since(killed).Round(time.Millisecond))

	r := loadRun(t, l, lab.LoadArgs{Duration: 2 * time.Second, Concurrency: 8, Timeout: 3 * time.Second})
	if r.Failures != 0 || r.ByNode["node3"] != 0 {
		t.Errorf("after the kill: %d of %d requests failed (%v), node3 served %d", r.Failures, r.Requests, r.Errors, r.ByNode["node3"])
	}
	// Its web server still listens on the VIP, but its kernel, without XDP
	// to rewrite the cluster MAC, takes no VIP connection.
	out, err := exec.Command("ip", "netns", "exec", node3.Namespace, "ss", "-Htn", "state", "all", "sport", "= :80").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line != "" && !strings.HasPrefix(line, "LISTEN") {
			t.Errorf("the killed node holds a VIP connection: %s", line)
		}
	}
}

// TestE2ERulePropagation: a rule added through one node reaches every
// node's data plane within 250 ms (p99 over 20 rules).
func TestE2ERulePropagation(t *testing.T) {
	l := upLab(t, 3)
	var lat []time.Duration
	node2 := client(t, l, "node2")
	for i := 0; i < 20; i++ {
		// Through the control API, as `shoal rules add` does, so that the
		// CLI's process start is not counted.
		start := time.Now()
		req := control.RuleRequest{VIP: l.VIP.String(), Ports: fmt.Sprint(8000 + i), Proto: "tcp"}
		if err := node2.Do(context.Background(), "POST", "/v1/rules", req, nil); err != nil {
			t.Fatal(err)
		}
		st, err := node2.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		idx := st.RulesIndex
		poll(t, 5*time.Second, "every data plane has the rule", func() error {
			for _, n := range l.Nodes {
				st, err := control.NewClient(n.Socket).Status(context.Background())
				if err != nil {
					return err
				}
				if st.TablesIndex < idx {
					return fmt.Errorf("%s data plane at rules index %d, want %d", n.Name, st.TablesIndex, idx)
				}
			}
			return nil
		})
		lat = append(lat, time.Since(start))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p50, p99 := lat[len(lat)/2], lat[len(lat)-1]
	t.Logf("rule add -> every node's data plane: p50 %v, p99 %v (n=%d)", p50, p99, len(lat))
	if p99 > 250*time.Millisecond {
		t.Errorf("rule propagation p99 %v, want <= 250ms", p99)
	}
}

// TestE2ETeardown: the agent's exit leaves no VIP, sysctl change,
// multicast membership or data-plane program (XDP or tc) behind.
func TestE2ETeardown(t *testing.T) {
	l := upLab(t, 2)
	h := node(t, l, "node2")
	cmac := lab.ClusterMAC(l.VIP)
	state := func() (vip, mcast, prog bool, arpIgnore, arpAnnounce string) {
		run := func(args ...string) string {
			out, err := exec.Command("ip", append([]string{"-n", h.Namespace}, args...)...).CombinedOutput()
			if err != nil {
				t.Fatalf("ip %v: %v: %s", args, err, out)
			}
			return string(out)
		}
		sysctl := func(name string) string {
			out, err := exec.Command("ip", "netns", "exec", h.Namespace, "cat", "/proc/sys/net/ipv4/conf/"+lab.Interface+"/"+name).Output()
			if err != nil {
				t.Fatal(err)
			}
			return strings.TrimSpace(string(out))
		}
		attached := func() bool {
			var m filter.AttachMode
			if err := netnstest.Do(t, h.Namespace, func() (err error) { m, err = filter.Attached(lab.Interface); return err }); err != nil {
				t.Fatal(err)
			}
			return m != filter.AttachNone
		}
		return strings.Contains(run("addr", "show", "dev", "lo"), l.VIP.String()+"/32"),
			strings.Contains(run("maddr", "show", "dev", lab.Interface), cmac),
			attached(), sysctl("arp_ignore"), sysctl("arp_announce")
	}
	vip, mcast, xdp, ign, ann := state()
	if !vip || !mcast || !xdp || ign != "1" || ann != "2" {
		t.Fatalf("running agent: vip on lo %v, cluster mac joined %v, xdp %v, arp_ignore %s, arp_announce %s; want all set", vip, mcast, xdp, ign, ann)
	}
	stopAgent(t, l, "node2", syscall.SIGTERM)
	vip, mcast, xdp, ign, ann = state()
	if vip || mcast || xdp || ign != "0" || ann != "0" {
		t.Errorf("after exit: vip on lo %v, cluster mac joined %v, xdp %v, arp_ignore %s, arp_announce %s; want none left", vip, mcast, xdp, ign, ann)
	}
}

// TestE2EParallelStart: every agent starting at the same instant, as at a
// data centre's power-on, still converges. (Agents once missed the rules
// applied between their registration and the start of their loop, and one
// start in four never converged.)
func TestE2EParallelStart(t *testing.T) {
	for i := 0; i < 3; i++ {
		l := upLabWith(t, lab.Options{Nodes: 3, ParallelStart: true})
		poll(t, 10*time.Second, "three nodes cover every bucket", func() error { return covered(l, "node1", "node2", "node3") })
		if err := l.Down(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}
