package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// need skips without root, and fails in CI (which installs them) when a
// tool is missing.
func need(t *testing.T, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: installs a package into an overlay of this machine's root")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is missing: .ci/run installs it", tool)
			}
			t.Skipf("%s is not installed (apt-get install lintian systemd man-db bash)", tool)
		}
	}
}

func runOut(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// buildDeb builds the binary with a version baked in and packages it.
func buildDeb(t *testing.T, version string) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "shoal")
	runOut(t, "go", "build", "-trimpath", "-buildmode=pie", "-ldflags", "-s -w -X main.version="+version+" -X main.commit=test", "-o", bin, "../../cmd/shoal")
	deb, err := build(options{Binary: bin, Version: version, Arch: "amd64", Deploy: "..", Out: dir,
		Date: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "shoal_"+version+"_amd64.deb"); deb != want {
		t.Fatalf("package %s, want %s", deb, want)
	}
	return deb
}

// freshRoot returns a copy-on-write root made of this machine's own files
// (an overlay with its upper layer on a tmpfs), where shoal was never
// installed, and with a systemctl that records what it is asked. Everything
// is unmounted in cleanup.
func freshRoot(t *testing.T) (root, systemctlLog string) {
	t.Helper()
	if _, err := os.Stat("/usr/bin/shoal"); err == nil {
		t.Skip("shoal is installed on this machine: the overlay would not be a fresh root")
	}
	base := t.TempDir()
	layers, root := filepath.Join(base, "layers"), filepath.Join(base, "root")
	for _, d := range []string{layers, root} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("tmpfs", layers, "tmpfs", 0, "size=512m"); err != nil {
		t.Fatalf("tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(layers, unix.MNT_DETACH) })
	upper, work := filepath.Join(layers, "upper"), filepath.Join(layers, "work")
	os.Mkdir(upper, 0o755)
	os.Mkdir(work, 0o755)
	if err := unix.Mount("overlay", root, "overlay", 0, "lowerdir=/,upperdir="+upper+",workdir="+work); err != nil {
		t.Fatalf("overlay of /: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	if err := unix.Mount("/dev", filepath.Join(root, "dev"), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		t.Fatalf("bind /dev: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(filepath.Join(root, "dev"), unix.MNT_DETACH) })

	// A booted systemd, as far as the maintainer scripts can tell: the
	// marker directory and a systemctl that logs its arguments. The unit
	// counts as active when /run/fake-active exists.
	os.MkdirAll(filepath.Join(root, "run/systemd/system"), 0o755)
	fake := "#!/bin/sh\necho \"$*\" >> /run/systemctl.log\n" +
		"case \"$1\" in is-active) [ -e /run/fake-active ];; is-enabled) [ -e /run/fake-enabled ];; enable) touch /run/fake-enabled;; esac\n"
	if err := os.WriteFile(filepath.Join(root, "usr/local/sbin/systemctl"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	return root, filepath.Join(root, "run/systemctl.log")
}

func TestPackage(t *testing.T) {
	need(t, "dpkg", "dpkg-deb", "lintian", "systemd-analyze", "man", "bash", "chroot")
	deb := buildDeb(t, "0.9.0+test")

	t.Run("lintian", func(t *testing.T) {
		out, _ := exec.Command("lintian", deb).CombinedOutput()
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "E:") {
				t.Errorf("lintian error: %s", line)
			}
		}
		t.Logf("lintian:\n%s", out)
	})

	root, sysctlLog := freshRoot(t)
	dpkg := func(t *testing.T, args ...string) string {
		t.Helper()
		return runOut(t, "dpkg", append([]string{"--root", root, "--force-not-root"}, args...)...)
	}
	chroot := func(t *testing.T, script string) string {
		t.Helper()
		return runOut(t, "chroot", root, "/bin/bash", "-c", script)
	}
	systemctlCalls := func() string { b, _ := os.ReadFile(sysctlLog); os.Remove(sysctlLog); return string(b) }

	t.Run("install unconfigured", func(t *testing.T) {
		out := dpkg(t, "-i", deb)
		if !strings.Contains(out, "installed, not started") {
			t.Errorf("postinst did not say the agent stays stopped:\n%s", out)
		}
		if calls := systemctlCalls(); strings.Contains(calls, "enable") || strings.Contains(calls, "start") {
			t.Errorf("an unconfigured node's agent was enabled or started: systemctl %q", calls)
		}
	})

	t.Run("files", func(t *testing.T) {
		listing := runOut(t, "dpkg-deb", "-c", deb)
		n := 0
		for _, line := range strings.Split(strings.TrimSpace(listing), "\n") {
			f := strings.Fields(line)
			mode, path := f[0], strings.TrimPrefix(f[len(f)-1], ".")
			stat := os.Lstat
			if mode[0] == 'd' {
				stat = os.Stat // /lib may be a link to usr/lib in a merged-/usr root
			}
			st, err := stat(filepath.Join(root, path))
			if err != nil {
				t.Errorf("%s: not installed: %v", path, err)
				continue
			}
			if got := st.Mode().String(); got != mode && !(mode[0] == 'd' && st.IsDir()) {
				t.Errorf("%s: mode %s, package says %s", path, got, mode)
			}
			n++
		}
		for _, want := range []string{"/usr/bin/shoal", "/lib/systemd/system/shoal.service", "/etc/shoal/shoal.yaml",
			"/usr/share/doc/shoal/sysctl.md", "/usr/share/doc/shoal/copyright", "/usr/share/man/man1/shoal.1.gz",
			"/usr/share/man/man1/shoal-drainstop.1.gz", "/usr/share/bash-completion/completions/shoal",
			"/usr/share/zsh/vendor-completions/_shoal"} {
			if !strings.Contains(listing, "."+want+"\n") && !strings.HasSuffix(listing, "."+want) {
				t.Errorf("the package lacks %s", want)
			}
		}
		if conf := runOut(t, "dpkg-query", "--admindir", filepath.Join(root, "var/lib/dpkg"), "-W", "-f", "${Conffiles}", "shoal"); !strings.Contains(conf, "/etc/shoal/shoal.yaml") {
			t.Errorf("/etc/shoal/shoal.yaml is not a conffile: %q", conf)
		}
		st, err := os.Stat(filepath.Join(root, "var/lib/shoal"))
		if err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
			t.Errorf("data directory: %v, mode %v; want a 0700 directory", err, st.Mode())
		} else if s := st.Sys().(*syscall.Stat_t); s.Uid != 0 || s.Gid != 0 {
			t.Errorf("data directory owned by %d:%d, want root", s.Uid, s.Gid)
		}
		unit, _ := os.ReadFile(filepath.Join(root, "lib/systemd/system/shoal.service"))
		if !strings.Contains(string(unit), "ExecStart=/usr/bin/shoal ") {
			t.Errorf("the unit does not run the packaged binary:\n%s", unit)
		}
		if out := chroot(t, "shoal version"); !strings.Contains(out, "shoal 0.9.0+test") {
			t.Errorf("shoal version in the package: %q", out)
		}
		t.Logf("%d entries checked", n)
	})

	t.Run("systemd-analyze verify", func(t *testing.T) {
		out, err := exec.Command("systemd-analyze", "verify", "--root", root, "/lib/systemd/system/shoal.service").CombinedOutput()
		if err != nil || strings.Contains(string(out), "shoal.service:") {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	})

	t.Run("man", func(t *testing.T) {
		out := chroot(t, "MANPAGER=cat MANWIDTH=80 man shoal-drainstop 2>&1")
		for _, want := range []string{"shoal-drainstop - finish a node's connections, then stop it", "--timeout", "shoal(1)"} {
			if !strings.Contains(out, want) {
				t.Errorf("man shoal-drainstop lacks %q:\n%s", want, out)
			}
		}
		if out := chroot(t, "MANPAGER=cat man 1 shoal 2>&1"); !strings.Contains(out, "shoal-drainstop(1)") {
			t.Errorf("shoal(1) does not point at the command pages:\n%s", out)
		}
	})

	t.Run("bash completion", func(t *testing.T) {
		complete := func(words ...string) []string {
			script := ". /usr/share/bash-completion/completions/shoal; complete -p shoal; COMP_WORDS=(" + strings.Join(words, " ") +
				"); COMP_CWORD=" + strconv.Itoa(len(words)-1) + "; _shoal; printf '%s\\n' \"${COMPREPLY[@]}\""
			lines := strings.Split(strings.TrimSpace(chroot(t, script)), "\n")
			if !strings.HasPrefix(lines[0], "complete ") || !strings.HasSuffix(lines[0], " shoal") {
				t.Fatalf("complete -p shoal: %q", lines[0])
			}
			got := lines[1:]
			slices.Sort(got)
			return got
		}
		for _, tc := range []struct {
			words []string
			want  []string
		}{
			{[]string{"shoal", "dra"}, []string{"drain", "drainstop"}},
			{[]string{"shoal", "drainstop", "--ti"}, []string{"--timeout"}},
			{[]string{"shoal", "rules", "a"}, []string{"add"}},
		} {
			if got := complete(tc.words...); strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("complete %q: got %q, want %q", tc.words, got, tc.want)
			}
		}
	})

	t.Run("reinstall configured starts the agent", func(t *testing.T) {
		chroot(t, "shoal keygen /tmp/k >/dev/null && mv /tmp/k /etc/shoal/cluster.key && sed -i 's/^node_name: web1/node_name: web7/' /etc/shoal/shoal.yaml")
		systemctlCalls()
		dpkg(t, "-i", deb)
		if calls := systemctlCalls(); !strings.Contains(calls, "enable --now shoal.service") {
			t.Errorf("a configured node was not started: systemctl %q", calls)
		}
	})

	t.Run("upgrade restarts a running agent", func(t *testing.T) {
		os.WriteFile(filepath.Join(root, "run/fake-active"), nil, 0o644)
		dpkg(t, "-i", buildDeb(t, "0.9.1+test"))
		calls := systemctlCalls()
		if !strings.Contains(calls, "restart shoal.service") || strings.Contains(calls, "enable") {
			t.Errorf("upgrade of a running agent: systemctl %q, want one restart", calls)
		}
		if out := chroot(t, "shoal version"); !strings.Contains(out, "shoal 0.9.1+test") {
			t.Errorf("after the upgrade: %q", out)
		}
		if b, _ := os.ReadFile(filepath.Join(root, "etc/shoal/shoal.yaml")); !strings.Contains(string(b), "node_name: web7") {
			t.Error("the upgrade replaced the edited config")
		}
	})

	t.Run("purge", func(t *testing.T) {
		dpkg(t, "--purge", "shoal")
		for _, gone := range []string{"usr/bin/shoal", "var/lib/shoal", "etc/shoal/cluster.key", "etc/shoal/shoal.yaml"} {
			if _, err := os.Lstat(filepath.Join(root, gone)); err == nil {
				t.Errorf("/%s is still there after purge", gone)
			}
		}
	})
}
