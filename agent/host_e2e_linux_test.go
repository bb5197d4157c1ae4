package agent_test

// End-to-end tests of the host integration: fail-safe after kill -9, crash
// cleanup, link events under load.

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/shoalnet/shoal/deploy/lab"
	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/internal/netnstest"
)

// inClientNamespace runs f on a thread in the lab client's namespace:
// sockets f opens stay there.
func inClientNamespace(t *testing.T, l *lab.Lab, f func() error) error {
	t.Helper()
	return netnstest.Do(t, l.Client.Namespace, f)
}

// pingAndProbe sends n ICMP echo requests and n UDP datagrams from the
// client to the VIP and returns how many echo replies came back.
func pingAndProbe(t *testing.T, l *lab.Lab, n int) int {
	t.Helper()
	var ic *icmp.PacketConn
	var udp net.Conn
	if err := inClientNamespace(t, l, func() (err error) {
		if ic, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0"); err != nil {
			return err
		}
		udp, err = net.Dial("udp4", net.JoinHostPort(l.VIP.String(), "9"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ic.Close()
	defer udp.Close()
	id := os.Getpid() & 0xffff
	for seq := range n {
		b, err := (&icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: seq, Data: []byte("shoal")}}).Marshal(nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ic.WriteTo(b, &net.IPAddr{IP: l.VIP.AsSlice()}); err != nil {
			t.Fatal(err)
		}
		udp.Write([]byte("probe")) // an ICMP error from a previous probe may fail it; counted at the node
	}
	replies := 0
	ic.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 1500)
	for replies < n {
		m, from, err := ic.ReadFrom(buf)
		if err != nil {
			break
		}
		msg, err := icmp.ParseMessage(1, buf[:m])
		if err != nil || msg.Type != ipv4.ICMPTypeEchoReply || from.String() != l.VIP.String() {
			continue
		}
		if e, ok := msg.Body.(*icmp.Echo); ok && e.ID == id {
			replies++
		}
	}
	return replies
}

func nsFile(t *testing.T, ns, path string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "cat", path).Output()
	if err != nil {
		t.Fatalf("read %s in %s: %v", path, ns, err)
	}
	return strings.TrimSpace(string(out))
}

