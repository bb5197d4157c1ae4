package agent_test

import (
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestE2EGracefulStop: SIGTERM hands off before the agent detaches. The
// stopping node advertises itself stopped, the survivors drop it from their
// view, and only then does it exit: within 0.5 s of the handoff, with
// no ERROR in its log, and the survivors then own every bucket.
func TestE2EGracefulStop(t *testing.T) {
	l := upLab(t, 3)
	p := proc(t, l, "node3", "agent")
	before, err := os.ReadFile(p.Log)
	if err != nil {
		t.Fatal(err)
	}
	signalled := time.Now()
	stopAgent(t, l, "node3", syscall.SIGTERM)
	exited := time.Since(signalled)
	b, err := os.ReadFile(p.Log)
	if err != nil {
		t.Fatal(err)
	}
	logged := string(b[len(before):])
	m := regexp.MustCompile(`handed off.*complete=(\w+) took=(\S+)`).FindStringSubmatch(logged)
	if m == nil {
		t.Fatalf("no handoff in the log after SIGTERM:\n%s", logged)
	}
	took, err := time.ParseDuration(m[2])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("SIGTERM -> handed off in %v (complete=%s) -> exited %v after the signal", took, m[1], exited.Round(time.Millisecond))
	if m[1] != "true" {
		t.Errorf("the handoff did not complete: the survivors still held node3 in their view after %v", took)
	}
	if exited > took+500*time.Millisecond {
		t.Errorf("exited %v after the signal, %v after the handoff; want within 0.5 s of it", exited, exited-took)
	}
	for _, line := range strings.Split(logged, "\n") {
		if strings.Contains(line, " ERROR ") || strings.Contains(line, "level=ERROR") {
			t.Errorf("an ordinary stop logged an error: %s", line)
		}
	}
	poll(t, 10*time.Second, "survivors cover every bucket", func() error { return covered(l, "node1", "node2") })
}
