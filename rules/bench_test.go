package rules

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// BenchmarkWriteLatency measures a rule write from proposal to applied on
// every node, and reports p50 and p99 beside the mean (ns/op):
//
//	fsm-only          baseline: encode and apply on a bare FSM, no Raft
//	1-node            Raft on one node with its bolt log (fsync per write)
//	3-node            the production timing (DefaultTiming), loopback TCP,
//	                  bolt with fsync; the clock stops when all 3 applied
//	3-node-nosync     the same without fsync, to show what the disk costs
//	3-node-commit50ms the same with hashicorp/raft's default 50 ms
//	                  CommitTimeout, to show why DefaultTiming lowers it
//
// Run: go test -run '^$' -bench BenchmarkWriteLatency -benchtime 500x ./rules/
func BenchmarkWriteLatency(b *testing.B) {
	b.Run("fsm-only", func(b *testing.B) {
		tf := seeded(b)
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := range b.N {
			start := time.Now()
			data, err := EncodeCommand(weightCmd(i))
			if err != nil {
				b.Fatal(err)
			}
			tf.index++
			if ar := tf.f.Apply(&raft.Log{Index: tf.index, Data: data}).(applyResult); ar.err != nil {
				b.Fatal(ar.err)
			}
			lat = append(lat, time.Since(start))
		}
		reportLatency(b, lat)
	})
	b.Run("1-node", func(b *testing.B) { benchCluster(b, 1, DefaultTiming(), false) })
	b.Run("3-node", func(b *testing.B) { benchCluster(b, 3, DefaultTiming(), false) })
	b.Run("3-node-nosync", func(b *testing.B) { benchCluster(b, 3, DefaultTiming(), true) })
	b.Run("3-node-commit50ms", func(b *testing.B) {
		t := DefaultTiming()
		t.CommitTimeout = 50 * time.Millisecond
		benchCluster(b, 3, t, false)
	})
}

// weightCmd returns a cheap command that always applies and always changes
// the state.
func weightCmd(i int) Command {
	return &SetWeight{Rule: 1, Node: 1, Weight: i % 100}
}

func benchCluster(b *testing.B, size int, timing Timing, noSync bool) {
	nodes := newClusterTiming(b, size, timing, noSync)
	leader, _ := leaderOf(b, nodes)
	mustApply(b, leader, &PutVIP{VIP: vip1})
	mustApply(b, leader, putRule(80))
	waitConverged(b, nodes)
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		res, err := leader.store.Apply(ctx, weightCmd(i))
		if err != nil {
			b.Fatal(err)
		}
		for _, n := range nodes {
			if err := n.store.WaitIndex(ctx, res.Index); err != nil {
				b.Fatal(err)
			}
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	reportLatency(b, lat)
	if s := nodes[len(nodes)-1].store.State(); s.Node(1).NodeRule(1).Weight != (b.N-1)%100 {
		b.Errorf("last write not applied: weight %d", s.Node(1).NodeRule(1).Weight)
	}
}

func reportLatency(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
}
