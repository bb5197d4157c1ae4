package rules

import (
	"bytes"
	"log/slog"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
)

// hclogWriter turns the lines hashicorp's libraries print into slog records,
// so raft's output lands in the agent's log instead of raw on stderr.
type hclogWriter struct {
	log *slog.Logger
	// closing is set once the store shuts raft down: raft then reports the
	// connections it drops (a peer's request arriving after shutdown comes
	// back as "failed to decode incoming command: transport shutdown") as
	// errors, which on an ordinary stop they are not.
	closing *atomic.Bool
}

func (w hclogWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		switch {
		case len(line) == 0:
		case w.closing != nil && w.closing.Load():
			w.log.Debug(string(line))
		case bytes.Contains(line, []byte("[ERROR]")):
			w.log.Error(string(line))
		default:
			w.log.Warn(string(line))
		}
	}
	return len(p), nil
}

// newHCLogger returns an hclog.Logger for raft that only lets warnings and
// errors through (raft logs every election and heartbeat at info).
func newHCLogger(log *slog.Logger, closing *atomic.Bool) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:        "raft",
		Level:       hclog.Warn,
		Output:      hclogWriter{log: log, closing: closing},
		DisableTime: true,
	})
}
