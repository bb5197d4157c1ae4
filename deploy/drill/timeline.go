package drill

import (
	"slices"
	"time"

	"github.com/shoalnet/shoal/deploy/lab/load"
)

// Sample is one reading of the agents' data-plane counters: packets each
// node's XDP program accepted so far, summed over its rules. A node that
// did not answer (its agent is gone) is absent.
type Sample struct {
	At       time.Time         `json:"at"`
	Accepted map[string]uint64 `json:"accepted"`
}

// Slot is one 100 ms step of a drill's timeline: the requests that started
// in it and what the agents' counters saw in it.
type Slot struct {
	AtMS      float64 `json:"at_ms"` // from the start of the traffic
	Successes int     `json:"successes"`
	Failures  int     `json:"failures"`
	Delayed   int     `json:"syn_delayed,omitempty"` // successes delayed by a SYN retransmission
	P50MS     float64 `json:"p50_ms"`                // over successful requests
	P99MS     float64 `json:"p99_ms"`
	// Responses counts successful requests per node, by the node name the
	// server answered with.
	Responses map[string]int `json:"responses,omitempty"`
	// Packets counts packets each node's XDP program accepted in the
	// slot, from the agents' counters.
	Packets map[string]uint64 `json:"packets,omitempty"`
	// Share is each node's fraction of Packets.
	Share map[string]float64 `json:"share,omitempty"`
}

// Timeline merges the load generator's per-slot results with the agents'
// counter samples. Each slot gets, per node, the counter's growth between
// the slot's start and end, reading the counter as the latest sample at or
// before each instant. A counter that goes backwards (the agent restarted)
// counts from zero. samples need not be sorted.
func Timeline(res load.Result, samples []Sample) []Slot {
	bucket := time.Duration(res.BucketMS * float64(time.Millisecond))
	if bucket <= 0 {
		bucket = 100 * time.Millisecond
	}
	ss := slices.Clone(samples)
	slices.SortFunc(ss, func(a, b Sample) int { return a.At.Compare(b.At) })
	n := len(res.Timeline)
	// Counters may go on after the last request started: extend the
	// timeline to cover the samples taken during the run.
	if res.DurationMS > 0 {
		n = max(n, int(res.DurationMS/ms(bucket)+0.5))
	}
	out := make([]Slot, n)
	for i := range out {
		out[i].AtMS = ms(time.Duration(i) * bucket)
	}
	for _, s := range res.Timeline {
		i := int(s.AtMS/ms(bucket) + 0.5)
		if i < 0 || i >= n {
			continue
		}
		out[i].Successes, out[i].Failures, out[i].Delayed = s.Successes, s.Failures, s.Delayed
		out[i].P50MS, out[i].P99MS = s.P50MS, s.P99MS
		if len(s.ByNode) > 0 {
			out[i].Responses = s.ByNode
		}
	}
	if len(ss) == 0 {
		return out
	}
	for i := range out {
		from := res.Start.Add(time.Duration(i) * bucket)
		to := from.Add(bucket)
		a, b := counterAt(ss, from), counterAt(ss, to)
		var total uint64
		pk := map[string]uint64{}
		for node, v := range b {
			d := v
			if old, ok := a[node]; ok && old <= v {
				d = v - old
			} else if !ok && len(a) == 0 {
				d = 0 // no reading before the slot: nothing to measure from
			}
			pk[node] = d
			total += d
		}
		if len(b) == 0 || len(a) == 0 {
			continue
		}
		out[i].Packets = pk
		if total > 0 {
			out[i].Share = map[string]float64{}
			for node, d := range pk {
				out[i].Share[node] = float64(d) / float64(total)
			}
		}
	}
	return out
}

// counterAt returns the counters as of t, for every node that answered in
// a sample at or before t: linear between the samples around t (the
// packets of an interval are spread evenly over it), the last value after
// the last sample. nil if no sample is that old.
func counterAt(ss []Sample, t time.Time) map[string]uint64 {
	var out map[string]uint64
	last := map[string]time.Time{}
	for _, s := range ss {
		if s.At.After(t) {
			// Interpolate nodes this later sample also has.
			for node, v := range s.Accepted {
				old, ok := out[node]
				if !ok || v < old {
					continue
				}
				span := s.At.Sub(last[node])
				if span <= 0 {
					continue
				}
				out[node] = old + uint64(float64(v-old)*float64(t.Sub(last[node]))/float64(span))
			}
			break
		}
		if out == nil {
			out = map[string]uint64{}
		}
		for node, v := range s.Accepted {
			out[node] = v
			last[node] = s.At
		}
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
