package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestNewLogger(t *testing.T) {
	for _, tc := range []struct {
		format, level string
		check         func(string) bool
		err           string
	}{
		{format: "text", level: "info", check: func(out string) bool {
			return strings.Contains(out, `level=INFO msg="view changed" peer=node3`) && !strings.Contains(out, "hidden")
		}},
		{format: "json", level: "debug", check: func(out string) bool {
			lines := strings.Split(strings.TrimSpace(out), "\n")
			var first map[string]any
			return len(lines) == 2 && json.Unmarshal([]byte(lines[1]), &first) == nil &&
				first["msg"] == "view changed" && first["peer"] == "node3" && first["level"] == "INFO"
		}},
		{format: "JSON", level: "warn", check: func(out string) bool { return out == "" }},
		{format: "xml", level: "info", err: "want text or json"},
		{format: "text", level: "loud", err: "want debug, info, warn or error"},
	} {
		var buf bytes.Buffer
		log, err := newLogger(&buf, tc.format, tc.level)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s/%s: err %v, want %q", tc.format, tc.level, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		log.Debug("hidden")
		log.Info("view changed", "peer", "node3")
		if !tc.check(buf.String()) {
			t.Errorf("%s/%s: output %q", tc.format, tc.level, buf.String())
		}
	}
	if out, code := run(t, "agent", "--log-format", "xml", "--check"); code != exitUsage || !strings.Contains(out, "want text or json") {
		t.Errorf("agent --log-format xml: exit %d: %s", code, out)
	}
}
