package heartbeat

import (
	"crypto/sha256"
	"net/netip"
	"testing"
	"time"
)

// benchMessage is a heartbeat of a node in a 64-node cluster: a view of 64
// nodes, acks of 64 and a few draining buckets.
func benchMessage() *Message {
	v := View{RulesIndex: 1000, Seed: 7}
	for i := range 64 {
		v.Eligible = append(v.Eligible, uint32(i+1))
	}
	msg := &Message{ClusterID: 1, Node: 5, Incarnation: 1, Seq: 1, Admin: Started, Healthy: true, Settled: true,
		RulesIndex: 1000, View: v, Draining: Buckets{1: {3, 77, 1200}}, Counters: Counters{Accepted: 1 << 40}}
	for _, id := range v.Eligible {
		msg.Acks = append(msg.Acks, Ack{Node: id, Incarnation: 1, Seq: 1 << 40})
	}
	return msg
}

// BenchmarkEncode is the sender's cost per period: encode and HMAC once
// (the same bytes go to every peer).
func BenchmarkEncode(b *testing.B) {
	msg := benchMessage()
	wire, _ := Encode(msg, simRing)
	b.SetBytes(int64(len(wire)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Encode(msg, simRing); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecode is the receiver's cost per heartbeat: check, verify the
// HMAC, parse, and check the view digest.
func BenchmarkDecode(b *testing.B) {
	wire, _ := Encode(benchMessage(), simRing)
	b.SetBytes(int64(len(wire)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(wire, simRing, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeRemap is BenchmarkDecode for a heartbeat sent through a
// rule change that remaps flows: two rules' every bucket draining (sent
// as bitmaps).
func BenchmarkDecodeRemap(b *testing.B) {
	msg := benchMessage()
	all := make([]uint16, NumBuckets)
	for i := range all {
		all[i] = uint16(i)
	}
	msg.Draining = Buckets{1: all, 2: all}
	wire, _ := Encode(msg, simRing)
	b.SetBytes(int64(len(wire)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(wire, simRing, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeRemapKept is BenchmarkDecodeRemap as the transport
// decodes: the sender's bitmaps the same as in its heartbeat before
// (bitmapCache).
func BenchmarkDecodeRemapKept(b *testing.B) {
	msg := benchMessage()
	all := make([]uint16, NumBuckets)
	for i := range all {
		all[i] = uint16(i)
	}
	msg.Draining = Buckets{1: all, 2: all}
	wire, _ := Encode(msg, simRing)
	var kept bitmapCache
	b.SetBytes(int64(len(wire)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decode(wire, simRing, 1, &kept); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSHA256Baseline is a bare SHA-256 of a heartbeat's size: the
// floor the codec is compared with.
func BenchmarkSHA256Baseline(b *testing.B) {
	wire, _ := Encode(benchMessage(), simRing)
	b.SetBytes(int64(len(wire)))
	b.ReportAllocs()
	for b.Loop() {
		sha256.Sum256(wire)
	}
}

// BenchmarkMachineReceive is the state machine's cost per heartbeat in a
// stable 64-node cluster (the view does not change).
func BenchmarkMachineReceive(b *testing.B) {
	ids := make([]uint32, 64)
	for i := range ids {
		ids[i] = uint32(i + 1)
	}
	m, err := NewMachine(Config{ClusterID: 1, Self: 1, Incarnation: 1}, t0, toyOwned(1), toyIntersect)
	if err != nil {
		b.Fatal(err)
	}
	reg := map[uint32]netip.AddrPort{}
	for _, id := range ids {
		reg[id] = hAddr(id)
	}
	m.SetPeers(t0, reg)
	m.SetLocal(t0, Local{Admin: Started, Healthy: true, RulesIndex: 1000, Seed: 7})
	msgs := make([]*Message, 64)
	for i := range msgs {
		msg := benchMessage()
		msg.Node = uint32(i + 1)
		msgs[i] = msg
	}
	now := t0
	var seq uint64
	deliver := func(i int) {
		seq++
		msg := *msgs[i]
		msg.Seq = seq
		if err := m.Receive(now, &msg, hAddr(msg.Node)); err != nil {
			b.Fatal(err)
		}
	}
	// Warm up to the steady state: everyone converged on the 64-node view.
	for range 5 {
		for i := 1; i < 64; i++ {
			deliver(i)
		}
		m.Outgoing(now)
		now = now.Add(m.cfg.Period)
		m.Tick(now)
	}
	if st := m.Status(); !st.Converged || len(st.View.Eligible) != 64 {
		b.Fatalf("not converged on 64 nodes: %v", st.View.Eligible)
	}
	for b.Loop() {
		deliver(1 + int(seq%63))
	}
}

// BenchmarkMachineTick: a Tick in a stable 64-node cluster between two
// heartbeats (nothing changed, no deadline passed), against the death
// check and recompute it used to run every time (the baseline, measured
// in the same run).
func BenchmarkMachineTick(b *testing.B) {
	m := steady64(b)
	saved := verifySkips
	verifySkips = false
	b.Cleanup(func() { verifySkips = saved })
	now := m.now
	// A nanosecond a call: no deadline passes however long it runs.
	b.Run("tick", func(b *testing.B) {
		for b.Loop() {
			now = now.Add(time.Nanosecond)
			m.Tick(now)
		}
	})
	b.Run("recompute", func(b *testing.B) {
		for b.Loop() {
			now = now.Add(time.Nanosecond)
			m.tick(now)
		}
	})
	if st := m.Status(); !st.Converged || len(st.View.Eligible) != 64 {
		b.Fatalf("the view changed: %v", st.View.Eligible)
	}
}

// steady64 returns node 1's machine converged on a 64-node view.
func steady64(b *testing.B) *Machine[toySet] {
	m, err := NewMachine(Config{ClusterID: 1, Self: 1, Incarnation: 1}, t0, toyOwned(1), toyIntersect)
	if err != nil {
		b.Fatal(err)
	}
	reg := map[uint32]netip.AddrPort{}
	for id := uint32(1); id <= 64; id++ {
		reg[id] = hAddr(id)
	}
	m.SetPeers(t0, reg)
	m.SetLocal(t0, Local{Admin: Started, Healthy: true, RulesIndex: 1000, Seed: 7})
	now := t0
	var seq uint64
	for range 5 {
		for id := uint32(2); id <= 64; id++ {
			seq++
			msg := benchMessage()
			msg.Node, msg.Seq = id, seq
			if err := m.Receive(now, msg, hAddr(id)); err != nil {
				b.Fatal(err)
			}
		}
		m.Outgoing(now)
		now = now.Add(m.cfg.Period)
		m.Tick(now)
	}
	if st := m.Status(); !st.Converged || len(st.View.Eligible) != 64 {
		b.Fatalf("not converged on 64 nodes: %v", st.View.Eligible)
	}
	return m
}

// BenchmarkMutual: deriving who hears whom over a converged 64-node view,
// uncached (a heartbeat changed something), as recompute does.
func BenchmarkMutual(b *testing.B) {
	s := newSim(b, 64, Config{}, 1)
	s.run(s.startAll(10 * time.Second))
	m := s.nodes[0].m
	elig := m.View().Eligible
	if len(elig) != 64 {
		b.Fatalf("view of %d nodes, want 64", len(elig))
	}
	b.ResetTimer()
	for b.Loop() {
		m.reach.valid = false
		m.mutual(elig, s.now)
	}
}
