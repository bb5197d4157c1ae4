package main

import (
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoalnet/shoal/agent/control"
)

func TestQueryFlow(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "shoal.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var asked []string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked = append(asked, r.URL.RawQuery)
		if r.URL.Path != "/v1/flow" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		if r.URL.Query().Get("to") == "198.18.0.99:80" {
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(control.APIError{Error: "198.18.0.99 is not a VIP of this cluster"})
			return
		}
		json.NewEncoder(w).Encode(control.Flow{Client: "198.18.5.7:51234", To: "198.18.0.100:80", Proto: "tcp", Rule: 1,
			RuleDesc: "198.18.0.100:80/tcp, multiple host, affinity none, enabled", Affinity: "none", Key: "198.18.5.7:51234",
			Hash: 0xdeadbeef, Bucket: 3823, View: []string{"web1", "web2"}, Converged: true, Owner: "web2",
			IfDown: map[string]string{"web1": "web2", "web2": "web1"},
			Nodes: []control.FlowNode{{Name: "web1", State: "not_owned"}, {Name: "web2", State: "owned", HoldsFlow: true, BucketHeld: true},
				{Name: "web3", Error: "not live"}}})
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })

	out, code := run(t, "--socket", sock, "query", "--flow", "198.18.5.7:51234", "198.18.0.100:80/tcp")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	for _, want := range []string{"rule      1: 198.18.0.100:80/tcp", "flow key  198.18.5.7:51234 (affinity none), hash 0xdeadbeef, bucket 3823",
		"owner     web2 (view: web1 web2; converged)", "web2  owned      yes", "web3  ?", "web2 down -> web1"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if len(asked) != 1 || asked[0] != "client=198.18.5.7%3A51234&to=198.18.0.100%3A80%2Ftcp" {
		t.Errorf("asked %q", asked)
	}
	if _, code := run(t, "--socket", sock, "query", "--local", "--flow", "198.18.5.7:51234", "198.18.0.100:80"); code != 0 || !strings.Contains(asked[len(asked)-1], "peers=0") {
		t.Errorf("--local: exit %d, asked %q", code, asked[len(asked)-1])
	}
	for _, args := range [][]string{
		{"query", "--flow", "198.18.5.7", "198.18.0.100:80"},  // no port
		{"query", "--flow", "198.18.5.7:1"},                   // no target
		{"query", "198.18.0.100:80"},                          // target without --flow
		{"query", "--flow", "198.18.5.7:1", "198.18.0.99:80"}, // the agent says no
	} {
		if out, code := run(t, append([]string{"--socket", sock}, args...)...); code != exitUsage {
			t.Errorf("%q: exit %d, want %d: %s", args, code, exitUsage, out)
		}
	}
}
