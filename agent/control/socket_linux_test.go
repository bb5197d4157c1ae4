package control

import (
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestControlSocketMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "shoal.sock")
	l, err := ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("control socket is %v, want a socket with mode 0600", fi.Mode())
	}
	// Nothing is left beside it (the private directory it was bound in).
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Errorf("directory holds %d entries, want only the socket", len(ents))
	}
	// The process's own uid is let in.
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Write([]byte("ok"))
			c.Close()
		}
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if b, _ := io.ReadAll(c); string(b) != "ok" {
		t.Errorf("own uid: read %q, want ok", b)
	}
	// A second agent on the same path is refused while the first runs.
	if _, err := ListenUnix(path); err == nil || !strings.Contains(err.Error(), "another agent") {
		t.Errorf("second listen: %v, want another agent is running", err)
	}
}

func TestControlSocketNeverDeletesOtherFiles(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		make func(path string) error
	}{
		{"regular file", func(p string) error { return os.WriteFile(p, []byte("precious"), 0o644) }},
		{"directory", func(p string) error { return os.Mkdir(p, 0o755) }},
		{"symbolic link", func(p string) error { return os.Symlink(filepath.Join(dir, "elsewhere"), p) }},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "sock"+string(rune('a'+i)))
			if err := tc.make(path); err != nil {
				t.Fatal(err)
			}
			l, err := ListenUnix(path)
			if err == nil {
				l.Close()
				t.Fatal("listen replaced a file that is not a socket")
			}
			if !strings.Contains(err.Error(), tc.name) {
				t.Errorf("error %q does not say a %s is in the way", err, tc.name)
			}
			if _, err := os.Lstat(path); err != nil {
				t.Errorf("the %s is gone: %v", tc.name, err)
			}
		})
	}
}

func TestControlSocketReplacesStaleSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shoal.sock")
	// A socket nobody listens on any more: what an agent killed leaves.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	l, err := ListenUnix(path)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	l.Close()
}

func TestControlSocketChecksPeerCredentials(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shoal.sock")
	l, err := ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	cl := l.(*credListener)
	me := uint32(os.Getuid())
	cl.allow = func(uid uint32) bool { return uid != me } // refuse this very process
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- c
		}
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("refused client read %d bytes, err %v; want the connection closed", n, err)
	}
	select {
	case <-accepted:
		t.Error("a connection from a refused uid was handed on")
	default:
	}
	if got := cl.refused.Load(); got != 1 {
		t.Errorf("refused %d connections, want 1", got)
	}
}
