package filter

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// FuzzClassify feeds the reference classifier arbitrary frames: it must
// not panic, must leave a frame it passes or drops untouched, and may
// change only the destination MAC of a frame it accepts. (The differential
// test holds the XDP program to the same verdicts.)
func FuzzClassify(f *testing.F) {
	cfg := refConfig6() // IPv4 and IPv6 VIPs
	cfg.VIPs = append(cfg.VIPs, refVIP2)
	g := &gen{rng: rand.New(rand.NewPCG(7, 8)), vips: cfg.VIPs}
	for i := 0; i < 128; i++ {
		f.Add(g.frame())
	}
	tb := allIn(cfg, OwnedDirty)
	cs := conns{}
	f.Fuzz(func(t *testing.T, frame []byte) {
		orig := append([]byte(nil), frame...)
		res := Classify(tb, frame, nodeMAC, cs)
		switch res.Verdict {
		case Accept:
			if !bytes.Equal(frame[:6], nodeMAC) || !bytes.Equal(frame[6:], orig[6:]) {
				t.Fatalf("accepted frame changed beyond its destination MAC")
			}
		case Pass, Drop:
			if !bytes.Equal(frame, orig) {
				t.Fatalf("%v changed the frame", res.Verdict)
			}
		case HandOver:
			if !bytes.Equal(frame[:6], res.To[:]) || !bytes.Equal(frame[6:12], nodeMAC) || !bytes.Equal(frame[12:], orig[12:]) {
				t.Fatalf("handed-over frame changed beyond its MACs")
			}
		default:
			t.Fatalf("verdict %v", res.Verdict)
		}
		// A drop says why, but for a SYN handed over to this node and
		// refused (counted apart, under no reason).
		if res.Verdict != Drop && res.Reason != NoReason || res.Verdict == Drop && (res.Reason == NoReason) != res.Handed {
			t.Fatalf("verdict %v with reason %v (handed over here: %v)", res.Verdict, res.Reason, res.Handed)
		}
	})
}
