//go:build linux

package filter

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"
)

// TestSocketLookup checks OwnedDirty and Draining buckets against real
// sockets: a listener on the VIP and one established connection, in a test
// namespace. Only the established connection's packets (and, in a dirty
// bucket, SYNs) get through.
func TestSocketLookup(t *testing.T) {
	vip, client := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2")
	ns := enterNetnsWith(t, vip, client)
	x := loadXDP(t)
	conn, _ := realConn(t, vip, client)
	tw := timeWaitConn(t, ns, vip, client)
	stranger := netip.MustParseAddr("198.18.0.3")

	est := pkt{src: conn[0].Addr(), sport: conn[0].Port(), dst: vip, dport: 80, proto: layers.IPProtocolTCP, ack: true}
	estICMP := pkt{src: netip.MustParseAddr("198.18.9.9"), dst: vip, proto: layers.IPProtocolICMPv4, icmpType: 3,
		inner: embedded(pkt{src: vip, sport: 80, dst: conn[0].Addr(), dport: conn[0].Port(), proto: layers.IPProtocolTCP})}
	timeWait := pkt{src: tw[0].Addr(), sport: tw[0].Port(), dst: vip, dport: tw[1].Port(), proto: layers.IPProtocolTCP, ack: true}
	// The client's FIN, which a socket the server closed first waits for
	// in TIME_WAIT's FIN_WAIT2 substate.
	timeWaitFin := pkt{src: tw[0].Addr(), sport: tw[0].Port(), dst: vip, dport: tw[1].Port(), proto: layers.IPProtocolTCP, ack: true, fin: true}
	// A new connection on the ports of one in TIME_WAIT here.
	timeWaitSyn := pkt{src: tw[0].Addr(), sport: tw[0].Port(), dst: vip, dport: tw[1].Port(), proto: layers.IPProtocolTCP, syn: true}
	unknown := pkt{src: stranger, sport: 40000, dst: vip, dport: 80, proto: layers.IPProtocolTCP, ack: true}
	syn := pkt{src: stranger, sport: 40001, dst: vip, dport: 80, proto: layers.IPProtocolTCP, syn: true}
	synack := pkt{src: stranger, sport: 40002, dst: vip, dport: 80, proto: layers.IPProtocolTCP, syn: true, ack: true}
	udp := pkt{src: stranger, sport: 40000, dst: vip, dport: 80, proto: layers.IPProtocolUDP}

	tests := []struct {
		name  string
		state BucketState
		p     pkt
		want  Verdict
	}{
		{"dirty established", OwnedDirty, est, Accept},
		{"dirty icmp error about established", OwnedDirty, estICMP, Accept},
		{"dirty time-wait is no connection", OwnedDirty, timeWait, Drop},
		{"dirty time-wait takes a fin", OwnedDirty, timeWaitFin, Accept},
		{"dirty unknown (finds only the listener)", OwnedDirty, unknown, Drop},
		{"dirty syn", OwnedDirty, syn, Accept},
		{"dirty syn-ack is not a syn", OwnedDirty, synack, Drop},
		{"dirty udp", OwnedDirty, udp, Accept},
		{"draining established", Draining, est, Accept},
		{"draining icmp error about established", Draining, estICMP, Accept},
		{"draining time-wait is no connection", Draining, timeWait, Drop},
		{"draining time-wait takes a fin", Draining, timeWaitFin, Accept},
		{"draining unknown", Draining, unknown, Drop},
		{"draining syn", Draining, syn, Drop},
		{"draining syn on a time-wait's ports is a new connection", Draining, timeWaitSyn, Drop},
		{"dirty syn on a time-wait's ports", OwnedDirty, timeWaitSyn, Accept},
		{"draining udp", Draining, udp, Drop},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			enterNetns(t, ns) // a subtest runs on its own goroutine
			c := &Config{Seed: 99, VIPs: []netip.Addr{vip},
				Rules: []Rule{{ID: 1, VIP: vip, PortLo: 80, PortHi: 8080, Proto: ProtoBoth, Affinity: AffinityNone}}}
			st := new([NumBuckets]BucketState)
			for b := range st {
				st[b] = tt.state
			}
			tb := &Tables{Config: c, States: map[RuleID]*[NumBuckets]BucketState{1: st}}
			if err := x.Update(tb, nodeMAC); err != nil {
				t.Fatalf("Update: %v", err)
			}
			frame := tt.p.build()
			ref := append([]byte(nil), frame...)
			res := NewClassifier(tb, nodeMAC, conns{conn: true, tw: false}).Classify(ref)
			if res.Verdict != tt.want {
				t.Errorf("reference: %+v, want %v", res, tt.want)
			}
			act, out, err := x.Run(frame)
			if err != nil {
				t.Fatal(err)
			}
			if act != tt.want.XDPAction() || !bytes.Equal(out, ref) {
				t.Errorf("xdp action %d (output equal %v), want %d", act, bytes.Equal(out, ref), tt.want.XDPAction())
			}
		})
	}

	// The lookup uses the namespace of the task running the program (for
	// prog.Run) or of the receiving device: from the root namespace, the
	// connection does not exist.
	t.Run("other namespace", func(t *testing.T) {
		done := make(chan uint32)
		go func() { // a fresh goroutine never runs on the locked thread
			act, _, err := x.Run(est.build())
			if err != nil {
				t.Error(err)
			}
			done <- act
		}()
		if act := <-done; act != xdpDrop {
			t.Errorf("established packet judged from the root namespace: action %d, want drop", act)
		}
	})
}

