package control

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/shoalnet/shoal/agent/doctor"
	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/rules"
)

// fakeControl answers the API with fixed results and records requests.
type fakeControl struct {
	err  error
	last any
}

func (f *fakeControl) Status() Status { return Status{NodeName: "n1"} }
func (f *fakeControl) Doctor(ctx context.Context, cluster bool) []doctor.Report {
	return []doctor.Report{{Node: "n1", Checks: []doctor.Check{{Name: "cluster", Verdict: doctor.VerdictOK, Detail: fmt.Sprint(cluster)}}}}
}
func (f *fakeControl) Query() Query   { return Query{Self: "n1"} }
func (f *fakeControl) Params() Params { panic("params exploded") }
func (f *fakeControl) SetAdmin(_ context.Context, r AdminRequest) error {
	f.last = r
	return f.err
}
func (f *fakeControl) ListRules() []RuleInfo { return nil }
func (f *fakeControl) AddRule(_ context.Context, r RuleRequest) (RuleInfo, error) {
	f.last = r
	return RuleInfo{ID: 7}, f.err
}
func (f *fakeControl) RemoveRule(_ context.Context, t string) error { f.last = t; return f.err }
func (f *fakeControl) EditRule(_ context.Context, t string, r RuleEditRequest) (RuleInfo, error) {
	f.last = [2]any{t, r}
	return RuleInfo{ID: 3, Affinity: r.Affinity}, f.err
}
func (f *fakeControl) SetSettings(_ context.Context, r SettingsRequest) error {
	f.last = r
	return f.err
}
func (f *fakeControl) SetRuleState(_ context.Context, r RuleStateRequest) error {
	f.last = r
	return f.err
}
func (f *fakeControl) SetWeight(_ context.Context, r WeightRequest) error { f.last = r; return f.err }
func (f *fakeControl) SetPriority(_ context.Context, r PriorityRequest) error {
	f.last = r
	return f.err
}
func (f *fakeControl) Simulate(c, to netip.AddrPort, proto string) (Simulation, error) {
	f.last = [2]netip.AddrPort{c, to}
	return Simulation{Owner: "n2"}, f.err
}
func (f *fakeControl) Flow(_ context.Context, c, to netip.AddrPort, proto filter.Protocol, peers bool) (Flow, error) {
	f.last = fmt.Sprint(c, to, proto, peers)
	return Flow{Owner: "n3"}, f.err
}
func (f *fakeControl) Leave(context.Context) error                 { return f.err }
func (f *fakeControl) Plug(_ context.Context, r PlugRequest) error { f.last = r; return f.err }
func (f *fakeControl) Restart(_ context.Context, r RestartRequest) (RestartArmed, error) {
	f.last = r
	return RestartArmed{Window: r.Window}, f.err
}