func nsCounter(t *testing.T, ns, path string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(nsFile(t, ns, path), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestE2EKill9FailSafeAndCleanup: after kill -9, the dead node answers
// none of the pings and UDP probes sent to the VIP (its kernel still gets
// the frames: the bridge floods them), while the survivors answer every
// ping; the restarted agent adopts what the dead one left, and its SIGTERM
// leaves no VIP on lo, the original sysctls, no XDP program and no cluster
// MAC membership.
func TestE2EKill9FailSafeAndCleanup(t *testing.T) {
	l := upLab(t, 3)
	n3 := node(t, l, "node3")
	// The lab's namespaces start with the kernel's defaults: the client's
	// values are node3's before its agent first started.
	sysctl := func(ns, name string) string {
		return nsFile(t, ns, "/proc/sys/net/ipv4/conf/"+lab.Interface+"/"+name)
	}
	origIgnore, origAnnounce := sysctl(l.Client.Namespace, "arp_ignore"), sysctl(l.Client.Namespace, "arp_announce")

	stopAgent(t, l, "node3", syscall.SIGKILL)
	poll(t, 10*time.Second, "survivors cover every bucket", func() error { return covered(l, "node1", "node2") })

	const n = 5
	rx0 := nsCounter(t, n3.Namespace, "/sys/class/net/"+lab.Interface+"/statistics/rx_packets")
	// The probes' port has a socket on node3, so what its kernel takes is
	// counted there alone: the UDP counters also count the survivors'
	// heartbeats to the dead agent's port.
	var sink net.PacketConn
	if err := netnstest.Do(t, n3.Namespace, func() (err error) {
		sink, err = net.ListenPacket("udp4", ":9")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	echos0 := netstat(t, n3.Namespace, "Icmp", "InEchos")
	replies := pingAndProbe(t, l, n)
	// The bridge floods the frames to node3 as it answers nothing: the last
	// ones may still be on their way (once, other traffic such as ARP made
	// up for them; the lab's hosts now have permanent neighbour entries).
	var rx uint64
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		rx = nsCounter(t, n3.Namespace, "/sys/class/net/"+lab.Interface+"/statistics/rx_packets") - rx0
		if rx >= 2*n || time.Now().After(deadline) {
			break
		}
	}
	echos, udp := netstat(t, n3.Namespace, "Icmp", "InEchos")-echos0, 0
	sink.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	for buf := make([]byte, 64); ; udp++ {
		if _, _, err := sink.ReadFrom(buf); err != nil {
			break
		}
	}
	t.Logf("dead node3: %d frames received, %d pings and %d UDP probes taken; client got %d of %d echo replies", rx, echos, udp, replies, n)
	if rx < 2*n {
		t.Errorf("dead node received %d frames, want >= %d: the test sent nothing its way", rx, 2*n)
	}
	if echos != 0 || udp != 0 {
		t.Errorf("dead node took %d pings and %d UDP probes, want 0", echos, udp)
	}
	if replies != n {
		t.Errorf("the survivors answered %d of %d pings to the VIP", replies, n)
	}

	startAgent(t, l, "node3")
	poll(t, 20*time.Second, "the restarted node3 back in the cluster", func() error { return covered(l, "node1", "node2", "node3") })
	stopAgent(t, l, "node3", syscall.SIGTERM)
	lo, err := exec.Command("ip", "-n", n3.Namespace, "-4", "addr", "show", "dev", "lo").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(lo), " "+l.VIP.String()+"/32") {
		t.Errorf("VIP still on lo after kill -9, restart and SIGTERM:\n%s", lo)
	}
	if ign, ann := sysctl(n3.Namespace, "arp_ignore"), sysctl(n3.Namespace, "arp_announce"); ign != origIgnore || ann != origAnnounce {
		t.Errorf("after kill -9, restart and SIGTERM: arp_ignore %s, arp_announce %s; want the originals %s, %s", ign, ann, origIgnore, origAnnounce)
	}
	var left filter.AttachMode
	if err := netnstest.Do(t, n3.Namespace, func() (err error) { left, err = filter.Attached(lab.Interface); return err }); err != nil || left != filter.AttachNone {
		t.Errorf("after kill -9, restart and SIGTERM: a program still attached (%q, %v)", left, err)
	}
	if out, err := exec.Command("ip", "-n", n3.Namespace, "maddr", "show", "dev", lab.Interface).CombinedOutput(); err != nil || strings.Contains(string(out), lab.ClusterMAC(l.VIP)) {
		t.Errorf("after kill -9, restart and SIGTERM: cluster mac %s still joined (%v):\n%s", lab.ClusterMAC(l.VIP), err, out)
	}
	if d := sysctl(n3.Namespace, "drop_unicast_in_l2_multicast"); d != "1" {
		t.Errorf("drop_unicast_in_l2_multicast %s after exit, want 1 (left set)", d)
	}
	if _, err := os.Stat(filepath.Join(n3.DataDir, "host-state.json")); !os.IsNotExist(err) {
		t.Errorf("host record left after a clean exit: %v", err)
	}
}

// TestE2ELinkFlapUnderLoad: `ip link set eth0 down; ip link set eth0 up`
// on every node, one after the other, under new-connection load: every
// node's ARP responder answers afterwards, and once the last link has been
// up for a second no request fails (neither those the load started from
// then on, nor a new load after it).
func TestE2ELinkFlapUnderLoad(t *testing.T) {
	l := upLab(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	before := map[string]uint64{}
	for _, h := range l.Nodes {
		before[h.Name] = replied(t, l, h.Name)
	}
	waitLoad := startLoad(ctx, t, l, lab.LoadArgs{Duration: 5 * time.Second, Concurrency: 4, Timeout: 2 * time.Second})
	for _, h := range l.Nodes {
		for _, state := range []string{"down", "up"} {
			if out, err := exec.Command("ip", "-n", h.Namespace, "link", "set", lab.Interface, state).CombinedOutput(); err != nil {
				t.Fatalf("%s: link %s: %v: %s", h.Name, state, err, out)
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
	lastUp := time.Now()
	during := waitLoad()
	// Once the last link has been up for a second, no request may fail:
	// those the load started from then on, and a new load after it.
	settle := lastUp.Add(time.Second).Sub(during.Start)
	var late, lateFailed, failed int
	for _, f := range during.FailureList {
		if f.Class != "" && time.Duration(f.AtMS*float64(time.Millisecond)) >= settle {
			lateFailed++
		}
	}
	for _, sl := range during.Timeline {
		failed += sl.Failures
		if time.Duration(sl.AtMS*float64(time.Millisecond)) >= settle {
			late += sl.Successes + sl.Failures
		}
	}
	t.Logf("during the flaps: %d of %d requests failed; %d started a second or more after the last link came up, %d of them failed", failed, during.Requests, late, lateFailed)
	if late == 0 || lateFailed != 0 || during.FailuresDropped != 0 {
		t.Errorf("requests started a second after the last link came up: %d, %d failed (%d failures not listed)", late, lateFailed, during.FailuresDropped)
	}
	r := loadRun(t, l, lab.LoadArgs{Duration: 2 * time.Second, Concurrency: 8, Timeout: 3 * time.Second})
	if r.Failures != 0 || r.Successes == 0 {
		t.Errorf("after the flaps: %d of %d requests failed (%v)", r.Failures, r.Requests, r.Errors)
	}
	// Every node's responder still answers: ask from the client.
	if out, err := exec.Command("ip", "-n", l.Client.Namespace, "neigh", "flush", "dev", lab.Interface).CombinedOutput(); err != nil {
		t.Fatalf("flush the client's neighbours: %v: %s", err, out)
	}
	loadRun(t, l, lab.LoadArgs{Duration: 200 * time.Millisecond, Concurrency: 1, Timeout: 3 * time.Second})
	for _, h := range l.Nodes {
		if got := replied(t, l, h.Name); got <= before[h.Name] {
			t.Errorf("%s answered no ARP after its link flapped (replied %d, %d before)", h.Name, got, before[h.Name])
		}
	}
}

// replied returns how many ARP requests a node's agent has answered.
func replied(t *testing.T, l *lab.Lab, name string) uint64 {
	t.Helper()
	var p struct {
		ARP map[string]uint64 `json:"arp"`
	}
	if err := client(t, l, name).Do(context.Background(), "GET", "/v1/params", nil, &p); err != nil {
		t.Fatal(err)
	}
	return p.ARP["replied"]
}
