package rules

import (
	"bytes"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
)

func TestHCLogGoesToSlogAtWarn(t *testing.T) {
	var buf bytes.Buffer
	hl := newHCLogger(slog.New(slog.NewTextHandler(&buf, nil)), nil)
	hl.Info("election won")
	hl.Debug("heartbeat sent")
	hl.Warn("heartbeat timeout reached")
	hl.Error("failed to contact", "peer", "n2")
	out := buf.String()
	if strings.Contains(out, "election won") || strings.Contains(out, "heartbeat sent") {
		t.Errorf("info or debug lines got through:\n%s", out)
	}
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "heartbeat timeout reached") {
		t.Errorf("the warning is missing:\n%s", out)
	}
	if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "failed to contact") {
		t.Errorf("the error is missing or not at error level:\n%s", out)
	}
}

// An ordinary stop logs no error: what raft reports once the store is
// closing (requests that arrive after its shutdown) is expected.
func TestHCLogQuietWhileClosing(t *testing.T) {
	var buf bytes.Buffer
	var closing atomic.Bool
	hl := newHCLogger(slog.New(slog.NewTextHandler(&buf, nil)), &closing)
	hl.Error("failed to contact", "peer", "n2")
	closing.Store(true)
	hl.Error("failed to decode incoming command", "error", "transport shutdown")
	out := buf.String()
	if !strings.Contains(out, "failed to contact") {
		t.Errorf("an error before closing is missing:\n%s", out)
	}
	if strings.Contains(out, "failed to decode") {
		t.Errorf("an error while closing got through:\n%s", out)
	}
}
