package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// doctorCheck and doctorReport mirror agent.DoctorCheck and DoctorReport
// (the lab imports no shoal package), as `shoal doctor --json` prints them.
type doctorCheck struct {
	Name    string `json:"name"`
	Verdict string `json:"verdict"`
	Detail  string `json:"detail"`
	Fix     string `json:"fix"`
}

type doctorReport struct {
	Node   string        `json:"node"`
	Checks []doctorCheck `json:"checks"`
}

// doctor runs `shoal doctor --json args...` against node's agent and
// returns the reports and the exit code.
func doctor(ctx context.Context, t *testing.T, l *Lab, node string, args ...string) ([]doctorReport, int) {
	t.Helper()
	out, err := l.CLI(ctx, node, append([]string{"doctor", "--json"}, args...)...)
	return parseDoctor(t, out, err)
}

func parseDoctor(t *testing.T, out []byte, err error) ([]doctorReport, int) {
	t.Helper()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("shoal doctor: %v", err)
	}
	var reps []doctorReport
	if err := json.Unmarshal(out, &reps); err != nil {
		t.Fatalf("shoal doctor --json: %v: %s", err, out)
	}
	return reps, code
}

// verdicts returns "name=verdict" of each failed check of every report.
func failures(reps []doctorReport) []string {
	var out []string
	for _, r := range reps {
		for _, c := range r.Checks {
			if c.Verdict == "fail" {
				out = append(out, r.Node+" "+c.Name+": "+c.Detail)
			}
		}
	}
	return out
}

func checkOf(reps []doctorReport, node, name string) doctorCheck {
	for _, r := range reps {
		if r.Node != node {
			continue
		}
		for _, c := range r.Checks {
			if c.Name == name {
				return c
			}
		}
	}
	return doctorCheck{}
}

// nft loads rules into nftables in namespace ns and removes the table
// they make in t.Cleanup.
func nft(t *testing.T, ns, family, table, rules string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(fmt.Sprintf("table %s %s {\n%s\n}\n", family, table, rules))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft in %s: %v: %s", ns, err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "exec", ns, "nft", "delete", "table", family, table).Run() })
}

