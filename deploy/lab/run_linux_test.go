package lab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tWriter sends lines to t.Log.
type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// buildShoal builds the shoal binary into a temporary directory.
func buildShoal(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "shoal")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/shoalnet/shoal/cmd/shoal")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/shoal: %v\n%s", err, out)
	}
	return bin
}

// TestLabRun is the end-to-end drill: a 3-node cluster, traffic on new
// connections, a pulled plug, traffic again; with an IPv4 VIP, an IPv6 one,
// and both at once (dual: the same report for each VIP); and a 4-node
// cluster with the HTTP server on two nodes only (--servers 2).
func TestLabRun(t *testing.T) {
	for _, f := range []Family{Family4, Family6, FamilyDual} {
		t.Run("family "+string(f), func(t *testing.T) { testLabRun(t, f, 3, 0) })
	}
	t.Run("servers 2 of 4", func(t *testing.T) { testLabRun(t, Family4, 4, 2) })
}

func testLabRun(t *testing.T, family Family, nodes, servers int) {
	needRoot(t)
	if testing.Short() {
		t.Skip("the end-to-end lab takes ~20 s; skipped with -short")
	}
	bin := buildShoal(t)
	base := t.TempDir()
	t.Cleanup(func() {
		// A backstop: Run removes the lab itself. Only this test's labs (by
		// state file under base) are touched; other labs on the machine are
		// none of its business.
		files, _ := filepath.Glob(filepath.Join(base, "shl*.json"))
		for _, f := range files {
			id := strings.TrimSuffix(filepath.Base(f), ".json")
			t.Errorf("lab %s left after Run", id)
			if l, err := Open(base, id, nil); err == nil {
				l.Down(context.Background())
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rep, err := Run(ctx, RunOptions{
		Options: Options{
			Nodes: nodes, Servers: servers, Binary: bin, Base: base, Family: family,
			Log: slog.New(slog.NewTextHandler(tWriter{t}, nil)),
		},
		// 1000 requests/s for 3 s: the 3,000 requests on new connections the
		// issue asks for, at a steady rate the client sustains on two cores.
		Duration:    3 * time.Second,
		Concurrency: 8,
		Rate:        1000,
		Progress:    tWriter{t},
	})
	if rep != nil {
		var b strings.Builder
		rep.WriteText(&b)
		t.Log("report:\n" + b.String())
	}
	if err != nil {
		t.Fatal(err)
	}

	vips := []VIPReport{{VIP: rep.VIP, ClusterMAC: rep.ClusterMAC, ClientNeighbor: rep.ClientARP, Before: rep.Before, During: rep.During, After: rep.After}}
	vips = append(vips, rep.Also...)
	wantVIPs := map[Family][]string{Family4: {"198.18."}, Family6: {"2001:db8:"}, FamilyDual: {"198.18.", "2001:db8:"}}[family]
	if len(vips) != len(wantVIPs) {
		t.Fatalf("report on %d VIPs, want %d", len(vips), len(wantVIPs))
	}
	for i, v := range vips {
		if !strings.HasPrefix(v.VIP, wantVIPs[i]) {
			t.Errorf("VIP %s, want one in %s", v.VIP, wantVIPs[i])
		}
		if !strings.EqualFold(v.ClientNeighbor, v.ClusterMAC) {
			t.Errorf("client resolved %s to %q, want the cluster MAC %s", v.VIP, v.ClientNeighbor, v.ClusterMAC)
		}
		if v.Before.Requests != 3000 || v.Before.Failures != 0 {
			t.Errorf("%s before the pull: %d requests, %d failed (%v); want 3000, all served",
				v.VIP, v.Before.Requests, v.Before.Failures, v.Before.Errors)
		}
		served := nodes
		if servers > 0 {
			served = servers
		}
		for i := range nodes {
			n, want := fmt.Sprintf("node%d", i+1), 1/float64(served)
			if i >= served {
				want = 0 // no server: weight 0
			}
			if s := v.Before.Share[n]; s < want-0.05 || s > want+0.05 {
				t.Errorf("%s before the pull: %s served %.1f%%, want %.0f%% +- 5", v.VIP, n, 100*s, 100*want)
			}
		}
		if v.After.Requests == 0 || v.After.Failures != 0 {
			t.Errorf("%s after the failover: %d requests, %d failed (%v); want all served",
				v.VIP, v.After.Requests, v.After.Failures, v.After.Errors)
		}
		if n := v.After.ByNode[rep.Victim]; n != 0 {
			t.Errorf("%s: the pulled node %s served %d requests after the failover", v.VIP, rep.Victim, n)
		}
	}
	if want := fmt.Sprintf("node%d", servers); servers > 0 && rep.Victim != want {
		t.Errorf("the pull took %s, want %s (the last node with a server)", rep.Victim, want)
	}
	if rep.Balance < 1 || rep.Balance > 1.05 {
		t.Errorf("balance %.3f: the busiest node owns that times the mean share of buckets, want 1 to 1.05", rep.Balance)
	}
	if family == Family4 {
		// Before the pull every packet is taken by exactly one node; after
		// it, none twice (the client's packets for the pulled node's
		// connections are taken by none).
		for _, ph := range []string{"before", "after"} {
			p, ok := rep.Packets[ph]
			if !ok || p.Sent == 0 || p.Twice() != 0 || ph == "before" && p.Untaken() != 0 {
				t.Errorf("packets %s the pull: %+v (found %v), want every packet the client sent taken by one node (after the pull: by at most one)", ph, p, ok)
			}
		}
	}
	if rep.FailoverMS < 0 || rep.FailoverMS > 1500 {
		t.Errorf("failover took %.0f ms, want <= 1500", rep.FailoverMS)
	}

	assertGone(t, rep.Lab)
	for _, p := range []string{StatePath(base, rep.Lab), filepath.Join(base, rep.Lab)} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left: %v", p, err)
		}
	}
}
