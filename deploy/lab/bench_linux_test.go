package lab

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/shoalnet/shoal/internal/netnstest"
)

// BenchmarkDirectHTTP measures the lab's plumbing without shoal: the client's
// load generator against one node's `lab serve` on the node's own address,
// over the bridge. It is the baseline the VIP figures compare with
// (requests/s through shoal vs straight to a node).
func BenchmarkDirectHTTP(b *testing.B) {
	for _, ka := range []struct {
		name      string
		keepAlive bool
	}{{"new-connection", false}, {"keep-alive", true}} {
		b.Run(ka.name, func(b *testing.B) {
			needRoot(b)
			l := upForTest(b, 1)
			n := l.Nodes[0]
			if _, err := l.Start(n.Name, "serve", "lab", "serve", "--name", n.Name, "--listen", n.Addr.String()+":80"); err != nil {
				b.Fatal(err)
			}
			if err := Poll(context.Background(), 5*time.Second, 20*time.Millisecond, func() error {
				var err error
				ierr := netnstest.Do(b, l.Client.Namespace, func() error {
					c, derr := net.DialTimeout("tcp", n.Addr.String()+":80", time.Second)
					if derr == nil {
						c.Close()
					}
					err = derr
					return nil
				})
				return errors.Join(ierr, err)
			}); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			var reqs, secs float64
			var p99 float64
			for range b.N {
				res, err := l.Load(context.Background(), LoadArgs{URL: "http://" + n.Addr.String() + "/",
					Duration: 2 * time.Second, Concurrency: 8, KeepAlive: ka.keepAlive}, nil)
				if err != nil {
					b.Fatal(err)
				}
				if res.Failures != 0 {
					b.Fatalf("%d failures: %v", res.Failures, res.Errors)
				}
				reqs += float64(res.Requests)
				secs += res.DurationMS / 1000
				p99 = max(p99, res.P99MS)
			}
			b.ReportMetric(reqs/secs, "req/s")
			b.ReportMetric(p99, "p99-ms")
		})
	}
}
