package drill

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/shoalnet/shoal/deploy/lab/load"
)

func TestTimeline(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(msec int) time.Time { return t0.Add(time.Duration(msec) * time.Millisecond) }
	res := load.Result{
		Start: t0, BucketMS: 100, DurationMS: 500,
		Timeline: []load.Slot{
			{AtMS: 0, Successes: 3, P50MS: 1, P99MS: 2, ByNode: map[string]int{"a": 2, "b": 1}},
			{AtMS: 100, Successes: 1, Failures: 2, Delayed: 1, P50MS: 3, P99MS: 4, ByNode: map[string]int{"a": 1}},
		},
	}
	tests := []struct {
		name    string
		samples []Sample
		want    []Slot
	}{{
		name: "interpolated between samples, flat after the last",
		samples: []Sample{
			{At: at(400), Accepted: map[string]uint64{"a": 200, "b": 300}}, // out of order on purpose
			{At: at(0), Accepted: map[string]uint64{"a": 0, "b": 0}},
			{At: at(200), Accepted: map[string]uint64{"a": 200, "b": 100}},
		},
		want: []Slot{
			{AtMS: 0, Successes: 3, P50MS: 1, P99MS: 2, Responses: map[string]int{"a": 2, "b": 1},
				Packets: map[string]uint64{"a": 100, "b": 50}, Share: map[string]float64{"a": 100.0 / 150, "b": 50.0 / 150}},
			{AtMS: 100, Successes: 1, Failures: 2, Delayed: 1, P50MS: 3, P99MS: 4, Responses: map[string]int{"a": 1},
				Packets: map[string]uint64{"a": 100, "b": 50}, Share: map[string]float64{"a": 100.0 / 150, "b": 50.0 / 150}},
			{AtMS: 200, Packets: map[string]uint64{"a": 0, "b": 100}, Share: map[string]float64{"a": 0, "b": 1}},
			{AtMS: 300, Packets: map[string]uint64{"a": 0, "b": 100}, Share: map[string]float64{"a": 0, "b": 1}},
			{AtMS: 400, Packets: map[string]uint64{"a": 0, "b": 0}},
		},
	}, {
		name: "a node that stops answering counts nothing more",
		samples: []Sample{
			{At: at(0), Accepted: map[string]uint64{"a": 0, "b": 0}},
			{At: at(100), Accepted: map[string]uint64{"a": 10, "b": 10}},
			{At: at(200), Accepted: map[string]uint64{"a": 30}},
			{At: at(300), Accepted: map[string]uint64{"a": 50}},
		},
		want: []Slot{
			{AtMS: 0, Successes: 3, P50MS: 1, P99MS: 2, Responses: map[string]int{"a": 2, "b": 1},
				Packets: map[string]uint64{"a": 10, "b": 10}, Share: map[string]float64{"a": 0.5, "b": 0.5}},
			{AtMS: 100, Successes: 1, Failures: 2, Delayed: 1, P50MS: 3, P99MS: 4, Responses: map[string]int{"a": 1},
				Packets: map[string]uint64{"a": 20, "b": 0}, Share: map[string]float64{"a": 1, "b": 0}},
			{AtMS: 200, Packets: map[string]uint64{"a": 20, "b": 0}, Share: map[string]float64{"a": 1, "b": 0}},
			{AtMS: 300, Packets: map[string]uint64{"a": 0, "b": 0}},
			{AtMS: 400, Packets: map[string]uint64{"a": 0, "b": 0}},
		},
	}, {
		name: "a restarted agent's counter counts from zero",
		samples: []Sample{
			{At: at(0), Accepted: map[string]uint64{"a": 1000}},
			{At: at(100), Accepted: map[string]uint64{"a": 1100}},
			{At: at(200), Accepted: map[string]uint64{"a": 7}},
		},
		want: []Slot{
			{AtMS: 0, Successes: 3, P50MS: 1, P99MS: 2, Responses: map[string]int{"a": 2, "b": 1},
				Packets: map[string]uint64{"a": 100}, Share: map[string]float64{"a": 1}},
			{AtMS: 100, Successes: 1, Failures: 2, Delayed: 1, P50MS: 3, P99MS: 4, Responses: map[string]int{"a": 1},
				Packets: map[string]uint64{"a": 7}, Share: map[string]float64{"a": 1}},
			{AtMS: 200, Packets: map[string]uint64{"a": 0}},
			{AtMS: 300, Packets: map[string]uint64{"a": 0}},
			{AtMS: 400, Packets: map[string]uint64{"a": 0}},
		},
	}, {
		name: "no samples: the load's slots only",
		want: []Slot{
			{AtMS: 0, Successes: 3, P50MS: 1, P99MS: 2, Responses: map[string]int{"a": 2, "b": 1}},
			{AtMS: 100, Successes: 1, Failures: 2, Delayed: 1, P50MS: 3, P99MS: 4, Responses: map[string]int{"a": 1}},
			{AtMS: 200}, {AtMS: 300}, {AtMS: 400},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Timeline(res, tt.samples)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Timeline (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseScenario(t *testing.T) {
	for _, sc := range Scenarios {
		got, err := ParseScenario(string(sc))
		if err != nil || got != sc {
			t.Errorf("ParseScenario(%q) = %q, %v", sc, got, err)
		}
	}
	if _, err := ParseScenario("unplug"); err == nil {
		t.Error("ParseScenario(unplug) succeeded")
	}
}

func TestLabOnlyScenarios(t *testing.T) {
	for _, sc := range Scenarios {
		_, err := RunCluster(context.Background(), ClusterOptions{Scenario: sc, URL: "http://198.18.7.100/", Socket: "/nonexistent.sock", Node: "n3"})
		if got := errors.Is(err, ErrLabOnly); got != sc.LabOnly() {
			t.Errorf("%s on a cluster: %v; want ErrLabOnly: %v", sc, err, sc.LabOnly())
		}
	}
}
