package rules

import (
	"bytes"
	"log/slog"

	"github.com/hashicorp/go-hclog"
)

// hclogWriter turns the lines hashicorp's libraries print into slog records,
// so raft's output lands in the agent's log instead of raw on stderr.
type hclogWriter struct {
	log *slog.Logger
}

func (w hclogWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		switch {
		case len(line) == 0:
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
func newHCLogger(log *slog.Logger) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:        "raft",
		Level:       hclog.Warn,
		Output:      hclogWriter{log: log},
		DisableTime: true,
	})
}
