package statuspage

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/shoalnet/shoal/agent/announce"
	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
)

type fakePageSource struct {
	q  control.Query
	st control.Status
	p  control.Params
	h  HistorySnapshot
}

func (f *fakePageSource) Status() control.Status   { return f.st }
func (f *fakePageSource) Query() control.Query     { return f.q }
func (f *fakePageSource) Params() control.Params   { return f.p }
func (f *fakePageSource) History() HistorySnapshot { return f.h }

func TestStatusPage(t *testing.T) {
	src := &fakePageSource{
		q: control.Query{Self: "web1", Converged: true, RulesIndex: 7, Nodes: []control.NodeInfo{
			{ID: 1, Name: "web1", Admin: "started", Live: true, Eligible: true},
			{ID: 2, Name: "web2", Admin: "draining", Live: true, APIAddr: "198.18.0.12:7948"},
			{ID: 3, Name: "web3", Admin: "started", Live: true, APIAddr: "198.18.0.13:7948"},
			{ID: 4, Name: "web4", Admin: "started", Live: false, APIAddr: "198.18.0.14:7948"},
		}, Rules: []control.RuleInfo{{ID: 1, VIP: "198.18.0.100", Ports: "80", Proto: "tcp"}},
			BGP: &control.BGPInfo{Sessions: []announce.Session{{Neighbor: netip.MustParseAddr("198.18.0.1"), ASN: 65000, State: "established", BFD: "up"}},
				Announced: map[netip.Addr]time.Time{netip.MustParseAddr("198.18.0.100"): time.Unix(1, 0)}}},
		st: control.Status{Admin: "started", Converged: true, Connections: 5, Draining: map[filter.RuleID]int{1: 3}},
		p: control.Params{Packets: map[filter.RuleID]control.PacketCounters{
			0: {Accepted: 1, Dropped: map[string]uint64{"not_owned": 2}},
			1: {Accepted: 10, Dropped: map[string]uint64{"not_owned": 20, "draining": 1}},
		}},
	}
	var asked atomic.Int32
	peers := func(ctx context.Context, addr string) (NodeSample, error) {
		asked.Add(1)
		if addr == "198.18.0.13:7948" {
			return NodeSample{}, errors.New("connection refused")
		}
		return NodeSample{Admin: "draining", Accepted: 100, Connections: 2, Draining: 40}, nil
	}
	srv := httptest.NewServer(Handler(src, peers))
	t.Cleanup(srv.Close)
	get := func(path string) (string, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", path, resp.Status)
		}
		return string(b), resp.Header.Get("Content-Type")
	}

	html, ctype := get("/")
	if !strings.HasPrefix(ctype, "text/html") || !strings.Contains(html, `src="statuspage/app.js"`) {
		t.Errorf("GET /: %s\n%s", ctype, html)
	}
	// Everything the page loads comes from the agent itself.
	for _, m := range regexp.MustCompile(`(?:src|href)="([^"]+)"`).FindAllStringSubmatch(html, -1) {
		if strings.Contains(m[1], "//") {
			t.Errorf("the page loads %s from elsewhere", m[1])
			continue
		}
		if !strings.HasPrefix(m[1], "statuspage/") {
			continue // status.json, and /metrics beside the page
		}
		if _, ctype := get("/" + m[1]); ctype == "" {
			t.Errorf("%s has no content type", m[1])
		}
	}
	if js, _ := get("/statuspage/app.js"); !strings.Contains(js, "status.json") {
		t.Error("app.js does not read status.json")
	}

	body, _ := get("/status.json")
	var page StatusPage
	if err := json.Unmarshal([]byte(body), &page); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, n := range page.Nodes {
		switch {
		case n.Sample != nil:
			got[n.Name] = n.Sample.Admin
		default:
			got[n.Name] = "error: " + n.SampleError
		}
	}
	if b := page.BGP; b == nil || len(b.Sessions) != 1 || b.Sessions[0].State != "established" || len(b.Announced) != 1 {
		t.Errorf("the page's bgp: %+v, want the node's one session and one announcement", b)
	}
	if js, _ := get("/statuspage/app.js"); !strings.Contains(js, "bgp-section") {
		t.Error("app.js does not show the bgp sessions")
	}
	want := map[string]string{"web1": "started", "web2": "draining", "web3": "error: connection refused", "web4": "error: not live"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("samples (-want +got):\n%s", diff)
	}
	if s := page.Nodes[0].Sample; s.Accepted != 11 || s.Dropped != 23 || s.Connections != 5 || s.Draining != 3 {
		t.Errorf("this node's sample: %+v, want 11 accepted, 23 dropped, 5 connections, 3 draining", s)
	}
	if len(page.Rules) != 1 || !page.Converged || page.RulesIndex != 7 {
		t.Errorf("page: %+v", page)
	}
	// A second viewer within the cache's lifetime asks no peer again.
	n := asked.Load()
	get("/status.json")
	if asked.Load() != n {
		t.Errorf("peers asked again within %v", pageCacheTTL)
	}
}

