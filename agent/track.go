package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"github.com/shoalnet/shoal/filter"
)

// tracker owns the knowledge of which buckets this node holds connections
// in. It lists the sockets on the VIPs only when asked (the data plane asks
// on every view change, before the tables that release buckets are pushed)
// and, while the node holds connections in buckets it does not accept, every
// scanInterval, so that it sees them end. At rest it costs nothing.
type tracker struct {
	scan func(vips []netip.Addr) ([]conn, error)
	log  *slog.Logger

	req chan trackRequest
	out *mailbox[held] // periodic results, to the data plane
}

// held is one scan's result.
type held struct {
	set   filter.Set // buckets with connections, under cfg
	conns int
	cfg   *filter.Config
	err   error
}

// trackRequest asks for a scan now (reply not nil) and says whether to keep
// scanning every scanInterval afterwards, under cfg.
type trackRequest struct {
	cfg   *filter.Config
	poll  bool
	reply chan held
}

// scanInterval is how often the tracker lists the node's connections while
// buckets drain.
const scanInterval = 100 * time.Millisecond

func newTracker(scan func([]netip.Addr) ([]conn, error), log *slog.Logger) *tracker {
	return &tracker{scan: scan, log: log, req: make(chan trackRequest), out: newMailbox[held]()}
}

// scanNow scans at once and returns the result; poll says whether to keep
// scanning while buckets drain. It returns the zero held if ctx ends first.
func (t *tracker) scanNow(ctx context.Context, cfg *filter.Config, poll bool) held {
	reply := make(chan held, 1)
	select {
	case t.req <- trackRequest{cfg: cfg, poll: poll, reply: reply}:
	case <-ctx.Done():
		return held{err: ctx.Err()}
	}
	select {
	case h := <-reply:
		return h
	case <-ctx.Done():
		return held{err: ctx.Err()}
	}
}

// setPolling starts or stops the periodic scans without scanning now.
func (t *tracker) setPolling(ctx context.Context, cfg *filter.Config, poll bool) {
	select {
	case t.req <- trackRequest{cfg: cfg, poll: poll}:
	case <-ctx.Done():
	}
}

func (t *tracker) once(cfg *filter.Config) held {
	conns, err := t.scan(cfg.VIPs)
	if err != nil {
		t.log.Warn("socket scan", "err", err)
		return held{cfg: cfg, err: err}
	}
	return held{set: holdings(cfg, conns), conns: len(conns), cfg: cfg}
}

// run is the tracker goroutine.
func (t *tracker) run(ctx context.Context) {
	var cfg *filter.Config
	var tick <-chan time.Time
	ticker := time.NewTicker(scanInterval)
	ticker.Stop()
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-t.req:
			cfg = r.cfg
			if r.reply != nil {
				r.reply <- t.once(cfg)
			}
			switch {
			case r.poll && tick == nil:
				ticker.Reset(scanInterval)
				tick = ticker.C
			case !r.poll && tick != nil:
				ticker.Stop()
				tick = nil
			}
		case <-tick:
			t.out.put(t.once(cfg))
		}
	}
}
