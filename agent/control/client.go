package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// Client calls an agent's control API over its Unix socket.
type Client struct {
	http   *http.Client
	socket string
}

// ErrAgentDown means no agent answers on the socket.
var ErrAgentDown = errors.New("no shoal agent is running")

// NewClient returns a client for the agent listening on socket.
func NewClient(socket string) *Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	return &Client{http: &http.Client{Transport: tr, Timeout: 30 * time.Second}, socket: socket}
}

// Do sends in (if not nil) as JSON to path and decodes the answer into out.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://shoal"+path, body)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return fmt.Errorf("%w on %s (start it with `shoal agent`, or pass --socket)", ErrAgentDown, c.socket)
		}
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		var e APIError
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			return &StatusError{Code: resp.StatusCode, Msg: e.Error}
		}
		return &StatusError{Code: resp.StatusCode, Msg: string(bytes.TrimSpace(b))}
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// StatusError is an error answer of the control API.
type StatusError struct {
	Code int
	Msg  string
}

func (e *StatusError) Error() string { return e.Msg }

// Status returns the node's own status.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	var s Status
	return &s, c.Do(ctx, http.MethodGet, "/v1/status", nil, &s)
}

// Query returns the cluster as the node sees it.
func (c *Client) Query(ctx context.Context) (*Query, error) {
	var q Query
	return &q, c.Do(ctx, http.MethodGet, "/v1/query", nil, &q)
}