func TestViewHistory(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	view := func(idx uint64, ids ...uint32) heartbeat.View { return heartbeat.View{Eligible: ids, RulesIndex: idx} }
	peer := func(id uint32, live bool, heard int, admin heartbeat.AdminState, healthy bool) heartbeat.PeerStatus {
		return heartbeat.PeerStatus{ID: id, Live: live, LastHeard: at(heard), Admin: admin, Healthy: healthy}
	}
	up := func(id uint32, heard int) heartbeat.PeerStatus { return peer(id, true, heard, heartbeat.Started, true) }
	name := func(id filter.NodeID) string { return map[filter.NodeID]string{1: "web1", 2: "web2", 3: "web3"}[id] }

	type step struct {
		ms int
		st ViewState
	}
	for _, tc := range []struct {
		name      string
		steps     []step
		causes    []string // newest first
		converged []string // how long each took, newest first
		failovers []Failover
	}{
		{
			name: "a silent peer is dead, then its share is taken",
			steps: []step{
				{0, ViewState{view(5, 1, 2, 3), true, []heartbeat.PeerStatus{up(2, 0), up(3, 0)}}},
				{1000, ViewState{view(5, 1, 2), false, []heartbeat.PeerStatus{up(2, 990), peer(3, false, 100, heartbeat.Started, true)}}},
				{1050, ViewState{view(5, 1, 2), true, []heartbeat.PeerStatus{up(2, 1040), peer(3, false, 100, heartbeat.Started, true)}}},
				// It is heard again before it is eligible again: still "back".
				{2000, ViewState{view(5, 1, 2), true, []heartbeat.PeerStatus{up(2, 1990), up(3, 1990)}}},
				{2200, ViewState{view(5, 1, 2, 3), false, []heartbeat.PeerStatus{up(2, 2190), up(3, 2190)}}},
			},
			causes:    []string{"web3 is back", "web3 dead: no heartbeat for 900ms"},
			converged: []string{"never", "50ms"},
			failovers: []Failover{{Node: "web3", LastSeen: at(100), Duration: 950 * time.Millisecond}},
		},
		{
			name: "a drain, a health failure, a return and a rule change",
			steps: []step{
				{0, ViewState{view(5, 1, 2, 3), true, []heartbeat.PeerStatus{up(2, 0), up(3, 0)}}},
				{100, ViewState{view(5, 1, 3), true, []heartbeat.PeerStatus{peer(2, true, 90, heartbeat.Draining, true), up(3, 90)}}},
				{200, ViewState{view(5, 1), false, []heartbeat.PeerStatus{peer(2, true, 190, heartbeat.Draining, true), peer(3, true, 190, heartbeat.Started, false)}}},
				{300, ViewState{view(6, 1, 2, 3), true, []heartbeat.PeerStatus{up(2, 290), up(3, 290)}}},
			},
			causes: []string{"web2 joined; web3 joined; rules changed (index 5 -> 6)", "web3 health check failed", "web2 is draining"},
			// The second change never converged before the third.
			converged: []string{"0s", "never", "0s"},
		},
		{
			name: "a dead peer comes back",
			steps: []step{
				{0, ViewState{view(5, 1), true, []heartbeat.PeerStatus{peer(2, false, 0, heartbeat.Started, true)}}},
				{500, ViewState{view(5, 1, 2), false, []heartbeat.PeerStatus{up(2, 490)}}},
			},
			causes:    []string{"web2 is back"},
			converged: []string{"never"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHistory(1)
			var logged []string // what the agent logs: each change once, with its cause
			for _, s := range tc.steps {
				if vc, ok := h.Observe(at(s.ms), s.st, name); ok {
					logged = append([]string{vc.Cause}, logged...)
				}
			}
			snap := h.Snapshot()
			var causes []string
			var conv []string
			for _, v := range snap.views {
				causes = append(causes, v.Cause)
				c := "never"
				if v.Converged {
					c = v.ConvergedAfter.String()
				}
				conv = append(conv, c)
			}
			if diff := cmp.Diff(causes, logged, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("logged view changes differ from the recorded ones (-recorded +logged):\n%s", diff)
			}
			if diff := cmp.Diff(tc.causes, causes); diff != "" {
				t.Errorf("causes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.converged, conv); diff != "" {
				t.Errorf("converged after (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.failovers, snap.failovers); diff != "" {
				t.Errorf("failovers (-want +got):\n%s", diff)
			}
		})
	}
}

func TestViewHistoryIsBounded(t *testing.T) {
	h := NewHistory(1)
	name := func(filter.NodeID) string { return "n" }
	for i := range 3 * maxViewChanges {
		h.Observe(time.Unix(int64(i), 0), ViewState{View: heartbeat.View{Eligible: []uint32{1}, RulesIndex: uint64(i)}}, name)
	}
	if n := len(h.Snapshot().views); n != maxViewChanges {
		t.Errorf("%d view changes kept, want %d", n, maxViewChanges)
	}
	var nilHistory *History
	nilHistory.Observe(time.Now(), ViewState{}, name) // before registration: no panic
	if s := nilHistory.Snapshot(); len(s.views) != 0 {
		t.Error("a nil history has views")
	}
}

// TestStatusPageScriptParses catches a syntax error in the page's script
// before a browser does (the browser test needs a lab).
func TestStatusPageScriptParses(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed; the browser test covers the script")
	}
	if out, err := exec.Command(node, "--check", "app.js").CombinedOutput(); err != nil {
		t.Errorf("app.js: %v\n%s", err, out)
	}
}
