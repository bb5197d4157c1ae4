package lab

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/shoalnet/shoal/internal/netnstest"
)

// upSecurityLab builds shoal and a 3-node lab, removed in t.Cleanup.
func upSecurityLab(t *testing.T) (*Lab, context.Context) {
	t.Helper()
	needRoot(t)
	if testing.Short() {
		t.Skip("builds shoal and a 3-node lab; skipped with -short")
	}
	bin := buildShoal(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return upLab(ctx, t, Options{Nodes: 3, Binary: bin}), ctx
}

// TestSecurityHeartbeatReplay captures node3's heartbeats on the switch,
// kills node3's agent and replays them from node3's own address and port
// (the address is on the LAN: anyone there can take it) and from the
// client: the survivors keep node3 out of their view and every bucket
// owned, and count the replays as rejected. Then node3 comes back (a new
// incarnation) and the same datagrams, replayed again, change nothing.
func TestSecurityHeartbeatReplay(t *testing.T) {
	l, ctx := upSecurityLab(t)
	node3 := l.Nodes[2]
	survivors := l.Nodes[:2]
	st := settled(ctx, t, l)
	node3ID := st[2].NodeID
	ruleIDs := RuleIDs(st)

	hb := startUDPCapture(t, l.Switch, node3.BridgePort, node3.Addr, HeartbeatPort)
	if err := Poll(ctx, 10*time.Second, 50*time.Millisecond, func() error {
		if n := hb.count(); n < 20 {
			return fmt.Errorf("captured %d heartbeats of node3", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	grams := hb.stop()
	t.Logf("captured %d heartbeats of node3", len(grams))

	if err := l.Signal(node3.Name, "agent", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var gone []NodeStatus
	if err := Poll(ctx, 10*time.Second, 50*time.Millisecond, func() error {
		var err error
		if gone, err = l.Statuses(ctx, survivors); err != nil {
			return err
		}
		return Covered(gone, ruleIDs, node3ID)
	}); err != nil {
		t.Fatalf("survivors did not take node3's buckets: %v", err)
	}

	// From node3's own address and heartbeat port, its agent dead, and
	// from the client; each captured datagram three times.
	rej0 := rejectedHeartbeats(t, l, survivors)
	stopWatch := watchHosts(ctx, t, l, survivors, func(s []NodeStatus) string {
		if d := diffStatus(gone, s); d != "" {
			return d
		}
		if err := Covered(s, ruleIDs, node3ID); err != nil {
			return err.Error()
		}
		return ""
	})
	fromNode3 := sendUDP(t, node3.Namespace, netip.AddrPortFrom(node3.Addr, HeartbeatPort), grams, 3)
	fromClient := sendUDP(t, l.Client.Namespace, netip.AddrPortFrom(l.Client.Addr, 0), grams, 3)
	time.Sleep(time.Second) // a replay that worked would bring node3 back well within this
	if n := stopWatch(); n != 0 {
		t.Errorf("%d survivor samples during the replay of a dead node's heartbeats differed", n)
	}
	rej1 := rejectedHeartbeats(t, l, survivors)
	t.Logf("replayed %d datagrams from node3's address, %d from the client; survivors' rejections %v -> %v", fromNode3, fromClient, rej0, rej1)
	assertRejected(t, survivors, rej0, rej1, fromNode3, grams)

	// node3 back: a new incarnation. The old datagrams are older still.
	if _, err := l.Start(node3.Name, "agent", "agent", "--config", node3.Config); err != nil {
		t.Fatal(err)
	}
	back := settled(ctx, t, l)
	if err := Ready(back, 3); err != nil {
		t.Fatal(err)
	}
	rej0 = rejectedHeartbeats(t, l, survivors)
	stopWatch = watchHosts(ctx, t, l, l.Nodes, func(s []NodeStatus) string { return diffStatus(back, s) })
	// node3's agent holds its heartbeat port now: send from another port
	// of its address.
	fromNode3 = sendUDP(t, node3.Namespace, netip.AddrPortFrom(node3.Addr, 0), grams, 3)
	fromClient = sendUDP(t, l.Client.Namespace, netip.AddrPortFrom(l.Client.Addr, 0), grams, 3)
	time.Sleep(time.Second)
	if n := stopWatch(); n != 0 {
		t.Errorf("%d samples during the replay after node3's restart differed", n)
	}
	rej1 = rejectedHeartbeats(t, l, survivors)
	// From another port than the registered one, the XDP filter drops them
	// before the agent sees them, so they are not in its counters.
	t.Logf("after node3's restart: replayed %d from node3's address (another port), %d from the client; rejections %v -> %v", fromNode3, fromClient, rej0, rej1)
}

// assertRejected checks that each survivor counted as rejected at least
// half of the replayed datagrams addressed to it (or to all: multicast).
func assertRejected(t *testing.T, survivors []Host, before, after map[string]float64, sentRounds int, grams []datagram) {
	t.Helper()
	rounds := sentRounds / max(len(grams), 1)
	for _, h := range survivors {
		want := 0
		for _, g := range grams {
			if g.dst.Addr() == h.Addr || g.dst.Addr().IsMulticast() {
				want += rounds
			}
		}
		if got := after[h.Name] - before[h.Name]; got < float64(want)/2 || want == 0 {
			t.Errorf("%s counted %v more rejected heartbeats; %d replays were addressed to it", h.Name, got, want)
		}
	}
}

// TestSecurityHeartbeatJunkFlood floods every node's heartbeat port for
// 3 s with random datagrams of random sizes, from the client and from
// node2's address, while the client opens a new connection per request
// to the VIP: no view change, no failed request, and the junk that
// reaches an agent (node2's to itself, over lo) is counted as rejected.
func TestSecurityHeartbeatJunkFlood(t *testing.T) {
	l, ctx := upSecurityLab(t)
	before := settled(ctx, t, l)
	rej0 := rejectedHeartbeats(t, l, l.Nodes)
	stopWatch := watchHosts(ctx, t, l, l.Nodes, func(s []NodeStatus) string { return diffStatus(before, s) })

	var targets []netip.AddrPort
	for _, n := range l.Nodes {
		targets = append(targets, netip.AddrPortFrom(n.Addr, HeartbeatPort))
	}
	var fromMember, fromClient atomic.Int64
	var wg sync.WaitGroup
	floodDone := make(chan struct{})
	res, err := l.Load(ctx, LoadArgs{Duration: 5 * time.Second, Concurrency: 4, Rate: 200, Timeout: 2 * time.Second, OnStart: func() {
		wg.Add(2)
		go func() { defer wg.Done(); fromMember.Store(junkUDP(t, l.Nodes[1].Namespace, targets, 3*time.Second)) }()
		go func() { defer wg.Done(); fromClient.Store(junkUDP(t, l.Client.Namespace, targets, 3*time.Second)) }()
		go func() { wg.Wait(); close(floodDone) }()
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-floodDone:
	case <-ctx.Done():
		t.Fatal("the flood did not end")
	}
	changes := stopWatch()
	rej1 := rejectedHeartbeats(t, l, l.Nodes)
	t.Logf("junk datagrams: %d from node2's address, %d from the client; load: %d requests, %d failures; %d view changes; rejections %v -> %v",
		fromMember.Load(), fromClient.Load(), res.Requests, res.Failures, changes, rej0, rej1)
	if changes != 0 {
		t.Errorf("%d status samples during the flood differed from before it", changes)
	}
	if res.Failures != 0 || res.Requests == 0 {
		t.Errorf("load to the VIP during the flood: %d requests, %d failures %v", res.Requests, res.Failures, res.Errors)
	}
	// Junk from node2's socket (not its registered heartbeat port) to the
	// others, and all the client's, is dropped by the XDP filter; what
	// node2 sends to its own listener goes over lo, past the filter, to
	// the agent, which rejects and counts it.
	if got := rej1[l.Nodes[1].Name] - rej0[l.Nodes[1].Name]; got < 100 {
		t.Errorf("node2 counted %v rejected heartbeats while its own address sent it junk", got)
	}
}

// TestSecurityKeyRotationUnderLoad runs the documented rotation
// (docs/SECURITY.md) on every node of a 3-node lab by editing each
// node's config and `shoal key reload`, while the client opens a new
// connection per request to the VIP: no failed request, no view change;
// afterwards a peer holding only the old key is refused and one holding
// the new key is not.
func TestSecurityKeyRotationUnderLoad(t *testing.T) {
	l, ctx := upSecurityLab(t)
	before := settled(ctx, t, l)
	oldKey := l.KeyFile
	newKey := filepath.Join(l.Dir, "cluster-new.key")
	var k [32]byte
	rand.Read(k[:])
	if err := os.WriteFile(newKey, []byte(hex.EncodeToString(k[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	steps := []struct {
		name    string
		primary string
		accept  []string
	}{
		{"1: accept the new key", oldKey, []string{newKey}},
		{"2: sign with the new key", newKey, []string{oldKey}},
		{"3: drop the old key", newKey, nil},
	}
	stopWatch := watchHosts(ctx, t, l, l.Nodes, func(s []NodeStatus) string { return diffStatus(before, s) })
	rotated := make(chan error, 1)
	var rotationTook time.Duration
	res, err := l.Load(ctx, LoadArgs{Duration: 15 * time.Second, Concurrency: 4, Rate: 200, Timeout: 2 * time.Second, OnStart: func() {
		go func() {
			start := time.Now()
			time.Sleep(time.Second) // load before the first step
			for _, s := range steps {
				for i := range l.Nodes {
					if err := reloadWith(ctx, t, l, i, s.primary, s.accept); err != nil {
						rotated <- fmt.Errorf("step %s: %w", s.name, err)
						return
					}
				}
				time.Sleep(time.Second) // heartbeats and connections under this step
			}
			rotationTook = time.Since(start)
			rotated <- nil
		}()
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-rotated:
		if err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatal("the rotation outlasted the load")
	}
	changes := stopWatch()
	t.Logf("rotation took %v under load: %d requests, %d failures, %d view changes", rotationTook.Round(time.Millisecond), res.Requests, res.Failures, changes)
	if res.Failures != 0 || res.Requests == 0 {
		t.Errorf("load during the rotation: %d requests, %d failures %v %v", res.Requests, res.Failures, res.Errors, res.FailureList)
	}
	if changes != 0 {
		t.Errorf("%d status samples during the rotation differed from before it", changes)
	}
	if d := diffStatus(before, settled(ctx, t, l)); d != "" {
		t.Errorf("after the rotation: %s", d)
	}

	// The old key alone is refused by every node; the new one is not.
	for _, n := range l.Nodes {
		peer := netip.AddrPortFrom(n.Addr, PeerPort).String()
		if err := plugRequest(t, l, oldKey, peer, false, 0); err == nil {
			t.Errorf("%s accepted a peer request under the old key after the rotation", n.Name)
		} else {
			t.Logf("%s refuses the old key: %v", n.Name, err)
		}
		if err := plugRequest(t, l, newKey, peer, false, 0); err != nil {
			t.Errorf("%s refused a peer request under the new key: %v", n.Name, err)
		}
	}
}

// reloadWith rewrites node i's config with primary and accept as its
// keys, runs `shoal key reload` and waits until the agent logs that it
// reloaded (and not that it failed to).
func reloadWith(ctx context.Context, t *testing.T, l *Lab, i int, primary string, accept []string) error {
	n := l.Nodes[i]
	c := l.AgentConfig(i, 0)
	c.KeyFile, c.AcceptKeyFiles = primary, accept
	b, err := c.Marshal()
	if err != nil {
		return err
	}
	if err := os.WriteFile(n.Config, b, 0o600); err != nil {
		return err
	}
	log := filepath.Join(l.Dir, n.Name+".agent.log")
	done0, failed0 := countLines(log, "cluster keys reloaded"), countLines(log, "keeping the ones in use")
	if _, err := l.CLI(ctx, n.Name, "key", "reload"); err != nil {
		return fmt.Errorf("%s: shoal key reload: %w", n.Name, err)
	}
	return Poll(ctx, 5*time.Second, 20*time.Millisecond, func() error {
		if countLines(log, "keeping the ones in use") > failed0 {
			return fmt.Errorf("%s failed to reload its keys: %s", n.Name, tail(log, 400))
		}
		if countLines(log, "cluster keys reloaded") == done0 {
			return fmt.Errorf("%s has not logged a reload", n.Name)
		}
		return nil
	})
}

func countLines(path, substr string) int {
	b, _ := os.ReadFile(path)
	return bytes.Count(b, []byte(substr))
}

// watchHosts samples hosts' status every 100 ms until stop, which returns
// how many samples differ says were wrong.
func watchHosts(ctx context.Context, t *testing.T, l *Lab, hosts []Host, differ func([]NodeStatus) string) (stop func() int64) {
	var changes atomic.Int64
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for wctx.Err() == nil {
			if st, err := l.Statuses(wctx, hosts); err == nil {
				if d := differ(st); d != "" {
					changes.Add(1)
					t.Logf("status differs: %s", d)
				}
			}
			select {
			case <-wctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() int64 { cancel(); <-done; return changes.Load() }
}

// rejectedHeartbeats returns, per host, the sum of its
// shoal_heartbeat_events_total{event="rejected_*"} counters, scraped from
// the client.
func rejectedHeartbeats(t *testing.T, l *Lab, hosts []Host) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, h := range hosts {
		for _, line := range strings.Split(scrapeMetrics(t, l, h), "\n") {
			if !strings.HasPrefix(line, `shoal_heartbeat_events_total{event="rejected_`) {
				continue
			}
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("%s: metric line %q: %v", h.Name, line, err)
			}
			out[h.Name] += v
		}
	}
	return out
}

// datagram is one captured UDP payload and where it went.
type datagram struct {
	dst     netip.AddrPort
	payload []byte
}

// udpCapture keeps the UDP datagrams from src to port that cross one
// switch port.
type udpCapture struct {
	mu    sync.Mutex
	grams []datagram
	sn    *sniffer
}

func startUDPCapture(t *testing.T, sw, bridgePort string, src netip.Addr, port int) *udpCapture {
	t.Helper()
	c := &udpCapture{}
	c.sn = sniff(t, sw, []string{bridgePort}, func(ip4 *layers.IPv4, p gopacket.Packet) {
		udp, _ := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if udp == nil || int(udp.DstPort) != port {
			return
		}
		s, _ := netip.AddrFromSlice(ip4.SrcIP)
		d, _ := netip.AddrFromSlice(ip4.DstIP)
		if s != src {
			return
		}
		c.mu.Lock()
		c.grams = append(c.grams, datagram{netip.AddrPortFrom(d, uint16(udp.DstPort)), bytes.Clone(udp.Payload)})
		c.mu.Unlock()
	})
	return c
}

func (c *udpCapture) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.grams)
}

func (c *udpCapture) stop() []datagram {
	c.sn.stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.grams
}

// sendUDP sends every datagram rounds times from a socket bound to from
// in namespace ns, and returns how many it sent.
func sendUDP(t *testing.T, ns string, from netip.AddrPort, grams []datagram, rounds int) int {
	t.Helper()
	var conn net.PacketConn
	err := netnstest.Do(t, ns, func() error {
		var err error
		conn, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(from))
		return err
	})
	if err != nil {
		t.Fatalf("udp socket at %v in %s: %v", from, ns, err)
	}
	defer conn.Close()
	sent := 0
	for range rounds {
		for _, g := range grams {
			if _, err := conn.WriteTo(g.payload, net.UDPAddrFromAddrPort(g.dst)); err != nil {
				t.Fatalf("replay to %v: %v", g.dst, err)
			}
			sent++
		}
		time.Sleep(100 * time.Millisecond)
	}
	return sent
}

// junkUDP sends random datagrams of random sizes (0 to 1472 bytes) to the
// targets from namespace ns for d, paced to ~2000 per second, and returns
// how many it sent.
func junkUDP(t *testing.T, ns string, targets []netip.AddrPort, d time.Duration) int64 {
	var conn net.PacketConn
	err := netnstest.Do(t, ns, func() error {
		var err error
		conn, err = net.ListenPacket("udp4", ":0")
		return err
	})
	if err != nil {
		t.Errorf("udp socket in %s: %v", ns, err)
		return 0
	}
	defer conn.Close()
	buf := make([]byte, 1472)
	var sent int64
	deadline := time.Now().Add(d)
	for i := 0; time.Now().Before(deadline); i++ {
		n, _ := rand.Int(rand.Reader, big.NewInt(int64(len(buf)+1)))
		b := buf[:n.Int64()]
		rand.Read(b)
		if _, err := conn.WriteTo(b, net.UDPAddrFromAddrPort(targets[i%len(targets)])); err == nil {
			sent++
		}
		if i%20 == 19 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	return sent
}
