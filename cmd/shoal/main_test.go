package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/urfave/cli/v2"

	"github.com/shoalnet/shoal/agent/config"
	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/filter"
)

// run runs the CLI with args and returns its output and exit code.
func run(t *testing.T, args ...string) (string, int) {
	t.Helper()
	app := newApp()
	var out bytes.Buffer
	app.Writer, app.ErrWriter = &out, &out
	err := app.RunContext(context.Background(), append([]string{"shoal"}, args...))
	if err != nil {
		out.WriteString(err.Error())
		return out.String(), exitCode(err)
	}
	return out.String(), 0
}

func TestEveryCommandIsDocumented(t *testing.T) {
	var check func(prefix string, cmds []*cli.Command)
	check = func(prefix string, cmds []*cli.Command) {
		for _, c := range cmds {
			if c.Name == "help" {
				continue // urfave/cli's own, added to a command once it has run
			}
			if c.Usage == "" || c.Description == "" {
				t.Errorf("command %q lacks Usage or Description", prefix+c.Name)
			}
			check(prefix+c.Name+" ", c.Subcommands)
		}
	}
	check("", newApp().Commands)
}

func TestIP2MAC(t *testing.T) {
	out, code := run(t, "ip2mac", "198.18.7.100")
	if code != 0 || !strings.Contains(out, "03:bf:c6:12:07:64") || !strings.Contains(out, "arp 198.18.7.100 03bf.c612.0764 ARPA") {
		t.Errorf("exit %d, output:\n%s", code, out)
	}
	out, code = run(t, "ip2mac", "2001:db8::c612:764")
	if code != 0 || !strings.Contains(out, "03:be:c6:12:07:64") || !strings.Contains(out, "ip -6 neigh replace 2001:db8::c612:764 lladdr 03:be:c6:12:07:64 nud permanent") ||
		!strings.Contains(out, "ipv6 neighbor 2001:db8::c612:764 <interface> 03be.c612.0764") {
		t.Errorf("IPv6 VIP: exit %d, output:\n%s", code, out)
	}
	for _, bad := range []string{"nonsense", "::ffff:198.18.7.100", "fe80::1%eth0"} {
		if _, code := run(t, "ip2mac", bad); code != exitUsage {
			t.Errorf("ip2mac %s: exit %d, want %d", bad, code, exitUsage)
		}
	}
	out, code = run(t, "ip2mac", "--mac-mode", "igmp", "198.18.7.100")
	if code != 0 || !strings.Contains(out, "01:00:5e:7f:07:64") || !strings.Contains(out, "group every node joins: 239.255.7.100") ||
		!strings.Contains(out, "lladdr 01:00:5e:7f:07:64 nud permanent") {
		t.Errorf("igmp mode: exit %d, output:\n%s", code, out)
	}
	out, code = run(t, "ip2mac", "--mac-mode", "igmp", "2001:db8::c612:764")
	if code != 0 || !strings.Contains(out, "33:33:ef:ff:07:64") || !strings.Contains(out, "mld group every node joins: ff05::efff:764") {
		t.Errorf("igmp mode, IPv6: exit %d, output:\n%s", code, out)
	}
	if _, code := run(t, "ip2mac", "--mac-mode", "unicast", "198.18.7.100"); code != exitUsage {
		t.Errorf("bad mode: exit %d, want %d", code, exitUsage)
	}
	if _, code := run(t, "ip2mac", "nonsense"); code != exitUsage {
		t.Errorf("bad address: exit %d, want %d", code, exitUsage)
	}
	if _, code := run(t, "ip2mac"); code != exitUsage {
		t.Errorf("no address: exit %d, want %d", code, exitUsage)
	}
}

func TestKeygen(t *testing.T) {
	p := filepath.Join(t.TempDir(), "cluster.key")
	if out, code := run(t, "keygen", p); code != 0 {
		t.Fatalf("keygen: exit %d: %s", code, out)
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, err %v", st.Mode(), err)
	}
	if k, err := config.ReadKey(p); err != nil || len(k) != 32 {
		t.Errorf("the agent cannot read the key: %v", err)
	}
	if _, code := run(t, "keygen", p); code == 0 {
		t.Error("keygen overwrote an existing key")
	}
}

func TestAgentDownExitCode(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	out, code := run(t, "--socket", sock, "status")
	if code != exitAgentDown || !strings.Contains(out, "no shoal agent is running") {
		t.Errorf("exit %d, output %q; want %d and a clear message", code, out, exitAgentDown)
	}
}

func TestAgentCheckRejectsBadConfig(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(p, []byte("node_name: n1\ninterface: eth0\nvips: [198.18.7.100]\n"), 0o600)
	out, code := run(t, "agent", "--config", p, "--check")
	if code != exitUsage || !strings.Contains(out, "data_dir") || !strings.Contains(out, "heartbeat_addr") {
		t.Errorf("exit %d, output:\n%s", code, out)
	}
}

// fakeAgent serves canned control API answers on a Unix socket and records
// the requests it gets.
type fakeAgent struct {
	mu       sync.Mutex
	requests []string
	status   control.Status
	query    control.Query
}

