package track

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"github.com/shoalnet/shoal/agent/internal/mailbox"
	"github.com/shoalnet/shoal/filter"
)

// Tracker owns the knowledge of which buckets this node holds connections
// in. It lists the sockets on the VIPs only when asked (the data plane asks
// once the tables that release buckets are in, so that the list includes
// every handshake those tables let begin) and, while the node holds
// connections in buckets it does not accept, every scanInterval, so that it
// sees them end. Results go to the data plane's mailbox: nobody waits for a
// scan. At rest it costs nothing.
type Tracker struct {
	scan func(vips []netip.Addr) ([]Conn, error)
	log  *slog.Logger

	req *mailbox.Box[request] // from the data plane
	// Out has the scans' results, for the data plane.
	Out *mailbox.Box[Held]
}

// Held is one scan's result.
type Held struct {
	Set   filter.Set // buckets with connections, under Cfg
	Conns int
	Cfg   *filter.Config
	Epoch uint64 // the request the scan began after
	Guess bool   // not a scan's result: every bucket that may hold one
	Err   error
}

// request says whether to keep scanning every scanInterval under cfg;
// a new epoch asks for a scan now. A scan's result carries the epoch of the
// latest request it began after, so the data plane can tell a scan made
// after a push of its tables from one made before.
type request struct {
	cfg   *filter.Config
	poll  bool
	epoch uint64
}

// scanInterval is how often the tracker lists the node's connections while
// buckets drain.
const scanInterval = 100 * time.Millisecond

// New returns a tracker that lists connections with scan (Scan on a host).
func New(scan func([]netip.Addr) ([]Conn, error), log *slog.Logger) *Tracker {
	return &Tracker{scan: scan, log: log, req: mailbox.New[request](), Out: mailbox.New[Held]()}
}

// Request says whether to keep scanning under cfg while buckets drain,
// and asks for a scan now if epoch is new. It never waits: the latest
// request replaces one the tracker has not taken yet.
func (t *Tracker) Request(cfg *filter.Config, poll bool, epoch uint64) {
	t.req.Put(request{cfg: cfg, poll: poll, epoch: epoch})
}

func (t *Tracker) once(cfg *filter.Config, epoch uint64) Held {
	conns, err := t.scan(cfg.VIPs)
	if err != nil {
		t.log.Warn("socket scan", "err", err)
		return Held{Cfg: cfg, Epoch: epoch, Err: err}
	}
	return Held{Set: holdings(cfg, conns), Conns: len(conns), Cfg: cfg, Epoch: epoch}
}

// Run is the tracker goroutine; it returns when ctx ends.
func (t *Tracker) Run(ctx context.Context) {
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
		case <-t.req.Ready:
			r := t.req.Take()
			cfg = r.cfg
			if r.epoch != epoch {
				epoch = r.epoch
				t.Out.Put(t.once(cfg, epoch))
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
			t.Out.Put(t.once(cfg, epoch))
		}
	}
}
