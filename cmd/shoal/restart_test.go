package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeSystemctl puts a systemctl on PATH that prints listJobs for
// `list-jobs` (and fails with status 1 if fail is set).
func fakeSystemctl(t *testing.T, listJobs string, fail bool) {
	t.Helper()
	dir := t.TempDir()
	script := "#!/bin/sh\n[ \"$1\" = list-jobs ] || exit 2\n"
	if fail {
		script += "echo 'Failed to connect to bus: No such file or directory' >&2\nexit 1\n"
	} else {
		script += "cat <<'END'\n" + listJobs + "END\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "systemctl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
}

// TestRestartIfRestarting: the unit's ExecStop= arms a hitless restart only
// while systemd restarts the unit; a stop stays a graceful stop, and a
// systemctl that cannot answer arms nothing and says why.
func TestRestartIfRestarting(t *testing.T) {
	armed := func(f *fakeAgent) bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return slices.ContainsFunc(f.requests, func(r string) bool { return strings.HasPrefix(r, "POST /v1/restart") })
	}
	for _, tc := range []struct {
		name, jobs string
		fail       bool
		wantArmed  bool
		wantCode   int
		wantOut    string
	}{
		{"restart", "  118 shoal.service restart running\n  119 other.service start waiting\n", false, true, 0, "restart armed"},
		{"stop", "  118 shoal.service stop running\n", false, false, 0, `job for shoal.service is "stop"`},
		{"another unit restarting", "  120 shoal-other.service restart running\n", false, false, 0, "not armed"},
		{"no job", "", false, false, 0, "not armed"},
		{"systemctl fails", "", true, false, 1, "Failed to connect to bus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fakeSystemctl(t, tc.jobs, tc.fail)
			f := &fakeAgent{}
			sock := startFake(t, f)
			out, code := run(t, "--socket", sock, "restart", "--if-restarting", "shoal.service")
			if code != tc.wantCode || !strings.Contains(out, tc.wantOut) {
				t.Errorf("exit %d, output %q; want %d and %q", code, out, tc.wantCode, tc.wantOut)
			}
			if got := armed(f); got != tc.wantArmed {
				t.Errorf("restart armed: %v, want %v (requests %v)", got, tc.wantArmed, f.requests)
			}
		})
	}
}

func TestJobOf(t *testing.T) {
	out := []byte("  7 a.service start waiting\n  9 shoal.service restart running\n")
	if got := jobOf(out, "shoal.service"); got != "restart" {
		t.Errorf("jobOf = %q, want restart", got)
	}
	if got := jobOf(out, "shoal"); got != "" {
		t.Errorf("jobOf of a unit without a job = %q, want none", got)
	}
}