// TestAtomicUpdate swaps between two table versions while other goroutines
// run packets. Every table (VIPs, ports, rules, buckets, settings) differs
// between the versions so that a packet judged by a mix of them is dropped
// or gets the wrong MAC, where either whole version accepts it.
func TestAtomicUpdate(t *testing.T) {
	x := loadXDP(t)
	vip := netip.MustParseAddr("198.18.0.1")
	macs := [2][]byte{{0x02, 0, 0, 0, 0xaa, 0}, {0x02, 0, 0, 0, 0xbb, 1}}
	rng := rand.New(rand.NewPCG(5, 6))
	var frames [][]byte
	type flowIn struct {
		ip   uint32
		port uint16
	}
	var flows []flowIn
	for i := 0; i < 64; i++ {
		f := flowIn{0xc6120000 | rng.Uint32()&0xffff, uint16(1024 + rng.IntN(60000))}
		src := netip.AddrFrom4([4]byte{byte(f.ip >> 24), byte(f.ip >> 16), byte(f.ip >> 8), byte(f.ip)})
		frames = append(frames, (&pkt{src: src, sport: f.port, dst: vip, dport: 80, proto: layers.IPProtocolTCP, ack: true}).build())
		flows = append(flows, f)
	}
	// Version v: rule 1+v holds port 80 (the other rule port 81), with
	// affinity none (v=0) or single (v=1), seed 1000+v, and owns exactly
	// the buckets of the test flows under that version.
	var versions [2]*Tables
	for v := 0; v < 2; v++ {
		seed := uint32(1000 + v)
		c := &Config{Seed: seed, VIPs: []netip.Addr{vip}, Rules: []Rule{
			{ID: 1, VIP: vip, PortLo: uint16(80 + v), PortHi: uint16(80 + v), Proto: ProtoTCP, Affinity: AffinityNone},
			{ID: 2, VIP: vip, PortLo: uint16(81 - v), PortHi: uint16(81 - v), Proto: ProtoTCP, Affinity: AffinitySingle},
		}}
		id := RuleID(1 + v)
		st := new([NumBuckets]BucketState)
		for _, f := range flows {
			st[Bucket(seed, c.Affinity(id), f.ip, f.port)] = Owned
		}
		versions[v] = &Tables{Config: c, States: map[RuleID]*[NumBuckets]BucketState{id: st}}
	}
	// A mix must be visible: no test flow's bucket under one version's
	// key is owned in the other version's table.
	for v := 0; v < 2; v++ {
		o, ov := versions[1-v], 1-v
		for _, f := range flows {
			if o.States[RuleID(1+ov)][Bucket(uint32(1000+v), Affinity(v), f.ip, f.port)] == Owned {
				t.Skipf("seeds collide for flow %v; pick others", f)
			}
		}
	}
	if err := x.Update(versions[0], macs[0]); err != nil {
		t.Fatal(err)
	}
	before, err := x.Counters()
	if err != nil {
		t.Fatal(err)
	}

	var stop atomic.Bool
	var ran atomic.Int64
	var seen [2]atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			out := make([]byte, 256)
			for i := w; !stop.Load(); i++ {
				opts := ebpf.RunOptions{Data: frames[i%len(frames)], DataOut: out}
				act, err := x.Program().Run(&opts)
				if err != nil {
					errs <- err
					return
				}
				ran.Add(1)
				switch {
				case act == xdpPass && bytes.Equal(opts.DataOut[:6], macs[0]):
					seen[0].Add(1)
				case act == xdpPass && bytes.Equal(opts.DataOut[:6], macs[1]):
					seen[1].Add(1)
				default:
					errs <- fmt.Errorf("frame %d judged by a mix of versions: action %d, dst mac %x", i%len(frames), act, opts.DataOut[:6])
					return
				}
			}
		}(w)
	}
	const swaps = 200
	for i := 1; i <= swaps && len(errs) == 0; i++ {
		if err := x.Update(versions[i%2], macs[i%2]); err != nil {
			t.Errorf("Update: %v", err)
			break
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	after, err := x.Counters()
	if err != nil {
		t.Fatal(err)
	}
	d := sub(after, before)
	if got := d[1].Accepted + d[2].Accepted; got != uint64(ran.Load()) || len(d) > 2 || d[1].Dropped != d[2].Dropped {
		t.Errorf("counters %+v after %d accepted packets", d, ran.Load())
	}
	t.Logf("%d packets over %d swaps: %d by version 0, %d by version 1", ran.Load(), swaps, seen[0].Load(), seen[1].Load())
	if seen[0].Load() == 0 || seen[1].Load() == 0 {
		t.Errorf("packets never met one of the versions: %d, %d", seen[0].Load(), seen[1].Load())
	}
}

// timeWaitConn makes a connection from client to vip:8080 that the server
// closes first, and waits until the server's side is in TIME_WAIT. It
// returns the connection's (client, vip) tuple.
func timeWaitConn(t *testing.T, ns string, vip, client netip.Addr) [2]netip.AddrPort {
	t.Helper()
	srv := netip.AddrPortFrom(vip, 8080)
	ln, err := net.Listen("tcp4", srv.String())
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer ln.Close()
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(client, 0))}
	c, err := d.Dial("tcp4", srv.String())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	s.Close() // the server closes first, so its side ends in TIME_WAIT
	buf := make([]byte, 1)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	c.Read(buf) // wait for the server's FIN
	c.Close()
	cl := c.LocalAddr().(*net.TCPAddr).AddrPort()
	tuple := [2]netip.AddrPort{netip.AddrPortFrom(cl.Addr().Unmap(), cl.Port()), srv}
	deadline := time.Now().Add(5 * time.Second)
	for {
		out := run(t, "ip", "netns", "exec", ns, "ss", "-Htn", "state", "time-wait")
		if strings.Contains(out, tuple[0].String()) {
			return tuple
		}
		if time.Now().After(deadline) {
			t.Fatalf("no TIME_WAIT socket for %v; ss says:\n%s", tuple, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