func TestControlAPI(t *testing.T) {
	tests := []struct {
		name, method, path, body string
		err                      error
		code                     int
		contains                 string
	}{
		{"status", "GET", "/v1/status", "", nil, 200, `"node_name":"n1"`},
		{"admin ok", "POST", "/v1/admin", `{"state":"draining"}`, nil, 204, ""},
		{"not json", "POST", "/v1/admin", `{state:`, nil, 400, "bad request body"},
		{"unknown field", "POST", "/v1/admin", `{"stat":"x"}`, nil, 400, "unknown field"},
		{"wrong type", "POST", "/v1/weight", `{"weight":5}`, nil, 400, "bad request body"},
		{"huge body", "POST", "/v1/admin", `{"node":"` + strings.Repeat("x", 2<<20) + `"}`, nil, 400, "bad request body"},
		{"validation", "POST", "/v1/rules", `{"ports":"80"}`, fmt.Errorf("%w: overlaps rule 1", rules.ErrConflict), 400, "overlaps rule 1"},
		{"bad input", "POST", "/v1/weight", `{"weight":"x"}`, BadRequest("weight %q", "x"), 400, `weight \"x\"`},
		{"unknown node", "POST", "/v1/admin", `{"node":"zz","state":"stopped"}`, fmt.Errorf("%w: no node zz", rules.ErrUnknownNode), 404, "no node zz"},
		{"no quorum", "POST", "/v1/admin", `{"state":"stopped"}`, fmt.Errorf("%w: 1 of 3 voters", rules.ErrNoQuorum), 503, "1 of 3"},
		{"rule created", "POST", "/v1/rules", `{"ports":"80"}`, nil, 201, `"id":7`},
		{"remove", "DELETE", "/v1/rules/198.18.0.1:80", "", nil, 204, ""},
		{"edit", "PUT", "/v1/rules/198.18.0.1:80", `{"affinity":"single"}`, nil, 200, `"affinity":"single"`},
		{"edit unknown", "PUT", "/v1/rules/9", `{"affinity":"single"}`, fmt.Errorf("%w: rule 9", rules.ErrUnknownRule), 404, "rule 9"},
		{"edit bad field", "PUT", "/v1/rules/1", `{"weight":"1"}`, nil, 400, "unknown field"},
		{"settings", "POST", "/v1/settings", `{"hash_seed":7}`, nil, 204, ""},
		{"settings bad", "POST", "/v1/settings", `{"hash_seed":-1}`, nil, 400, "bad request body"},
		{"panic is a 500", "GET", "/v1/params", "", nil, 500, "params exploded"},
		{"wrong method", "GET", "/v1/admin", "", nil, 405, ""},
		{"no such path", "GET", "/v2/nothing", "", nil, 404, ""},
		{"simulate", "GET", "/v1/simulate?client=198.18.0.1:4000&to=198.18.0.100:80", "", nil, 200, `"owner":"n2"`},
		{"flow", "GET", "/v1/flow?client=198.18.0.1:4000&to=198.18.0.100:80/tcp", "", nil, 200, `"owner":"n3"`},
		{"flow here only", "GET", "/v1/flow?client=198.18.0.1:4000&to=198.18.0.100:53/udp&peers=0", "", nil, 200, `"owner":"n3"`},
		{"flow bad target", "GET", "/v1/flow?client=198.18.0.1:4000&to=198.18.0.100:80/sctp", "", nil, 400, "the protocol is tcp or udp"},
		{"restart armed", "POST", "/v1/restart", `{"window":5000000000}`, nil, 200, `"window":5000000000`},
		{"restart bad window", "POST", "/v1/restart", `{"window":"x"}`, nil, 400, "bad request body"},
		{"simulate bad", "GET", "/v1/simulate?client=x&to=198.18.0.100:80", "", nil, 400, "want client=IP:PORT"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := Handler(&fakeControl{err: tc.err})
			req := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.code || !strings.Contains(rec.Body.String(), tc.contains) {
				t.Errorf("%s %s: %d %q, want %d containing %q", tc.method, tc.path, rec.Code, rec.Body.String(), tc.code, tc.contains)
			}
		})
	}
}

func TestControlAPIPassesRequests(t *testing.T) {
	f := &fakeControl{}
	h := Handler(f)
	req := httptest.NewRequest("POST", "/v1/rules/state", strings.NewReader(`{"target":"all","state":"draining","all_nodes":true}`))
	h.ServeHTTP(httptest.NewRecorder(), req)
	want := RuleStateRequest{Target: "all", State: "draining", AllNodes: true}
	if f.last != want {
		t.Errorf("handler passed %+v, want %+v", f.last, want)
	}
	var _ http.Handler = h
}

func TestControlAPIFlowPassesRequests(t *testing.T) {
	for path, want := range map[string]string{
		"/v1/flow?client=198.18.0.1:4000&to=198.18.0.100:80/tcp":         "198.18.0.1:4000 198.18.0.100:80 tcp true",
		"/v1/flow?client=198.18.0.1:4000&to=198.18.0.100:80":             "198.18.0.1:4000 198.18.0.100:80 tcp true",
		"/v1/flow?client=198.18.0.1:4000&to=198.18.0.100:53/udp&peers=0": "198.18.0.1:4000 198.18.0.100:53 udp false",
	} {
		f := &fakeControl{}
		Handler(f).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", path, nil))
		if f.last != want {
			t.Errorf("GET %s passed %v, want %s", path, f.last, want)
		}
	}
}

func TestParsePorts(t *testing.T) {
	tests := []struct {
		in     string
		lo, hi uint16
		ok     bool
	}{
		{"80", 80, 80, true}, {"8000-8099", 8000, 8099, true}, {"0-65535", 0, 65535, true},
		{"", 0, 0, false}, {"90-80", 0, 0, false}, {"65536", 0, 0, false}, {"a-b", 0, 0, false}, {"-5", 0, 0, false},
	}
	for _, tc := range tests {
		lo, hi, err := parsePorts(tc.in)
		if (err == nil) != tc.ok || lo != tc.lo || hi != tc.hi {
			t.Errorf("parsePorts(%q) = %d, %d, %v", tc.in, lo, hi, err)
		}
	}
}
