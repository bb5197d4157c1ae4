package drill

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/shoalnet/shoal/deploy/lab/load"
)

// testReport is a plug drill: three nodes, node3 pulled at 1 s, failures
// in the slot of the event, settled 1.2 s later.
func testReport() *Report {
	r := &Report{
		Scenario: Plug, Target: "lab shl0001 (3 nodes)", URL: "http://198.18.1.100:80/", Node: "node3",
		Nodes: []string{"node1", "node2", "node3"}, HeartbeatPeriod: "100ms", HeartbeatTolerance: 10,
		Concurrency: 8, EventAtMS: 1000, SettledMS: 1200, Settled: "failover: every node converged without the node",
		DurationMS: 3000, Requests: 296, Successes: 290, Failures: 6, P50MS: 1, P99MS: 9,
		Errors:  map[load.ErrorClass]int{load.ErrTimeout: 4, load.ErrReset: 2},
		Delayed: 2, Connects: 296, ConnectP99MS: 1003,
		DelayedList: []load.Failure{{AtMS: 1040, ConnectMS: 1003, LatencyMS: 1005}, {AtMS: 1070, ConnectMS: 1001, LatencyMS: 1002}},
	}
	for i := range 30 {
		s := Slot{AtMS: float64(i * 100), Successes: 10, Responses: map[string]int{"node1": 3, "node2": 3, "node3": 4}}
		if i >= 10 {
			s.Responses = map[string]int{"node1": 5, "node2": 5}
		}
		if i == 10 || i == 11 {
			s.Failures = 3
			s.Successes = 7
		}
		if i == 10 {
			s.Delayed = 2
		}
		r.Timeline = append(r.Timeline, s)
	}
	for i := range 6 {
		r.FailureList = append(r.FailureList, load.Failure{AtMS: 1000 + float64(i*30), LatencyMS: 2000, Class: load.ErrTimeout, Error: "i/o timeout"})
	}
	return r
}

func TestReportNumbers(t *testing.T) {
	r := testReport()
	first, last, ok := r.FailureWindow()
	if diff := cmp.Diff([]any{0.0, 150.0, true}, []any{first, last, ok}); diff != "" {
		t.Errorf("FailureWindow (-want +got):\n%s", diff)
	}
	frac, n := r.SuccessAfter(r.SettledMS)
	if diff := cmp.Diff([]any{1.0, 80}, []any{frac, n}); diff != "" {
		t.Errorf("SuccessAfter(settled) (-want +got):\n%s", diff)
	}
	frac, n = r.SuccessAfter(0)
	if want := 194.0 / 200; frac != want || n != 200 {
		t.Errorf("SuccessAfter(0) = %v, %d; want %v, 200", frac, n, want)
	}
	if _, _, ok := (&Report{}).FailureWindow(); ok {
		t.Error("FailureWindow of a report without failures says ok")
	}
}

func TestWriteText(t *testing.T) {
	var b bytes.Buffer
	if err := testReport().WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"drill plug on lab shl0001 (3 nodes)",
		"heartbeat 100ms x 10",
		"plug pulled on node3 at 1.00 s",
		"every node converged without the node 1200 ms after the event",
		"failed 6",
		"failures started between +0.00 s and +0.15 s of the event: reset 2 timeout 4",
		"after it settled: 100.00% of 80 requests succeeded",
		"i/o timeout",
		"delayed by a SYN retransmission (connect >= 1s): 2 of 296 requests; 296 connects, p99 1003.00 ms",
		"     +40 ms   1003.0 ms   1005.0 ms",
		">     1.0      7     3     2",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text report lacks %q:\n%s", want, out)
		}
	}
	if got := strings.Count(out, "\n>"); got != 1 {
		t.Errorf("%d timeline rows marked as the event's, want 1", got)
	}
	// One timeline row per slot.
	if got := strings.Count(out, "\n  ") + strings.Count(out, "\n> "); got < 30 {
		t.Errorf("only %d indented rows, want the 30 timeline slots at least", got)
	}
}

func TestWriteJSONRoundTrip(t *testing.T) {
	r := testReport()
	var b bytes.Buffer
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var got Report
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(*r, got); diff != "" {
		t.Errorf("JSON round trip (-want +got):\n%s", diff)
	}
}

