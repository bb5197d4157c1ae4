package control

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ListenUnix opens the control socket at path with mode 0600. It replaces a
// stale socket left by an agent that died, refuses to touch anything at the
// path that is not a socket, and never lets the socket exist with a wider
// mode: it is bound in a private directory, chmodded, then renamed into
// place. Connections are accepted only from root and this process's uid.
func ListenUnix(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("control socket dir: %w", err)
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(dir, ".shoal-sock-")
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	defer os.RemoveAll(tmp)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(tmp, "sock"), Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	// The socket is renamed away from where it was bound: unlinking the
	// bound name on close would remove nothing, so the agent removes path.
	l.SetUnlinkOnClose(false)
	if err := os.Chmod(filepath.Join(tmp, "sock"), 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if err := os.Rename(filepath.Join(tmp, "sock"), path); err != nil {
		l.Close()
		return nil, fmt.Errorf("control socket: %w", err)
	}
	uid := uint32(os.Getuid())
	return &credListener{UnixListener: l, allow: func(u uint32) bool { return u == 0 || u == uid }}, nil
}

// removeStaleSocket removes a socket at path that no agent answers on. A
// live socket, or a file of any other kind, is an error: the agent never
// deletes what it did not make.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("control socket %s: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("control socket %s: a %s is in the way; move it or set another socket path", path, fileKind(fi.Mode()))
	}
	if c, err := net.DialTimeout("unix", path, 200*time.Millisecond); err == nil {
		c.Close()
		return fmt.Errorf("control socket %s: another agent is running", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("control socket %s: remove the stale socket: %w", path, err)
	}
	return nil
}

func fileKind(m fs.FileMode) string {
	switch m.Type() {
	case 0:
		return "regular file"
	case fs.ModeDir:
		return "directory"
	case fs.ModeSymlink:
		return "symbolic link"
	}
	return "file of mode " + m.Type().String()
}

// credListener accepts only connections whose peer (SO_PEERCRED) is a uid
// that allow accepts; it closes the others and counts them.
type credListener struct {
	*net.UnixListener
	allow   func(uid uint32) bool
	refused atomic.Uint64
	lastLog atomic.Int64 // unix nanoseconds of the last refusal logged
}

// Accept implements net.Listener.
func (l *credListener) Accept() (net.Conn, error) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return nil, err
		}
		uid, err := peerUID(c)
		if err == nil && l.allow(uid) {
			return c, nil
		}
		l.refused.Add(1) // before the close, which the client sees
		c.Close()
		if now := time.Now().UnixNano(); now-l.lastLog.Load() > int64(10*time.Second) {
			l.lastLog.Store(now)
			slog.Warn("control socket: refused a client", "uid", uid, "err", err, "refused_total", l.refused.Load())
		}
	}
}

// peerUID returns the uid of the process at the other end of c.
func peerUID(c *net.UnixConn) (uint32, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var serr error
	if err := rc.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, fmt.Errorf("peer credentials: %w", serr)
	}
	return cred.Uid, nil
}
