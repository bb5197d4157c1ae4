package lab

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shoalnet/shoal/internal/netnstest"
)

// TestServers starts every server type on a node, with the VIP put on its
// lo by hand (no agent) and the client's neighbour entry for the VIP set to
// the node's MAC: each answers through the VIP with the node's name, keeps
// a connection alive across requests, holds IPv4 clients in the socket
// family it claims (AF_INET6 for the dual-stack ones), serves a short
// new-connection load without a failure, and is gone, workers and all,
// after Down.
func TestServers(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		server Server
		v6     bool // listens, and holds its IPv4 clients, on AF_INET6
		needs  string
	}{
		{ServerBuiltin, false, ""},
		{ServerDualStack, true, ""},
		{ServerNginx, false, "nginx"},
		{ServerApache, true, "apache2"},
	} {
		t.Run(string(tc.server), func(t *testing.T) {
			if tc.needs != "" {
				if _, err := program(tc.needs, tc.needs); err != nil {
					t.Skipf("%v (.ci/run installs it)", err)
				}
			}
			l := upForTest(t, 1)
			l.Server = tc.server
			n := l.Nodes[0]
			if _, err := ip(context.Background(), "-n", n.Namespace, "addr", "add", l.VIP.String()+"/32", "dev", "lo"); err != nil {
				t.Fatal(err)
			}
			mac := linkMAC(t, n.Namespace)
			if _, err := ip(context.Background(), "-n", l.Client.Namespace, "neigh", "replace", l.VIP.String(), "lladdr", mac, "dev", Interface); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			p, err := l.StartServer(ctx, n.Name)
			if err != nil {
				t.Fatal(err)
			}
			v4, v6, err := Listening(p.PID, HTTPPort)
			if err != nil {
				t.Fatal(err)
			}
			if v4 == tc.v6 || v6 != tc.v6 {
				t.Errorf("listeners on port 80: AF_INET %v, AF_INET6 %v; want AF_INET6 only: %v", v4, v6, tc.v6)
			}

			// One keep-alive connection, three requests.
			var family string
			err = netnstest.Do(t, l.Client.Namespace, func() error {
				c, err := net.DialTimeout("tcp", net.JoinHostPort(l.VIP.String(), "80"), 2*time.Second)
				if err != nil {
					return err
				}
				defer c.Close()
				br := bufio.NewReader(c)
				for i := range 3 {
					c.SetDeadline(time.Now().Add(3 * time.Second))
					fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", l.VIP)
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						return fmt.Errorf("request %d on one connection: %w", i+1, err)
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 || resp.Header.Get(NodeHeader) != n.Name || strings.TrimSpace(string(body)) != n.Name || resp.Close {
						return fmt.Errorf("request %d: %s, %s %q, body %q, close %v; want 200 from %s, kept alive",
							i+1, resp.Status, NodeHeader, resp.Header.Get(NodeHeader), body, resp.Close, n.Name)
					}
				}
				// The server's side of this very connection, by its client port.
				family = establishedFamily(t, p.PID, c.LocalAddr().(*net.TCPAddr).Port)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			want := "AF_INET"
			if tc.v6 {
				want = "AF_INET6"
			}
			if family != want {
				t.Errorf("the server holds the IPv4 client's connection on %q, want %s", family, want)
			}

			res, err := l.Load(context.Background(), LoadArgs{Duration: 500 * time.Millisecond, Concurrency: 4}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.Requests < 20 || res.Failures != 0 || res.ByNode[n.Name] != res.Successes {
				t.Errorf("new-connection load: %d requests, %d failed (%v), by node %v", res.Requests, res.Failures, res.Errors, res.ByNode)
			}

			pids := netnsPIDs(t, n.Namespace)
			if len(pids) == 0 {
				t.Fatal("no process in the node's namespace")
			}
			if err := l.Down(context.Background()); err != nil {
				t.Fatal(err)
			}
			for _, pid := range pids {
				if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
					if st, _, _ := procStat(pid); st != 'Z' {
						t.Errorf("process %d of the node's namespace survived Down", pid)
					}
				}
			}
			if l.WebRoot != "" {
				if _, err := os.Stat(l.WebRoot); !os.IsNotExist(err) {
					t.Errorf("web root %s left: %v", l.WebRoot, err)
				}
			}
		})
	}
}

func TestParseServer(t *testing.T) {
	for in, want := range map[string]Server{"": ServerBuiltin, "builtin": ServerBuiltin, "dualstack": ServerDualStack, "nginx": ServerNginx, "apache": ServerApache} {
		if got, err := ParseServer(in); err != nil || got != want {
			t.Errorf("ParseServer(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseServer("lighttpd"); err == nil || !strings.Contains(err.Error(), "builtin, dualstack, nginx, apache") {
		t.Errorf("ParseServer(lighttpd): %v; want an error naming the choices", err)
	}
}

func TestHasListener(t *testing.T) {
	const tcp6 = `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0000000000000000FFFF0000640012C6:0050 0000000000000000FFFF0000010012C6:D431 01 00000000:00000000 00:00000000 00000000    33        0 2 1 0 20 4 30 10 -1
`
	for _, tc := range []struct {
		port int
		want bool
	}{{80, true}, {54321, false}, {8080, false}} {
		got, err := hasListener(bufio.NewScanner(strings.NewReader(tcp6)), tc.port)
		if err != nil || got != tc.want {
			t.Errorf("port %d: %v, %v; want %v", tc.port, got, err, tc.want)
		}
	}
}

// linkMAC returns the MAC of eth0 in namespace ns.
func linkMAC(t *testing.T, ns string) string {
	t.Helper()
	out, err := ip(context.Background(), "-n", ns, "-o", "link", "show", "dev", Interface)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(out)
	for i, w := range f {
		if w == "link/ether" && i+1 < len(f) {
			return f[i+1]
		}
	}
	t.Fatalf("no MAC in %q", out)
	return ""
}

// establishedFamily returns the family of the established socket with
// remote port rport in pid's namespace: "AF_INET", "AF_INET6" or "".
func establishedFamily(t *testing.T, pid, rport int) string {
	t.Helper()
	for _, f := range []struct{ file, family string }{{"tcp", "AF_INET"}, {"tcp6", "AF_INET6"}} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f.file))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			fs := strings.Fields(line)
			if len(fs) < 4 || fs[3] != "01" {
				continue
			}
			if _, hp, ok := strings.Cut(fs[2], ":"); ok && hp == fmt.Sprintf("%04X", rport) {
				return f.family
			}
		}
	}
	return ""
}

// netnsPIDs lists the processes in namespace ns.
func netnsPIDs(t *testing.T, ns string) []int {
	t.Helper()
	out, err := ip(context.Background(), "netns", "pids", ns)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, f := range strings.Fields(out) {
		var pid int
		if _, err := fmt.Sscan(f, &pid); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}
