package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/shoalnet/shoal/agent/control"
)

// recordingAgent answers `rules set` and `settings` requests and records
// what it was sent.
type recordingAgent struct {
	mu  sync.Mutex
	got []string
}

func (f *recordingAgent) start(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "shoal.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.got = append(f.got, strings.TrimSpace(r.Method+" "+r.URL.Path+" "+string(b)))
		f.mu.Unlock()
		switch {
		case r.Method == "PUT":
			var req control.RuleEditRequest
			json.Unmarshal(b, &req)
			json.NewEncoder(w).Encode(control.RuleInfo{ID: 1, VIP: "198.18.7.100", Ports: "80", Proto: "tcp", Mode: "multiple", Affinity: req.Affinity})
		case r.URL.Path == "/v1/query":
			json.NewEncoder(w).Encode(control.Query{Settings: control.SettingInfo{ClusterID: 0xabc, HashSeed: 42, HeartbeatPeriod: "75ms", HeartbeatTolerance: 12, MACMode: "igmp"}})
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return sock
}

func TestRulesSetAndSettings(t *testing.T) {
	tests := []struct {
		name string
		args []string
		code int
		sent string // the first request, "" if none may be sent
		out  string
	}{
		{"rules set", []string{"rules", "set", "--affinity", "single", "--ports", "80-81", "198.18.7.100:80"}, 0,
			`PUT /v1/rules/198.18.7.100:80 {"ports":"80-81","affinity":"single"}`, "rule 1 is now 198.18.7.100:80/tcp multiple affinity single"},
		{"rules set by id", []string{"rules", "set", "--vip", "all", "7"}, 0, `PUT /v1/rules/7 {"vip":"all"}`, "rule 1"},
		{"rules set nothing", []string{"rules", "set", "1"}, exitUsage, "", "nothing to change"},
		{"rules set no rule", []string{"rules", "set", "--affinity", "none"}, exitUsage, "", "want exactly one argument"},
		{"settings set seed", []string{"settings", "set", "--hash-seed", "42"}, 0, `POST /v1/settings {"hash_seed":42}`, "hash seed 42"},
		{"settings set seed 0", []string{"settings", "set", "--hash-seed", "0"}, 0, `POST /v1/settings {"hash_seed":0}`, "hash seed"},
		{"settings set heartbeat", []string{"settings", "set", "--heartbeat-period", "50ms", "--heartbeat-tolerance", "10"}, 0,
			`POST /v1/settings {"heartbeat_period":"50ms","heartbeat_tolerance":10}`, "heartbeat period 75ms, tolerance 12"},
		{"settings set nothing", []string{"settings", "set"}, exitUsage, "", "nothing to change"},
		{"settings set mac mode", []string{"settings", "set", "--mac-mode", "igmp"}, 0, `POST /v1/settings {"mac_mode":"igmp"}`, "mac mode igmp"},
		{"settings set bad mac mode", []string{"settings", "set", "--mac-mode", "unicast"}, exitUsage, "", "want multicast, igmp or routed"},
		{"settings seed too big", []string{"settings", "set", "--hash-seed", "4294967296"}, exitUsage, "", "over 4294967295"},
		{"settings show", []string{"settings", "show"}, 0, "GET /v1/query", "cluster id 00000abc"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &recordingAgent{}
			sock := f.start(t)
			out, code := run(t, append([]string{"--socket", sock}, tc.args...)...)
			if code != tc.code || !strings.Contains(out, tc.out) {
				t.Errorf("exit %d, output %q; want %d containing %q", code, out, tc.code, tc.out)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			switch {
			case tc.sent == "" && len(f.got) > 0:
				t.Errorf("sent %q, want nothing", f.got)
			case tc.sent != "" && (len(f.got) == 0 || f.got[0] != tc.sent):
				t.Errorf("sent %q, want first %q", f.got, tc.sent)
			}
		})
	}
}
