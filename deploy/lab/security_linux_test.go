package lab

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"github.com/shoalnet/shoal/internal/netnstest"
	"github.com/shoalnet/shoal/peer"
)

// TestSecurityCaptureReplayFlood runs a 3-node lab and, from the switch
// and the client as someone on the LAN would:
//   - captures every frame of a forwarded write (peer API) and its Raft
//     replication: no cleartext HTTP or Raft, every stream is TLS;
//   - replays each captured client stream to its server, from the client
//     and from a member's own address: no rule, index or view changes;
//   - floods the Raft, peer and metrics ports with junk and idle
//     connections: no view change, every agent's memory stays bounded, and
//     the refusals are counted.
func TestSecurityCaptureReplayFlood(t *testing.T) {
	l, ctx := upSecurityLab(t)

	// Capture on every node's switch port while node3 adds a rule: the
	// write goes to the leader over the peer API and out over Raft.
	capt := startCapture(t, l)
	if err := l.ctl.AddRule(ctx, l.Nodes[2].Socket, l.VIP.String(), 8080); err != nil {
		t.Fatalf("add a rule through node3: %v", err)
	}
	settled(ctx, t, l)
	// The attack of issue 12: a drill's plug request, captured. It is sent
	// on a fresh connection, so the capture holds the whole handshake, and
	// asks for 25 s: a replay that worked would show.
	node3Peer := netip.AddrPortFrom(l.Nodes[2].Addr, PeerPort).String()
	plug(t, l, node3Peer, true, 25*time.Second)
	plug(t, l, node3Peer, false, 0)
	before := settled(ctx, t, l)
	flows := capt.stop()

	var raftFlows, peerFlows int
	for k, f := range flows {
		switch k.dport {
		case RaftPort:
			raftFlows++
		case PeerPort:
			peerFlows++
		default:
			continue
		}
		if capt.syn[k] && len(f) > 1 && (f[0] != 0x16 || f[1] != 0x03) {
			t.Errorf("%v: the client's first bytes %x are not a TLS handshake record", k, f[:min(len(f), 8)])
		}
	}
	for k, f := range flows {
		if k.sport != RaftPort && k.sport != PeerPort && k.dport != RaftPort && k.dport != PeerPort {
			continue
		}
		for _, marker := range []string{"HTTP/1.1", "POST ", "/v1/", "application/json", "RaftAddr", "Entries", "LeaderCommitIndex", "ClusterID"} {
			if bytes.Contains(f, []byte(marker)) {
				t.Errorf("%v carries %q in cleartext", k, marker)
			}
		}
	}
	t.Logf("captured %d streams: %d to raft ports, %d to peer ports", len(flows), raftFlows, peerFlows)
	if raftFlows == 0 || peerFlows == 0 {
		t.Fatalf("captured %d raft and %d peer client streams; want both (the capture saw nothing?)", raftFlows, peerFlows)
	}

	// Replay every captured client stream, from the client and from node2
	// (a member's registered address), watching the views meanwhile.
	fresh := 0
	for k := range flows {
		if capt.syn[k] && (k.dport == RaftPort || k.dport == PeerPort) {
			fresh++
		}
	}
	if fresh == 0 {
		t.Fatal("captured no connection from its start")
	}
	stopWatch := watchHosts(ctx, t, l, l.Nodes, func(s []NodeStatus) string { return diffStatus(before, s) })
	for _, from := range []Host{l.Client, l.Nodes[1]} {
		for k, f := range flows {
			if k.dport != RaftPort && k.dport != PeerPort {
				continue
			}
			if err := replay(nsDialer(t, from.Namespace), k.dst, f); err != nil {
				t.Fatalf("replay %v from %s: %v", k, from.Name, err)
			}
		}
	}
	time.Sleep(time.Second) // a replayed pull would take the node out within a second
	if n := stopWatch(); n != 0 {
		t.Errorf("%d status samples during the replay differed from before it", n)
	}
	after := settled(ctx, t, l)
	if diff := diffStatus(before, after); diff != "" {
		t.Errorf("replaying captured streams changed the cluster: %s", diff)
	}

	// Flood every TCP listener from the client for a bounded time while
	// watching the views.
	rss0 := agentRSS(t, l)
	stopWatch = watchHosts(ctx, t, l, l.Nodes, func(s []NodeStatus) string { return diffStatus(before, s) })
	var targets []string
	for _, n := range l.Nodes {
		for _, p := range []int{RaftPort, PeerPort, MetricsPort} {
			targets = append(targets, netip.AddrPortFrom(n.Addr, uint16(p)).String())
		}
	}
	if err := flood(nsDialer(t, l.Client.Namespace), targets, 4*time.Second); err != nil {
		t.Fatalf("flood: %v", err)
	}
	if n := stopWatch(); n != 0 {
		t.Errorf("%d status samples during the flood differed from before it", n)
	}
	if diff := diffStatus(before, settled(ctx, t, l)); diff != "" {
		t.Errorf("after the flood: %s", diff)
	}
	rss1 := agentRSS(t, l)
	for host, kb := range rss1 {
		if grew := kb - rss0[host]; grew > 64<<10 {
			t.Errorf("%s: agent RSS grew by %d KiB during the flood (%d -> %d)", host, grew, rss0[host], kb)
		}
	}
	t.Logf("agent RSS before/after the flood (KiB): %v / %v", rss0, rss1)

	// The refusals are counted where an operator looks.
	metrics := scrapeMetrics(t, l, l.Nodes[0])
	for _, want := range []string{`shoal_refused_total{listener="raft",reason="unregistered_address"}`, `shoal_refused_total{listener="peer",reason="tls_handshake"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("node1's metrics lack %s", want)
		}
	}
}

// plug pulls or restores a node's plug from the client under the lab's
// key, as `shoal drill` does, on a fresh connection.
func plug(t *testing.T, l *Lab, peer string, pulled bool, restoreAfter time.Duration) {
	t.Helper()
	if err := plugRequest(t, l, l.KeyFile, peer, pulled, restoreAfter); err != nil {
		t.Fatalf("plug pulled=%v on %s: %v", pulled, peer, err)
	}
}

// plugRequest sends addr a plug request from the client, under the key
// in keyFile, on a fresh connection: pull the plug (and restore it after
// restoreAfter) or restore it (a no-op on a plugged node).
func plugRequest(t *testing.T, l *Lab, keyFile, addr string, pulled bool, restoreAfter time.Duration) error {
	t.Helper()
	key, err := readHexKey(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := peer.NewCerts(peer.TLSOptions{Name: "drill", Keys: [][]byte{key}})
	if err != nil {
		t.Fatal(err)
	}
	c := peer.NewClient(certs)
	c.Timeout = 10 * time.Second
	c.Transport.(*http.Transport).DialContext = nsDialer(t, l.Client.Namespace)
	defer c.CloseIdleConnections()
	body := fmt.Sprintf(`{"pulled":%v,"restore_after":%d}`, pulled, restoreAfter)
	resp, err := c.Post(peer.URL(addr, "/v1/peer/plug"), "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %s", resp.Status, msg)
	}
	return nil
}

func readHexKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return hex.DecodeString(strings.TrimSpace(string(b)))
}

// scrapeMetrics returns h's metrics page, scraped from the client.
func scrapeMetrics(t *testing.T, l *Lab, h Host) string {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: nsDialer(t, l.Client.Namespace)}}
	defer c.CloseIdleConnections()
	resp, err := c.Get(fmt.Sprintf("http://%s:%d/metrics", h.Addr, MetricsPort))
	if err != nil {
		t.Fatalf("scrape %s: %v", h.Name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", h.Name, err)
	}
	return string(b)
}

// settled waits for the lab to be converged and returns every node's
// status.
func settled(ctx context.Context, t *testing.T, l *Lab) []NodeStatus {
	t.Helper()
	var st []NodeStatus
	err := Poll(ctx, 20*time.Second, 50*time.Millisecond, func() error {
		var err error
		if st, err = l.Statuses(ctx, l.Nodes); err != nil {
			return err
		}
		if err := Ready(st, len(l.Nodes)); err != nil {
			return err
		}
		for _, s := range st[1:] {
			if s.RulesIndex != st[0].RulesIndex {
				return fmt.Errorf("rules index %d on %s, %d on %s", s.RulesIndex, s.NodeName, st[0].RulesIndex, st[0].NodeName)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("lab did not settle: %v", err)
	}
	return st
}

// diffStatus says how the nodes' views or rules differ, "" if they do not.
func diffStatus(a, b []NodeStatus) string {
	var d []string
	for i := range min(len(a), len(b)) {
		x, y := a[i], b[i]
		if !y.Converged {
			d = append(d, y.NodeName+" not converged")
		}
		if x.RulesIndex != y.RulesIndex {
			d = append(d, fmt.Sprintf("%s rules index %d -> %d", y.NodeName, x.RulesIndex, y.RulesIndex))
		}
		if !slices.Equal(x.View.Eligible, y.View.Eligible) {
			d = append(d, fmt.Sprintf("%s view %v -> %v", y.NodeName, x.View.Eligible, y.View.Eligible))
		}
	}
	return strings.Join(d, "; ")
}

// flowKey is one direction of a TCP connection.
type flowKey struct {
	src, dst     netip.AddrPort
	sport, dport int
}

func (k flowKey) String() string { return k.src.String() + "->" + k.dst.String() }

// sniffer reads the frames that cross some of the switch's ports.
type sniffer struct {
	handles []*pcapgo.EthernetHandle
	wg      sync.WaitGroup
}

// sniff reads the frames of ports in the switch namespace sw until stop
// (in t.Cleanup at the latest) and hands every IPv4 packet to keep, which
// runs on the readers' goroutines (one per port) and locks what it shares.
func sniff(t *testing.T, sw string, ports []string, keep func(ip4 *layers.IPv4, p gopacket.Packet)) *sniffer {
	t.Helper()
	s := &sniffer{}
	t.Cleanup(s.stop)
	for _, port := range ports {
		var h *pcapgo.EthernetHandle
		err := netnstest.Do(t, sw, func() error {
			var err error
			h, err = pcapgo.NewEthernetHandle(port)
			return err
		})
		if err != nil {
			t.Fatalf("capture on %s: %v", port, err)
		}
		s.handles = append(s.handles, h)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for {
				data, _, err := h.ReadPacketData()
				if err != nil {
					return
				}
				p := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.NoCopy)
				if ip4, _ := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ip4 != nil {
					keep(ip4, p)
				}
			}
		}()
	}
	return s
}

// stop closes the ports and waits for their readers; again, it does
// nothing.
func (s *sniffer) stop() {
	for _, h := range s.handles {
		h.Close()
	}
	s.handles = nil
	s.wg.Wait()
}

// capture keeps the TCP streams that cross every node's switch port.
type capture struct {
	mu       sync.Mutex
	segments map[flowKey]map[uint32][]byte // by sequence number
	syn      map[flowKey]bool              // the capture saw the flow start
	sn       *sniffer
}

func startCapture(t *testing.T, l *Lab) *capture {
	t.Helper()
	c := &capture{segments: map[flowKey]map[uint32][]byte{}, syn: map[flowKey]bool{}}
	var ports []string
	for _, n := range l.Nodes {
		ports = append(ports, n.BridgePort)
	}
	c.sn = sniff(t, l.Switch, ports, c.keep)
	return c
}

// keep adds a TCP segment to its stream.
func (c *capture) keep(ip4 *layers.IPv4, p gopacket.Packet) {
	tcp, _ := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
	if tcp == nil {
		return
	}
	src, _ := netip.AddrFromSlice(ip4.SrcIP)
	dst, _ := netip.AddrFromSlice(ip4.DstIP)
	k := flowKey{netip.AddrPortFrom(src, uint16(tcp.SrcPort)), netip.AddrPortFrom(dst, uint16(tcp.DstPort)), int(tcp.SrcPort), int(tcp.DstPort)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if tcp.SYN {
		c.syn[k] = true
	}
	if len(tcp.Payload) == 0 {
		return
	}
	if c.segments[k] == nil {
		c.segments[k] = map[uint32][]byte{}
	}
	c.segments[k][tcp.Seq] = bytes.Clone(tcp.Payload)
}

// stop ends the capture and returns each direction's bytes in sequence
// order (duplicates, seen on two ports, once).
func (c *capture) stop() map[flowKey][]byte {
	c.sn.stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[flowKey][]byte{}
	for k, segs := range c.segments {
		seqs := make([]uint32, 0, len(segs))
		for s := range segs {
			seqs = append(seqs, s)
		}
		slices.Sort(seqs)
		var b []byte
		for _, s := range seqs {
			b = append(b, segs[s]...)
		}
		out[k] = b
	}
	return out
}

// dialFunc dials from inside a namespace.
type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// nsDialer returns a dialer whose sockets are made inside namespace ns,
// from whatever goroutine calls it: the socket stays in ns. Nothing of the
// test may dial a lab address from the root namespace.
func nsDialer(t *testing.T, ns string) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := netnstest.Do(t, ns, func() error {
			var err error
			c, err = (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// replay sends a captured client stream to its server on a new connection
// and reads whatever comes back until the server closes or goes quiet.
func replay(dial dialFunc, dst netip.AddrPort, stream []byte) error {
	c, err := dial(context.Background(), "tcp", dst.String())
	if err != nil {
		return nil // refused outright is fine
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	c.Write(stream)
	io.Copy(io.Discard, c)
	return nil
}

// flood opens connections to every target for d: half send random junk
// and close, the rest connect and stay idle, as a slow client would.
func flood(dial dialFunc, targets []string, d time.Duration) error {
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	var held sync.Map
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			junk := make([]byte, 4096)
			for j := 0; time.Now().Before(deadline); j++ {
				c, err := dial(context.Background(), "tcp", targets[(i+j)%len(targets)])
				if err != nil {
					continue
				}
				if i%2 == 0 {
					rand.Read(junk)
					c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
					c.Write(junk)
					c.Close()
				} else if j < 40 {
					held.Store(c, true) // idle, held to the end
				} else {
					c.Close()
				}
			}
		}()
	}
	wg.Wait()
	held.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
	return nil
}

// agentRSS returns each agent's resident memory in KiB.
func agentRSS(t *testing.T, l *Lab) map[string]int {
	t.Helper()
	out := map[string]int{}
	for host, v := range agentProcStatus(t, l, "VmRSS") {
		out[host], _ = strconv.Atoi(strings.TrimSuffix(v, " kB"))
	}
	return out
}

// agentProcStatus returns, by host, the value of field (such as VmRSS or
// CapEff) in the /proc/PID/status of the host's agent; a field it lacks
// ends the test.
func agentProcStatus(t *testing.T, l *Lab, field string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range l.Procs {
		if p.Role != "agent" {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID))
		if err != nil {
			t.Fatalf("agent of %s: %v", p.Host, err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, field+":"); ok {
				out[p.Host] = strings.TrimSpace(v)
			}
		}
		if _, ok := out[p.Host]; !ok {
			t.Fatalf("agent of %s: no %s in /proc/%d/status", p.Host, field, p.PID)
		}
	}
	return out
}
