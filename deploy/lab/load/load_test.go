package load

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// countingServer is an httptest server on loopback that answers with a node
// name taken round robin from names and counts the connections it accepted.
func countingServer(t *testing.T, names ...string) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var conns, n atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := names[int(n.Add(1)-1)%len(names)]
		w.Header().Set(NodeHeader, name)
		fmt.Fprintln(w, name)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

func TestRunCounts(t *testing.T) {
	tests := []struct {
		name      string
		keepAlive bool
		// wantConns reports whether the number of connections is right.
		wantConns func(conns, requests int) bool
	}{
		{"new connection per request", false, func(c, r int) bool { return c == r }},
		// The transport may dial a spare while a connection returns to the pool.
		{"keep-alive", true, func(c, r int) bool { return c <= 8 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, conns := countingServer(t, "node1", "node2")
			res, err := Run(context.Background(), Options{
				URL: srv.URL, Concurrency: 4, Requests: 300, KeepAlive: tt.keepAlive,
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Requests != 300 || res.Successes != 300 || res.Failures != 0 {
				t.Fatalf("requests %d successes %d failures %d (%v), want 300 300 0",
					res.Requests, res.Successes, res.Failures, res.FailureList)
			}
			if res.ByNode["node1"] != 150 || res.ByNode["node2"] != 150 {
				t.Errorf("by node %v, want 150 each", res.ByNode)
			}
			if res.Share["node1"] != 0.5 {
				t.Errorf("share of node1 %v, want 0.5", res.Share["node1"])
			}
			var sum int
			for _, s := range res.Timeline {
				sum += s.Successes + s.Failures
			}
			if sum != 300 {
				t.Errorf("timeline holds %d requests, want 300", sum)
			}
			if c := int(conns.Load()); !tt.wantConns(c, 300) {
				t.Errorf("%d connections for 300 requests", c)
			}
			// Every connection the client opened has its handshake timed.
			if !tt.wantConns(res.Connects, 300) || res.Connects == 0 || res.ConnectP99MS <= 0 || res.Delayed != 0 {
				t.Errorf("connects %d (p99 %.3f ms), delayed %d; want one per connection, timed, none delayed",
					res.Connects, res.ConnectP99MS, res.Delayed)
			}
		})
	}
}

func TestRunRateAndDuration(t *testing.T) {
	srv, _ := countingServer(t, "node1")
	var calls atomic.Int64
	res, err := Run(context.Background(), Options{
		URL: srv.URL, Concurrency: 4, Rate: 200, Duration: 1200 * time.Millisecond,
		Progress: func(p Progress) {
			calls.Add(1)
			if p.Requests == 0 || p.PerSecond <= 0 {
				t.Errorf("progress %+v shows no requests", p)
			}
		},
		ProgressEvery: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	// 200/s for 1.2 s schedules exactly 240 requests.
	if res.Requests != 240 || res.Failures != 0 {
		t.Errorf("requests %d failures %d, want 240 0", res.Requests, res.Failures)
	}
	// Requests start late when the machine stalls (the race detector on two
	// cores), so only the span of the timeline is checked; its arithmetic is
	// TestSummarize's.
	if n := len(res.Timeline); n < 12 || n > 14 {
		t.Errorf("timeline has %d slots, want 12 (1.2 s at 100 ms)", n)
	}
	if c := calls.Load(); c < 3 {
		t.Errorf("progress called %d times in 1.2 s at 300 ms, want >= 3", c)
	}
}

func TestRunNeedsBound(t *testing.T) {
	if _, err := Run(context.Background(), Options{URL: "http://127.0.0.1/"}); !errors.Is(err, ErrNoBound) {
		t.Errorf("err = %v, want ErrNoBound", err)
	}
}

// hijack returns a handler that takes the connection and ends it with end.
func hijack(end func(c *net.TCPConn)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			panic(err)
		}
		end(c.(*net.TCPConn))
	})
}

func TestRunErrorClasses(t *testing.T) {
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	refusedURL := "http://" + closed.Addr().String() + "/"
	closed.Close()

	tests := []struct {
		name    string
		handler http.Handler // nil: use url
		url     string
		want    ErrorClass
	}{
		{"server closes the connection", hijack(func(c *net.TCPConn) { c.Close() }), "", ErrClosed},
		{"server resets the connection", hijack(func(c *net.TCPConn) {
			c.SetLinger(0) // close sends RST
			c.Close()
		}), "", ErrReset},
		{"server answers 500", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "boom", http.StatusInternalServerError)
		}), "", ErrBadStatus},
		{"server does not answer", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done() // the client gives up first
		}), "", ErrTimeout},
		{"nobody listens", nil, refusedURL, ErrRefused},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := tt.url
			if tt.handler != nil {
				srv := httptest.NewServer(tt.handler)
				t.Cleanup(srv.Close)
				url = srv.URL
			}
			res, err := Run(context.Background(), Options{
				URL: url, Concurrency: 2, Requests: 10, Timeout: 200 * time.Millisecond,
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Failures != 10 || res.Errors[tt.want] != 10 {
				t.Fatalf("failures %d, errors %v; want 10 of %q (first: %+v)", res.Failures, res.Errors, tt.want, res.FailureList[0])
			}
			if len(res.FailureList) != 10 || res.FailureList[0].Error == "" {
				t.Errorf("failure list %+v, want 10 failures with their errors", res.FailureList)
			}
		})
	}
}

// TestRunCountsDroppedKeepAlive: a server that closes every keep-alive
// connection after its first response. The client retries a GET on a reused
// connection that was closed before anything came back, so nothing is lost;
// every request must be counted once, served.
func TestRunServerClosesKeepAlive(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%3 == 0 {
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close() // every third request dies mid-flight
			return
		}
		w.Header().Set(NodeHeader, "node1")
		w.Header().Set("Connection", "close")
	}))
	t.Cleanup(srv.Close)
	res, err := Run(context.Background(), Options{URL: srv.URL, Concurrency: 3, Requests: 90, KeepAlive: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 90 || res.Successes+res.Failures != 90 {
		t.Fatalf("requests %d = successes %d + failures %d, want 90", res.Requests, res.Successes, res.Failures)
	}
	if res.Failures == 0 || res.Errors[ErrClosed] != res.Failures {
		t.Errorf("failures %d errors %v, want some, all %q", res.Failures, res.Errors, ErrClosed)
	}
	if res.Successes == 0 || res.ByNode["node1"] != res.Successes {
		t.Errorf("successes %d by node %v", res.Successes, res.ByNode)
	}
}

func TestRunAbort(t *testing.T) {
	srv, _ := countingServer(t, "node1")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := Run(ctx, Options{URL: srv.URL, Duration: time.Hour}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want the context's error", err)
	}
}
