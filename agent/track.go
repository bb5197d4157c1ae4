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
// once the tables that release buckets are in, so that the list includes
// every handshake those tables let begin) and, while the node holds
// connections in buckets it does not accept, every scanInterval, so that it
// sees them end. Results go to the data plane's mailbox: nobody waits for a
// scan. At rest it costs nothing.
type tracker struct {
	scan func(vips []netip.Addr) ([]conn, error)
	log  *slog.Logger

	req *mailbox[trackRequest] // from the data plane
	out *mailbox[held]         // results, to the data plane
}

// held is one scan's result.
type held struct {
	set   filter.Set // buckets with connections, under cfg
	conns int
	cfg   *filter.Config
	epoch uint64 // the request the scan began after
	guess bool   // not a scan's result: every bucket that may hold one
	err   error
}

// trackRequest says whether to keep scanning every scanInterval under cfg;
// a new epoch asks for a scan now. A scan's result carries the epoch of the
// latest request it began after, so the data plane can tell a scan made
// after a push of its tables from one made before.
type trackRequest struct {
	cfg   *filter.Config
	poll  bool
	epoch uint64
}

// scanInterval is how often the tracker lists the node's connections while
// buckets drain.
const scanInterval = 100 * time.Millisecond

func newTracker(scan func([]netip.Addr) ([]conn, error), log *slog.Logger) *tracker {
	return &tracker{scan: scan, log: log, req: newMailbox[trackRequest](), out: newMailbox[held]()}
}

// request says whether to keep scanning under cfg while buckets drain,
// and asks for a scan now if epoch is new. It never waits: the latest
// request replaces one the tracker has not taken yet.
func (t *tracker) request(cfg *filter.Config, poll bool, epoch uint64) {
	t.req.put(trackRequest{cfg: cfg, poll: poll, epoch: epoch})
}

func (t *tracker) once(cfg *filter.Config, epoch uint64) held {
	conns, err := t.scan(cfg.VIPs)
	if err != nil {
		t.log.Warn("socket scan", "err", err)
		return held{cfg: cfg, epoch: epoch, err: err}
	}
	return held{set: holdings(cfg, conns), conns: len(conns), cfg: cfg, epoch: epoch}
}

// run is the tracker goroutine.
func (t *tracker) run(ctx context.Context) {
	var cfg *filter.Config
	var epoch uint64
	var tick <-chan time.Time
	ticker := time.NewTicker(scanInterval)
	ticker.Stop()
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.req.ready:
			r := t.req.take()
			cfg = r.cfg
			if r.epoch != epoch {
				epoch = r.epoch
				t.out.put(t.once(cfg, epoch))
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
			t.out.put(t.once(cfg, epoch))
		}
	}
}
