package load

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestSummarize(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	lat := func(ms int) time.Duration { return time.Duration(ms) * time.Millisecond }
	records := []Record{
		{Start: at(250), Latency: lat(4), Node: "node2"}, // out of order on purpose
		{Start: at(10), Latency: lat(1), Node: "node1", Connect: lat(1)},
		{Start: at(20), Latency: lat(3), Node: "node2"},                         // a reused connection
		{Start: at(210), Latency: lat(1003), Node: "node1", Connect: lat(1001)}, // after a SYN retransmission
		{Start: at(30), Latency: lat(2000), Class: ErrTimeout, Err: "deadline"},
		{Start: at(260), Latency: lat(5), Status: 503, Class: ErrBadStatus, Err: "503 Service Unavailable"},
	}
	got := Summarize(records, t0, time.Second, 100*time.Millisecond)
	want := Result{
		Start:        t0,
		DurationMS:   1000,
		Requests:     6,
		Successes:    4,
		Failures:     2,
		RatePerSec:   6,
		P50MS:        3,
		P99MS:        1003,
		Connects:     2,
		ConnectP50MS: 1,
		ConnectP99MS: 1001,
		Delayed:      1,
		DelayedList:  []Failure{{AtMS: 210, LatencyMS: 1003, ConnectMS: 1001}},
		ByNode:       map[string]int{"node1": 2, "node2": 2},
		Share:        map[string]float64{"node1": 0.5, "node2": 0.5},
		Errors:       map[ErrorClass]int{ErrTimeout: 1, ErrBadStatus: 1},
		BucketMS:     100,
		Timeline: []Slot{
			{AtMS: 0, Successes: 2, Failures: 1, P50MS: 1, P99MS: 3, ByNode: map[string]int{"node1": 1, "node2": 1}},
			{AtMS: 100}, // an empty slot stays in the timeline: a gap is news
			{AtMS: 200, Successes: 2, Failures: 1, P50MS: 4, P99MS: 1003, Delayed: 1, ByNode: map[string]int{"node1": 1, "node2": 1}},
		},
		FailureList: []Failure{
			{AtMS: 30, LatencyMS: 2000, Class: ErrTimeout, Error: "deadline"},
			{AtMS: 260, LatencyMS: 5, Class: ErrBadStatus, Status: 503, Error: "503 Service Unavailable"},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Summarize (-want +got):\n%s", diff)
	}
}

func TestSummarizeCapsFailureList(t *testing.T) {
	t0 := time.Now()
	recs := make([]Record, MaxFailureList+7)
	for i := range recs {
		recs[i] = Record{Start: t0, Class: ErrRefused, Err: "refused"}
	}
	got := Summarize(recs, t0, time.Second, 0)
	if len(got.FailureList) != MaxFailureList || got.FailuresDropped != 7 || got.Failures != len(recs) {
		t.Errorf("failure list %d, dropped %d, failures %d; want %d, 7, %d",
			len(got.FailureList), got.FailuresDropped, got.Failures, MaxFailureList, len(recs))
	}
}

func TestPercentile(t *testing.T) {
	ds := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x)
		}
		return out
	}
	tests := []struct {
		name string
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{"empty", nil, 99, 0},
		{"one", ds(7), 50, 7},
		{"median of four is the second", ds(4, 1, 3, 2), 50, 2},
		{"p99 of 100 is the 99th", ds(rangeN(100)...), 99, 99},
		{"p99 of 1000 is the 990th", ds(rangeN(1000)...), 99, 990},
		{"p100 is the max", ds(5, 9, 1), 100, 9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentile(tt.in, tt.p); got != tt.want {
				t.Errorf("Percentile(p%v) = %v, want %v", tt.p, got, tt.want)
			}
		})
	}
}

// rangeN returns 1..n.
func rangeN(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}