func startFake(t *testing.T, f *fakeAgent) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "shoal.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		var body bytes.Buffer
		body.ReadFrom(r.Body)
		f.mu.Lock()
		f.requests = append(f.requests, r.Method+" "+r.URL.Path+" "+strings.TrimSpace(body.String()))
		st, q := f.status, f.query
		f.mu.Unlock()
		switch r.URL.Path {
		case "/v1/status":
			json.NewEncoder(w).Encode(st)
		case "/v1/query":
			json.NewEncoder(w).Encode(q)
		case "/v1/restart":
			json.NewEncoder(w).Encode(control.RestartArmed{Window: control.DefaultRestartWindow, Until: time.Now().Add(time.Minute)})
		case "/v1/admin":
			var req control.AdminRequest
			json.Unmarshal(body.Bytes(), &req)
			if req.State == "bogus" {
				w.WriteHeader(http.StatusBadRequest)
				json.NewEncoder(w).Encode(control.APIError{Error: "admin state \"bogus\": want started"})
				return
			}
			f.mu.Lock()
			if req.State == "draining" {
				f.status.Admin, f.status.Connections = "draining", 2
			}
			f.mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return sock
}

func TestStatusJSON(t *testing.T) {
	f := &fakeAgent{status: control.Status{NodeID: 2, NodeName: "node2", Admin: "started", Healthy: true, Converged: true,
		Accepting: map[filter.RuleID]int{1: 1365}}}
	sock := startFake(t, f)
	out, code := run(t, "--socket", sock, "status", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	var got control.Status
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("status --json is not JSON: %v\n%s", err, out)
	}
	if diff := cmp.Diff(f.status, got); diff != "" {
		t.Errorf("status --json (-want +got):\n%s", diff)
	}
	out, _ = run(t, "--socket", sock, "status")
	if !strings.Contains(out, "node node2 (id 2): started, healthy") || !strings.Contains(out, "1365") {
		t.Errorf("status text:\n%s", out)
	}
}

func TestDrainstopTimeout(t *testing.T) {
	f := &fakeAgent{status: control.Status{NodeName: "node1", Admin: "started"}}
	sock := startFake(t, f)
	out, code := run(t, "--socket", sock, "drainstop", "--timeout", "300ms")
	if code != exitTimeout || !strings.Contains(out, "2 connections cut") {
		t.Errorf("exit %d, output:\n%s\nwant exit %d and the cut connections counted", code, out, exitTimeout)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	last := f.requests[len(f.requests)-1]
	if !strings.Contains(last, "/v1/admin") || !strings.Contains(last, `"stopped"`) {
		t.Errorf("after the timeout the node was not stopped; last request %q", last)
	}
}

func TestDrainstopFinishes(t *testing.T) {
	f := &fakeAgent{status: control.Status{NodeName: "node1", Admin: "started"}}
	sock := startFake(t, f)
	go func() {
		// The agent finishes the drain a little later.
		for {
			f.mu.Lock()
			n := len(f.requests)
			if n >= 4 {
				f.status.Admin, f.status.Connections = "stopped", 0
				f.mu.Unlock()
				return
			}
			f.mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
	}()
	out, code := run(t, "--socket", sock, "drainstop", "--timeout", "10s")
	if code != 0 || !strings.Contains(out, "stopped after") {
		t.Errorf("exit %d, output:\n%s", code, out)
	}
}

// TestDrainstopWaitsForTheDrainedNode: asked through another node,
// drainstop returns once the drained node itself has applied its stop (its
// heartbeats advertise the rules index the node asked holds), not as soon
// as the node asked has: a query of the drained node then says stopped.
func TestDrainstopWaitsForTheDrainedNode(t *testing.T) {
	f := &fakeAgent{status: control.Status{NodeName: "node1", Admin: "started"}, query: control.Query{RulesIndex: 7,
		Nodes: []control.NodeInfo{{Name: "node1", Admin: "started", Live: true, RulesIndex: 7},
			{Name: "node3", Admin: "stopped", Live: true, RulesIndex: 6}}}}
	sock := startFake(t, f)
	done := make(chan struct{})
	go func() {
		out, code := run(t, "--socket", sock, "drainstop", "--node", "node3", "--timeout", "10s")
		if code != 0 || !strings.Contains(out, "node3: stopped after") {
			t.Errorf("exit %d, output:\n%s", code, out)
		}
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("drainstop returned while node3 had not applied its stop")
	case <-time.After(500 * time.Millisecond):
	}
	f.mu.Lock()
	f.query.Nodes[1].RulesIndex = 7
	f.mu.Unlock()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("drainstop did not return once node3 applied its stop")
	}
}

func TestAPIErrorsReachTheUser(t *testing.T) {
	sock := startFake(t, &fakeAgent{})
	out, code := run(t, "--socket", sock, "start", "extra")
	if code != exitUsage {
		t.Errorf("start with an argument: exit %d (%s), want usage", code, out)
	}
	out, code = run(t, "--socket", sock, "weight", "set", "1", "node1")
	if code != exitUsage || !strings.Contains(out, "want <rule> <node>") {
		t.Errorf("weight set with two args: exit %d: %s", code, out)
	}
	out, code = run(t, "--socket", sock, "enable", "198.18.7.100:80", "--node", "a", "--all-nodes")
	if code != exitUsage {
		t.Errorf("--node with --all-nodes: exit %d: %s", code, out)
	}
}

func TestAgentProcs(t *testing.T) {
	none := func(string) string { return "" }
	if got := agentProcs(none); got != 1 {
		t.Errorf("agentProcs without GOMAXPROCS = %d, want 1", got)
	}
	set := func(k string) string {
		if k == "GOMAXPROCS" {
			return "3"
		}
		return ""
	}
	if got, want := agentProcs(set), runtime.GOMAXPROCS(0); got != want {
		t.Errorf("agentProcs with GOMAXPROCS set = %d, want the runtime's %d", got, want)
	}
}
