package main

import (
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoalnet/shoal/agent/doctor"
)

func TestDoctor(t *testing.T) {
	ok := doctor.Check{Name: "ports", Verdict: doctor.VerdictOK, Detail: "reachable"}
	warn := doctor.Check{Name: "clock", Verdict: doctor.VerdictWarn, Detail: "not synchronised", Fix: "run chrony"}
	fail := doctor.Check{Name: "cluster_mac", Verdict: doctor.VerdictFail, Detail: "frames from node2 do not reach this node", Fix: "MAC address spoofing"}
	tests := []struct {
		name  string
		args  []string
		reps  []doctor.Report
		path  string
		code  int
		out   []string
		notIn string
	}{
		{"passes with a warning", []string{"doctor"}, []doctor.Report{{Node: "node1", Checks: []doctor.Check{ok, warn}}},
			"/v1/doctor", 0, []string{"node1", "ok    ports", "warn  clock", "fix: run chrony"}, "FAIL"},
		{"a failed check exits 1", []string{"doctor", "--cluster"}, []doctor.Report{{Node: "node1", Checks: []doctor.Check{ok}}, {Node: "node3", Checks: []doctor.Check{fail}}},
			"/v1/doctor?cluster=true", exitError, []string{"node3", "FAIL  cluster_mac", "fix: MAC address spoofing", "failed: node3 cluster_mac"}, ""},
		{"json", []string{"doctor", "--json"}, []doctor.Report{{Node: "node1", Checks: []doctor.Check{fail}}},
			"/v1/doctor", exitError, []string{`"verdict": "fail"`}, ""},
		{"bad neighbor", []string{"doctor", "--neighbor", "nonsense"}, nil, "", exitUsage, []string{"not an IPv4 or IPv6 address"}, ""},
		{"bad mode", []string{"doctor", "--neighbor", "198.18.1.100", "--mac-mode", "unicast"}, nil, "", exitUsage, []string{"want multicast or igmp"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "shoal.sock")
			l, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			var got string
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got = r.URL.RequestURI()
				json.NewEncoder(w).Encode(tt.reps)
			})}
			go srv.Serve(l)
			t.Cleanup(func() { srv.Close() })
			out, code := run(t, append([]string{"--socket", sock}, tt.args...)...)
			if code != tt.code {
				t.Errorf("exit %d, want %d; output:\n%s", code, tt.code, out)
			}
			if got != tt.path {
				t.Errorf("asked %q, want %q", got, tt.path)
			}
			for _, s := range tt.out {
				if !strings.Contains(out, s) {
					t.Errorf("output lacks %q:\n%s", s, out)
				}
			}
			if tt.notIn != "" && strings.Contains(out, tt.notIn) {
				t.Errorf("output has %q:\n%s", tt.notIn, out)
			}
		})
	}
}
