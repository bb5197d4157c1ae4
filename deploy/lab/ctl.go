package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strings"
)

// Ctl runs the shoal CLI against a node's control socket. The CLI runs in
// the caller's namespace: the socket is a filesystem path.
type Ctl struct {
	Binary string // the shoal binary
}

// Run runs `shoal --socket socket args...` and returns its stdout; the
// error carries stderr.
func (c Ctl) Run(ctx context.Context, socket string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, c.Binary, append([]string{"--socket", socket}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("shoal %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

// Status returns the node's status: straight from the control API's GET
// /v1/status (cheap enough to poll every 20 ms), else from `shoal status
// --json`.
func (c Ctl) Status(ctx context.Context, socket string) (NodeStatus, error) {
	if st, err := c.statusHTTP(ctx, socket); err == nil {
		return st, nil
	}
	out, err := c.Run(ctx, socket, "status", "--json")
	if err != nil {
		return NodeStatus{}, err
	}
	var st NodeStatus
	if err := json.Unmarshal(out, &st); err != nil {
		return NodeStatus{}, fmt.Errorf("shoal status --json: %w", err)
	}
	return st, nil
}

// statusHTTP asks the agent's control socket directly, as the CLI does.
func (c Ctl) statusHTTP(ctx context.Context, socket string) (NodeStatus, error) {
	var st NodeStatus
	err := c.get(ctx, socket, "/v1/status", &st)
	return st, err
}

// Taken returns the packets the node's data plane took for every rule:
// accepted, or handed over to it and taken.
func (c Ctl) Taken(ctx context.Context, socket string) (uint64, error) {
	var p struct {
		Packets map[string]struct {
			Accepted uint64            `json:"accepted"`
			Handed   map[string]uint64 `json:"handed"`
		} `json:"packets"`
	}
	if err := c.get(ctx, socket, "/v1/params", &p); err != nil {
		return 0, err
	}
	var n uint64
	for _, pc := range p.Packets {
		n += pc.Accepted + pc.Handed["in"]
	}
	return n, nil
}

// get decodes the answer to a GET of path on the agent's control socket.
func (c Ctl) get(ctx context.Context, socket, path string, out any) error {
	cl := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true,
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://shoal"+path, nil)
	if err != nil {
		return err
	}
	resp, err := cl.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	return nil
}

// AddRule adds a TCP port rule for vip:port in multiple-host mode with no
// affinity, the lab's default rule.
func (c Ctl) AddRule(ctx context.Context, socket, vip string, port int) error {
	_, err := c.Run(ctx, socket, "rules", "add", "--vip", vip, "--ports", fmt.Sprint(port),
		"--proto", "tcp", "--mode", "multiple", "--affinity", "none")
	return err
}
