package agent

import (
	"testing"
	"time"

	"github.com/shoalnet/shoal/agent/control"
)

// TestRestartArm: an armed restart applies to one stop within a minute,
// with the window asked for (default 10 s, 1-10 s accepted).
func TestRestartArm(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	var r restartArm
	if _, ok := r.take(now); ok {
		t.Fatal("a restart not armed applies")
	}
	for _, bad := range []time.Duration{time.Millisecond, 11 * time.Second, -time.Second} {
		if _, err := r.arm(now, bad); err == nil {
			t.Errorf("window %v accepted", bad)
		}
	}
	armed, err := r.arm(now, 0)
	if err != nil || armed.Window != control.DefaultRestartWindow || !armed.Until.Equal(now.Add(restartArmFor)) {
		t.Fatalf("arm: %+v %v; want the default window for a minute", armed, err)
	}
	if w, ok := r.take(now.Add(59 * time.Second)); !ok || w != control.DefaultRestartWindow {
		t.Errorf("take within the minute: %v %v", w, ok)
	}
	if _, ok := r.take(now.Add(59 * time.Second)); ok {
		t.Error("one arming applied to two stops")
	}
	r.arm(now, 3*time.Second)
	if _, ok := r.take(now.Add(restartArmFor)); ok {
		t.Error("an arming applied after its minute")
	}
}

// TestInheritFrom: the next agent inherits only the buckets whose rule
// still maps the same flows; a rule whose mapping changed is released.
