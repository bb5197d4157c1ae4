package agent

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/shoalnet/shoal/agent/config"
	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/peer"
	"github.com/shoalnet/shoal/rules"
)

// security is the agent's TLS identity, its refusal counters and the
// pulled plug's restore timer.
type security struct {
	keys     [][]byte // the cluster keys at start, the primary first
	certs    *peer.Certs
	refusals *peer.Refusals
	restorer control.PlugRestorer
}

// tlsOptions is how the config says to get certificates: files of an
// operator CA, or a CA derived from the cluster key.
func tlsOptions(cfg *config.Config, key []byte) peer.TLSOptions {
	o := peer.TLSOptions{Name: cfg.NodeName, Keys: [][]byte{key},
		CAFile: cfg.TLS.CAFile, CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile}
	for _, hp := range []string{cfg.PeerAddr, cfg.RaftAddr, cfg.HeartbeatAddr} {
		if ap, err := netip.ParseAddrPort(hp); err == nil && !ap.Addr().IsUnspecified() {
			o.Addrs = append(o.Addrs, ap.Addr())
		}
	}
	return o
}

func newSecurity(cfg *config.Config, key []byte, a *Agent) (*security, error) {
	keys, err := readKeys(cfg)
	if err != nil {
		return nil, err
	}
	opts := tlsOptions(cfg, key)
	opts.Keys = keys
	certs, err := peer.NewCerts(opts)
	if err != nil {
		return nil, err
	}
	return &security{keys: keys, certs: certs, refusals: peer.NewRefusals(a.log)}, nil
}

// servePeerAPI serves the peer API on cfg.PeerAddr over mutual TLS, with
// timeouts and a connection cap, until the returned function stops it.
func (a *Agent) servePeerAPI() (stop func() error, err error) {
	ln, err := net.Listen("tcp", a.cfg.PeerAddr)
	if err != nil {
		return nil, fmt.Errorf("peer api: %w", err)
	}
	srv := peer.NewServer(a.peerHandler(), "peer", a.sec.refusals)
	go srv.Serve(peer.Listener(ln, a.sec.certs, a.sec.refusals))
	return srv.Close, nil
}

// maxMetricsConns bounds the metrics listener's open connections.
const maxMetricsConns = 32

// serveMetrics serves h on addr with timeouts and a connection cap: a
// scrape is a short GET, nothing may hold the listener.
func (a *Agent) serveMetrics(addr string, h http.Handler) (stop func() error, err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	srv := &http.Server{
		Handler: http.MaxBytesHandler(h, 4<<10), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 10 * time.Second, IdleTimeout: 60 * time.Second, MaxHeaderBytes: 8 << 10,
	}
	go srv.Serve(peer.LimitListener(ln, "metrics", maxMetricsConns, a.sec.refusals))
	return srv.Close, nil
}

// peerHandler serves other agents and tools: the rules peer API, the
// node's status for members, and the drill endpoint when drills are
// enabled. Every request comes over mutual TLS (see rules.Authorize).
func (a *Agent) peerHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(rules.PeerPathPrefix, a.store.PeerHandler())
	if a.cfg.Drills {
		mux.Handle("POST /v1/peer/plug", a.store.Authorize(rules.AnyCertified, control.Handle(a.Plug)))
	} else {
		mux.HandleFunc("POST /v1/peer/plug", func(w http.ResponseWriter, r *http.Request) {
			control.WriteJSON(w, http.StatusForbidden, control.APIError{Error: "drills are disabled on this node; set drills: true in its config to allow them"})
		})
	}
	a.doctorPeerHandlers(mux)
	mux.Handle("GET /v1/peer/sample", a.store.Authorize(rules.MembersOnly, a.once(a.sampleHandler())))
	mux.Handle("GET /v1/peer/flow", a.store.Authorize(rules.MembersOnly, a.once(a.flowPeerHandler())))
	mux.Handle("GET "+control.PathAlive, a.store.Authorize(rules.MembersOnly, control.AliveHandler(a.outOfMembership)))
	mux.Handle("GET /v1/peer/status", a.store.Authorize(rules.MembersOnly, a.once(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		control.WriteJSON(w, http.StatusOK, a.Status())
	}))))
	return control.Recoverer(mux)
}

// once serves reads (GET) only once the node runs: until then its
// snapshots are not published (the peer API serves Raft before the node
// exists, the control socket opens before its first step), and a read of
// them would find nothing. The caller is told to ask again. Commands go
// to the replicated store, which is there already.
func (a *Agent) once(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := a.running.Load(); r.Method == http.MethodGet && (n == nil || n.Snap() == nil) {
			w.Header().Set("Retry-After", "1")
			control.WriteJSON(w, http.StatusServiceUnavailable, control.APIError{Error: "the agent is starting; ask again in a moment"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// plug pulls or restores the virtual plug. A pull restores itself after
// r.RestoreAfter, at most MaxPlugPull (also its default).
func (a *Agent) Plug(ctx context.Context, r control.PlugRequest) error {
	a.sec.restorer.Arm(r, func(after time.Duration) {
		a.log.Warn("virtual plug restores itself", "after", after)
		if err := a.setPlug(context.Background(), control.PlugRequest{Pulled: false}); err != nil {
			a.log.Error("restore the virtual plug", "err", err)
		}
	})
	return a.setPlug(ctx, r)
}

// reportCommandLevel tells the cluster which command level this build
// applies, after an upgrade (see rules.CommandLevel). It is not fatal: the
// leader just keeps refusing newer commands.
func (a *Agent) reportCommandLevel(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := a.store.ReportCommandLevel(cctx); err != nil {
		a.log.Warn("report this node's command level", "level", rules.CommandLevel, "err", err)
	}
}

// outOfMembership reports whether this node takes no part in membership:
// not running yet, or its virtual plug pulled. Probes are answered 503.
func (a *Agent) outOfMembership() bool {
	n := a.running.Load()
	if n == nil {
		return true
	}
	s := n.Snap()
	return s == nil || s.Plugged()
}
