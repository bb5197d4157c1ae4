package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	out, code := run(t, "version", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	var b BuildInfo
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	// A test binary has no -X flags: every field falls back to something.
	if b.Version == "" || b.Commit == "" || b.BuildDate == "" || !strings.HasPrefix(b.Go, "go") {
		t.Errorf("empty fields: %+v", b)
	}
	old := version
	version = "1.2.3"
	t.Cleanup(func() { version = old })
	if out, _ := run(t, "version"); !strings.HasPrefix(out, "shoal 1.2.3\n") {
		t.Errorf("with -X main.version=1.2.3: %q", out)
	}
	if _, code := run(t, "version", "extra"); code != exitUsage {
		t.Errorf("an argument: exit %d, want %d", code, exitUsage)
	}
}

func TestManPages(t *testing.T) {
	dir := t.TempDir()
	if out, code := run(t, "man", "--dir", dir); code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	for _, c := range newApp().Commands {
		name := "shoal-" + c.Name + ".1"
		b, err := os.ReadFile(filepath.Join(dir, name))
		if c.Hidden {
			if err == nil {
				t.Errorf("hidden command %s has a page", c.Name)
			}
			continue
		}
		if err != nil {
			t.Errorf("no page for %s: %v", c.Name, err)
			continue
		}
		if page := string(b); !strings.Contains(page, ".TH shoal-"+c.Name+" 1") || !strings.Contains(page, ".BR shoal (1)") {
			t.Errorf("%s: no title or no SEE ALSO:\n%s", name, page)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "shoal-help.1")); err == nil {
		t.Error("help has a page")
	}
	top, err := os.ReadFile(filepath.Join(dir, "shoal.1"))
	if err != nil || !strings.Contains(string(top), ".BR shoal-drainstop (1)") {
		t.Errorf("shoal(1) does not point at shoal-drainstop(1): %v", err)
	}
}

func TestCompletion(t *testing.T) {
	for _, tc := range []struct {
		shell, want string
		code        int
	}{
		{"bash", "complete -o bashdefault -o default -F _shoal shoal", 0},
		{"zsh", "compdef _shoal shoal", 0},
		{"fish", "unknown shell", exitUsage},
	} {
		out, code := run(t, "completion", tc.shell)
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("completion %s: exit %d, output %q; want exit %d and %q", tc.shell, code, out, tc.code, tc.want)
		}
	}
	// deploy/deb's package test drives the installed script in bash.
}

// TestCompletionScriptsParse checks both scripts with their shell's parser
// (deploy/deb's package test drives the bash one for real).
func TestCompletionScriptsParse(t *testing.T) {
	for _, shell := range []string{"bash", "zsh"} {
		path, err := exec.LookPath(shell)
		if err != nil {
			t.Logf("%s is not installed: not checked", shell)
			continue
		}
		out, code := run(t, "completion", shell)
		if code != 0 {
			t.Fatalf("completion %s: exit %d", shell, code)
		}
		f := filepath.Join(t.TempDir(), "completion."+shell)
		os.WriteFile(f, []byte(out), 0o644)
		if msg, err := exec.Command(path, "-n", f).CombinedOutput(); err != nil {
			t.Errorf("%s -n: %v\n%s", shell, err, msg)
		}
	}
}