// svgElem is an element of the plot, with its id and the ids of its
// children.
type svgElem struct {
	name, id string
	children int
}

func parseSVG(t *testing.T, doc []byte) map[string]svgElem {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(doc))
	ids := map[string]svgElem{}
	var stack []string
	root := ""
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = e.Name.Local
			}
			if len(stack) > 0 {
				if p, ok := ids[stack[len(stack)-1]]; ok {
					p.children++
					ids[stack[len(stack)-1]] = p
				}
			}
			id := ""
			for _, a := range e.Attr {
				if a.Name.Local == "id" {
					id = a.Value
					if _, dup := ids[id]; dup {
						t.Errorf("id %q twice", id)
					}
					ids[id] = svgElem{name: e.Name.Local, id: id}
				}
			}
			stack = append(stack, id)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	return ids
}

func TestWriteSVG(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(*Report)
		want    []string // element ids that must be there
		notWant []string
		fails   int // children of the failures group: a bar and a marker per slot with failures
	}{
		{
			name:  "plug with failures",
			edit:  func(*Report) {},
			want:  []string{"series-node1", "series-node2", "series-node3", "failures", "event", "settled", "settling"},
			fails: 4,
		},
		{
			name: "not settled, no failures, a node only the counters name",
			edit: func(r *Report) {
				r.SettledMS = -1
				r.Failures, r.FailureList = 0, nil
				for i := range r.Timeline {
					r.Timeline[i].Failures = 0
				}
				r.Timeline[0].Packets = map[string]uint64{"node4": 1}
			},
			want:    []string{"series-node1", "series-node2", "series-node3", "series-node4", "failures", "event"},
			notWant: []string{"settled", "settling"},
		},
		{
			name:    "empty timeline",
			edit:    func(r *Report) { r.Timeline, r.DurationMS, r.Nodes = nil, 0, nil },
			want:    []string{"failures", "event"},
			notWant: []string{"series-node1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := testReport()
			tt.edit(r)
			var b bytes.Buffer
			if err := r.WriteSVG(&b); err != nil {
				t.Fatal(err)
			}
			ids := parseSVG(t, b.Bytes())
			for _, id := range tt.want {
				if _, ok := ids[id]; !ok {
					t.Errorf("no element %q in the plot", id)
				}
			}
			for _, id := range tt.notWant {
				if _, ok := ids[id]; ok {
					t.Errorf("element %q in the plot, want none", id)
				}
			}
			if got := ids["failures"].children; got != tt.fails {
				t.Errorf("failures group has %d elements, want %d", got, tt.fails)
			}
			if !strings.Contains(b.String(), r.EventLabel()) {
				t.Errorf("plot does not name the event %q", r.EventLabel())
			}
		})
	}
}

func TestSeriesShape(t *testing.T) {
	// node3's band must vanish after the event: its polygon's top edge
	// equals node2's from slot 10 on. Check through the points: each
	// series has 4 points per slot (2 on top, 2 on the bottom).
	r := testReport()
	var b bytes.Buffer
	if err := r.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	for _, n := range r.Nodes {
		i := strings.Index(b.String(), `id="series-`+n+`" points="`)
		if i < 0 {
			t.Fatalf("no series %s", n)
		}
		rest := b.String()[i+len(`id="series-`+n+`" points="`):]
		pts := strings.Fields(rest[:strings.Index(rest, `"`)])
		if len(pts) != 4*len(r.Timeline) {
			t.Errorf("series %s has %d points, want %d", n, len(pts), 4*len(r.Timeline))
		}
	}
}

func TestNiceAxis(t *testing.T) {
	tests := []struct{ in, top, step float64 }{
		{0, 10, 2}, {7, 8, 2}, {950, 1000, 200}, {1234, 1500, 500}, {18000, 20000, 5000},
	}
	for _, tt := range tests {
		top, step := niceAxis(tt.in)
		if top != tt.top || step != tt.step {
			t.Errorf("niceAxis(%v) = %v, %v; want %v, %v", tt.in, top, step, tt.top, tt.step)
		}
	}
}
