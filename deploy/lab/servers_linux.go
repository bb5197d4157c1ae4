package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ServerStartTimeout bounds the wait for a node's server to listen.
const ServerStartTimeout = 10 * time.Second

// StartServer starts the lab's server (l.Server) on node, as a process of
// role "serve" that Down stops by its PID, and waits until it listens on
// port 80 of the node's namespace. nginx and Apache run from their Debian
// packages with a configuration, pid file and log of their own under the
// lab's directory; they log to the node's serve log.
func (l *Lab) StartServer(ctx context.Context, node string) (Proc, error) {
	h, ok := l.HostByName(node)
	if !ok || h.Name == l.Client.Name {
		return Proc{}, fmt.Errorf("lab: no node %q", node)
	}
	var (
		p   Proc
		err error
	)
	switch l.Server {
	case "", ServerBuiltin:
		args := []string{"lab", "serve", "--name", h.Name}
		for _, vip := range l.VIPs() {
			args = append(args, "--listen", netip.AddrPortFrom(vip, HTTPPort).String())
		}
		p, err = l.Start(h.Name, "serve", args...)
	case ServerDualStack:
		p, err = l.Start(h.Name, "serve", "lab", "serve", "--name", h.Name, "--listen", fmt.Sprintf("[::]:%d", HTTPPort))
	case ServerNginx:
		p, err = l.startNginx(h)
	case ServerApache:
		p, err = l.startApache(h)
	default:
		return Proc{}, fmt.Errorf("lab: unknown server %q", l.Server)
	}
	if err != nil {
		return p, err
	}
	if err := Poll(ctx, ServerStartTimeout, 20*time.Millisecond, func() error {
		if !alive(p) {
			return fmt.Errorf("%s on %s exited: %s", l.Server, h.Name, tail(p.Log, 800))
		}
		v4, v6, err := Listening(p.PID, HTTPPort)
		if err != nil {
			return err
		}
		if !v4 && !v6 {
			return fmt.Errorf("%s on %s does not listen on port %d yet", l.Server, h.Name, HTTPPort)
		}
		return nil
	}); err != nil {
		return p, fmt.Errorf("lab: start %s on %s: %w", l.Server, h.Name, err)
	}
	return p, nil
}

// program finds a server's binary: on PATH, or in /usr/sbin (where Debian
// puts them, and which a user's PATH may lack).
func program(name, pkg string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	p := filepath.Join("/usr/sbin", name)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("lab: %s not found: install it (apt-get install %s)", name, pkg)
}

// serverDir makes the directory of a node's server files.
func (l *Lab) serverDir(h Host) (string, error) {
	dir := filepath.Join(l.Dir, h.Name+"."+string(l.Server))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("lab: %w", err)
	}
	return dir, nil
}

func (l *Lab) startNginx(h Host) (Proc, error) {
	bin, err := program("nginx", "nginx")
	if err != nil {
		return Proc{}, err
	}
	dir, err := l.serverDir(h)
	if err != nil {
		return Proc{}, err
	}
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(nginxConfig(dir, h.Name, l.Family.HasIPv6())), 0o600); err != nil {
		return Proc{}, fmt.Errorf("lab: %w", err)
	}
	// -e: the log for what happens before the configuration is read (by
	// default a file under /var/log).
	return l.StartProgram(h.Name, "serve", bin, "-p", dir, "-c", conf, "-e", "stderr")
}

func (l *Lab) startApache(h Host) (Proc, error) {
	bin, err := program("apache2", "apache2")
	if err != nil {
		return Proc{}, err
	}
	dir, err := l.serverDir(h)
	if err != nil {
		return Proc{}, err
	}
	docroot, err := l.webRoot(h.Name)
	if err != nil {
		return Proc{}, err
	}
	if err := os.WriteFile(filepath.Join(docroot, "index.txt"), []byte(h.Name+"\n"), 0o644); err != nil {
		return Proc{}, fmt.Errorf("lab: %w", err)
	}
	usr, grp := apacheUser()
	conf := filepath.Join(dir, "apache2.conf")
	if err := os.WriteFile(conf, []byte(apacheConfig(dir, docroot, h.Name, usr, grp)), 0o600); err != nil {
		return Proc{}, fmt.Errorf("lab: %w", err)
	}
	return l.StartProgram(h.Name, "serve", bin, "-d", dir, "-f", conf, "-DFOREGROUND")
}

// webRoot returns a world-readable directory for node's documents. Apache's
// children run unprivileged and cannot enter the lab's directory (mode
// 0700, like its parents), so the root lives in the system's temporary
// directory, recorded in the state before it is made.
func (l *Lab) webRoot(node string) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.WebRoot == "" {
		l.WebRoot = filepath.Join(os.TempDir(), "shoal-"+l.ID+"-www")
		if err := l.Save(); err != nil {
			return "", err
		}
	}
	dir := filepath.Join(l.WebRoot, node)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("lab: %w", err)
	}
	// MkdirAll applies the umask; the children need to enter both levels.
	for _, d := range []string{l.WebRoot, dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			return "", fmt.Errorf("lab: %w", err)
		}
	}
	return dir, nil
}

// apacheUser is the unprivileged user and group Apache's children run as:
// Debian's www-data, else nobody.
func apacheUser() (string, string) {
	usr, grp := "www-data", "www-data"
	if _, err := user.Lookup(usr); err != nil {
		usr = "nobody"
	}
	if _, err := user.LookupGroup(grp); err != nil {
		grp = "nogroup"
	}
	return usr, grp
}

// Listening reports whether the network namespace of process pid has a TCP
// listener on port, over IPv4 (AF_INET) and over IPv6 (AF_INET6, which
// takes IPv4 clients too unless it is v6-only).
func Listening(pid, port int) (v4, v6 bool, err error) {
	for _, f := range []struct {
		name string
		ok   *bool
	}{{"tcp", &v4}, {"tcp6", &v6}} {
		file, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, f.name))
		if errors.Is(err, os.ErrNotExist) && f.name == "tcp6" {
			continue // IPv6 disabled
		}
		if err != nil {
			return false, false, err
		}
		*f.ok, err = hasListener(bufio.NewScanner(file), port)
		file.Close()
		if err != nil {
			return false, false, err
		}
	}
	return v4, v6, nil
}

// hasListener scans /proc/net/tcp{,6} lines for a LISTEN socket on port.
func hasListener(sc *bufio.Scanner, port int) (bool, error) {
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// sl local_address rem_address st ...; local_address is HEX:PORT.
		if len(f) < 4 || f[3] != "0A" {
			continue
		}
		_, hexPort, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil && int(p) == port {
			return true, nil
		}
	}
	return false, sc.Err()
}
