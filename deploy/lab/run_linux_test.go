package lab

import (
	"context"
	"errors"
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
// connections, a pulled plug, traffic again.
func TestLabRun(t *testing.T) {
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
			Nodes: 3, Binary: bin, Base: base,
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

	if !strings.EqualFold(rep.ClientARP, rep.ClusterMAC) {
		t.Errorf("client resolved the VIP to %q, want the cluster MAC %s", rep.ClientARP, rep.ClusterMAC)
	}
	if rep.Before.Requests != 3000 || rep.Before.Failures != 0 {
		t.Errorf("before the pull: %d requests, %d failed (%v); want 3000, all served",
			rep.Before.Requests, rep.Before.Failures, rep.Before.Errors)
	}
	for _, n := range []string{"node1", "node2", "node3"} {
		if s := rep.Before.Share[n]; s < 0.33-0.05 || s > 0.33+0.05 {
			t.Errorf("before the pull %s served %.1f%%, want 33%% +- 5", n, 100*s)
		}
	}
	if rep.FailoverMS < 0 || rep.FailoverMS > 1500 {
		t.Errorf("failover took %.0f ms, want <= 1500", rep.FailoverMS)
	}
	if rep.After.Requests == 0 || rep.After.Failures != 0 {
		t.Errorf("after the failover: %d requests, %d failed (%v); want all served",
			rep.After.Requests, rep.After.Failures, rep.After.Errors)
	}
	if n := rep.After.ByNode[rep.Victim]; n != 0 {
		t.Errorf("the pulled node %s served %d requests after the failover", rep.Victim, n)
	}

	assertGone(t, rep.Lab)
	for _, p := range []string{StatePath(base, rep.Lab), filepath.Join(base, rep.Lab)} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left: %v", p, err)
		}
	}
}
