package main

import (
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/urfave/cli/v2"
)

// The agent's log flags: one event per line, as text (key=value, for a
// terminal and journald) or JSON (for a log shipper).
var (
	logFormatFlag = &cli.StringFlag{Name: "log-format", Value: "text", EnvVars: []string{"SHOAL_LOG_FORMAT"},
		Usage: "the agent's log lines: text (key=value) or json"}
	logLevelFlag = &cli.StringFlag{Name: "log-level", Value: "info", EnvVars: []string{"SHOAL_LOG_LEVEL"},
		Usage: "the least severe events logged: debug, info, warn or error"}
)

// newLogger returns the logger the flags ask for, writing to w.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}
