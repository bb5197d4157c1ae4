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
	cl := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true,
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://shoal/v1/status", nil)
	if err != nil {
		return NodeStatus{}, err
	}
	resp, err := cl.Do(req)
	if err != nil {
		return NodeStatus{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return NodeStatus{}, fmt.Errorf("GET /v1/status: %s", resp.Status)
	}
	var st NodeStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return NodeStatus{}, fmt.Errorf("GET /v1/status: %w", err)
	}
	return st, nil
}

// AddRule adds a TCP port rule for vip:port in multiple-host mode with no
// affinity, the lab's default rule.
func (c Ctl) AddRule(ctx context.Context, socket, vip string, port int) error {
	_, err := c.Run(ctx, socket, "rules", "add", "--vip", vip, "--ports", fmt.Sprint(port),
		"--proto", "tcp", "--mode", "multiple", "--affinity", "none")
	return err
}
