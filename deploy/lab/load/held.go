package load

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// HeldEvery is how often each held connection sends a request.
const HeldEvery = 100 * time.Millisecond

// HeldResult is what became of the long-lived keep-alive connections a
// run held (Options.Held): opened before the run's requests began, each
// with a request every HeldEvery until the run ended.
type HeldResult struct {
	Connections int `json:"connections"`
	Requests    int `json:"requests"`
	// Broken counts the connections that failed a request (reset, closed,
	// timed out) or were answered by another node than the first: an
	// established connection a change broke.
	Broken int            `json:"broken"`
	ByNode map[string]int `json:"by_node"` // where they were opened
	// BrokenList says how each broken connection ended (the first few).
	BrokenList []string `json:"broken_list,omitempty"`
}

// heldConn is one held connection, driven by hand so that a broken one is
// seen, never silently replaced as an HTTP client would.
type heldConn struct {
	c    net.Conn
	br   *bufio.Reader
	node string
	n    int
	err  error
}

// openHeld opens n keep-alive connections to u, each with a first request.
func openHeld(ctx context.Context, u *url.URL, n int, timeout time.Duration) ([]*heldConn, error) {
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "80")
	}
	d := net.Dialer{Timeout: timeout}
	out := make([]*heldConn, 0, n)
	for range n {
		c, err := d.DialContext(ctx, "tcp", host)
		if err != nil {
			for _, h := range out {
				h.c.Close()
			}
			return nil, fmt.Errorf("load: open held connection: %w", err)
		}
		h := &heldConn{c: c, br: bufio.NewReader(c)}
		if err := h.get(u, timeout); err != nil {
			c.Close()
			for _, h := range out {
				h.c.Close()
			}
			return nil, fmt.Errorf("load: first request on a held connection: %w", err)
		}
		out = append(out, h)
	}
	return out, nil
}

// get sends one request on h and reads the answer; a different node than
// the first is an error.
func (h *heldConn) get(u *url.URL, timeout time.Duration) error {
	h.c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintf(h.c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", u.RequestURI(), u.Host); err != nil {
		return err
	}
	resp, err := http.ReadResponse(h.br, nil)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	node := resp.Header.Get(NodeHeader)
	if h.node == "" {
		h.node = node
	} else if node != h.node {
		return fmt.Errorf("answered by %s, opened on %s", node, h.node)
	}
	h.n++
	return nil
}

// hold drives conns until stop is closed, then closes them and reports.
func hold(conns []*heldConn, u *url.URL, timeout time.Duration, stop <-chan struct{}) HeldResult {
	var wg sync.WaitGroup
	for _, h := range conns {
		wg.Go(func() {
			tk := time.NewTicker(HeldEvery)
			defer tk.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tk.C:
				}
				if err := h.get(u, timeout); err != nil {
					h.err = err
					return
				}
			}
		})
	}
	wg.Wait()
	r := HeldResult{Connections: len(conns), ByNode: map[string]int{}}
	for _, h := range conns {
		h.c.Close()
		r.Requests += h.n
		r.ByNode[h.node]++
		if h.err != nil {
			r.Broken++
			if len(r.BrokenList) < 20 {
				r.BrokenList = append(r.BrokenList, fmt.Sprintf("opened on %s, %d requests: %v", h.node, h.n, h.err))
			}
		}
	}
	return r
}