// TestDoctor: `shoal doctor` passes on every node of a healthy lab (and
// --cluster from one node), and fails naming the cause when the lab is
// broken on purpose: a node's bridge port that drops the cluster MAC, a
// client's wrong static neighbour entry for the VIP, a node whose
// heartbeat port is blocked.
func TestDoctor(t *testing.T) {
	needRoot(t)
	if testing.Short() {
		t.Skip("builds shoal and a 3-node lab; skipped with -short")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft (nftables) to break the lab")
	}
	bin := buildShoal(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l := upLab(ctx, t, Options{Nodes: 3, Binary: bin})
	// A little traffic: the client resolves the VIP, the nodes answer ARP.
	if res, err := l.Load(ctx, LoadArgs{Duration: 300 * time.Millisecond, Concurrency: 1}, nil); err != nil || res.Failures > 0 {
		t.Fatalf("traffic: %+v, %v", res, err)
	}
	clientDoctor := func(t *testing.T) ([]doctorReport, int) {
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", l.Client.Namespace, bin, "doctor", "--json", "--neighbor", l.VIP.String()).Output()
		return parseDoctor(t, out, err)
	}

	t.Run("healthy", func(t *testing.T) {
		for _, n := range l.Nodes {
			reps, code := doctor(ctx, t, l, n.Name)
			if code != 0 || len(failures(reps)) > 0 {
				t.Errorf("%s: exit %d, failed %v", n.Name, code, failures(reps))
			}
			if c := checkOf(reps, n.Name, "gateway"); c.Verdict != "ok" {
				t.Errorf("%s: gateway %s: %s (the client resolved the VIP)", n.Name, c.Verdict, c.Detail)
			}
		}
		reps, code := doctor(ctx, t, l, "node1", "--cluster")
		if code != 0 || len(reps) != 3 || len(failures(reps)) > 0 {
			t.Errorf("--cluster: exit %d, %d reports, failed %v", code, len(reps), failures(reps))
		}
		if reps, code := clientDoctor(t); code != 0 || checkOf(reps, "this host", "neighbour").Verdict != "ok" {
			t.Errorf("client --neighbor: exit %d, %+v", code, reps)
		}
	})

	t.Run("bridge port drops the cluster MAC", func(t *testing.T) {
		nft(t, l.Switch, "bridge", "shoal_doctor_test", fmt.Sprintf(
			"chain forward { type filter hook forward priority 0; ether daddr %s oifname %q drop; }", l.State.ClusterMAC(), l.Nodes[2].BridgePort))
		reps, code := doctor(ctx, t, l, "node3")
		c := checkOf(reps, "node3", "cluster_mac")
		if code != 1 || c.Verdict != "fail" || !strings.Contains(c.Detail, "from node1") || !strings.Contains(c.Detail, "node2") ||
			!strings.Contains(c.Detail, "do not reach this node") || !strings.Contains(c.Fix, "forged transmits") {
			t.Errorf("node3: exit %d, cluster_mac %s: %s (fix %s)", code, c.Verdict, c.Detail, c.Fix)
		}
		if f := failures(reps); len(f) != 1 {
			t.Errorf("node3: failed %v, want cluster_mac only", f)
		}
		reps, code = doctor(ctx, t, l, "node1")
		if c := checkOf(reps, "node1", "cluster_mac"); code != 1 || !strings.Contains(c.Detail, "do not reach node3") {
			t.Errorf("node1: exit %d, cluster_mac %s: %s", code, c.Verdict, c.Detail)
		}
	})

	t.Run("client with a wrong neighbour entry", func(t *testing.T) {
		const wrong = "02:00:00:00:00:99"
		if _, err := ip(ctx, "-n", l.Client.Namespace, "neigh", "replace", l.VIP.String(), "lladdr", wrong, "nud", "permanent", "dev", Interface); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ip(context.Background(), "-n", l.Client.Namespace, "neigh", "del", l.VIP.String(), "dev", Interface)
		})
		reps, code := clientDoctor(t)
		c := checkOf(reps, "this host", "neighbour")
		if code != 1 || c.Verdict != "fail" || !strings.Contains(c.Detail, wrong+" (PERMANENT), want the cluster MAC "+l.State.ClusterMAC()) ||
			!strings.Contains(c.Fix, "ip neigh replace "+l.VIP.String()+" lladdr "+l.State.ClusterMAC()) {
			t.Errorf("client: exit %d, neighbour %s: %s (fix %s)", code, c.Verdict, c.Detail, c.Fix)
		}
	})

	t.Run("heartbeat port blocked", func(t *testing.T) {
		nft(t, l.Nodes[2].Namespace, "inet", "shoal_doctor_test", fmt.Sprintf(
			"chain input { type filter hook input priority 0; udp dport %d drop; }", HeartbeatPort))
		var reps []doctorReport
		var code int
		// The peers turn silent for node3 once T periods pass.
		err := Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error {
			reps, code = doctor(ctx, t, l, "node3")
			if c := checkOf(reps, "node3", "heartbeats"); c.Verdict != "fail" {
				return fmt.Errorf("heartbeats %s: %s", c.Verdict, c.Detail)
			}
			return nil
		})
		c := checkOf(reps, "node3", "heartbeats")
		if err != nil || code != 1 || !strings.Contains(c.Detail, "no heartbeat arrives here from node1") || !strings.Contains(c.Detail, "node2") ||
			!strings.Contains(c.Fix, "UDP heartbeat_addr") {
			t.Errorf("node3: %v, exit %d, heartbeats %s: %s (fix %s)", err, code, c.Verdict, c.Detail, c.Fix)
		}
		reps, code = doctor(ctx, t, l, "node1")
		if c := checkOf(reps, "node1", "heartbeats"); code != 1 || !strings.Contains(c.Detail, "do not reach node3") {
			t.Errorf("node1: exit %d, heartbeats %s: %s", code, c.Verdict, c.Detail)
		}
	})
}
