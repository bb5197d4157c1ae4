package peer

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// KeySize is the length of the cluster key.
const KeySize = 32

// CheckKey reports whether key can be a cluster key.
func CheckKey(key []byte) error {
	if len(key) != KeySize {
		return fmt.Errorf("%w: cluster key is %d bytes, want %d", ErrInvalid, len(key), KeySize)
	}
	return nil
}

// NewClient returns an HTTPS client that presents certs' certificate
// and checks the server's, for the peer API of rules and of the agent.
func NewClient(certs *Certs) *http.Client {
	tr := &http.Transport{
		TLSClientConfig:       certs.ClientConfig(),
		ForceAttemptHTTP2:     false,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   HandshakeTimeout,
		ResponseHeaderTimeout: 30 * time.Second,
	}
	return &http.Client{Transport: tr}
}

// URL returns the URL of path on the peer API at addr (host:port).
func URL(addr, path string) string {
	return "https://" + addr + "/" + strings.TrimPrefix(path, "/")
}

// NewServer returns an HTTP server for a peer API listener, with
// timeouts that keep a slow or idle client from holding a connection: the
// TLS handshake and the request headers must arrive within 5 s, the whole
// request within 10 s, and the reply (a join waits for Raft) within 30 s.
// Errors it would print are counted in refusals under listener instead.
func NewServer(h http.Handler, listener string, refusals *Refusals) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    8 << 10,
		ErrorLog:          refusalLog(listener, refusals),
	}
}

// maxPeerConns bounds the peer API's connections open at once.
const maxPeerConns = 256

// Listener wraps a TCP listener for the peer API: at most maxPeerConns
// connections open at once, each over mutual TLS under certs, and at most
// maxHandshakes of them in their TLS handshake at once.
func Listener(ln net.Listener, certs *Certs, refusals *Refusals) net.Listener {
	return NewHandshakeListener(LimitListener(ln, "peer", maxPeerConns, refusals), HandshakeConfig{
		Name: "peer", TLS: certs.ServerConfig(), Slots: maxHandshakes, Refusals: refusals,
	})
}

// maxHandshakes bounds the peer API's TLS handshakes in progress at once.
// A handshake is a millisecond or more of CPU, and the agent runs its Go
// code on one thread: when a peer falls silent, every other node probes
// it (docs/MEMBERSHIP.md), and a node slow for want of CPU (the Raft
// leader of a 64-node lab on two cores) had 63 handshakes queued ahead of
// its heartbeats, which made it later still, then dead (docs/
// BENCHMARKS-LOG.md, "Scaling, fifth step"). Past the bound a connection
// is closed at once and counted (RefuseTooMany): a probe refused finds the
// peer silent, as it is, and tries again while the peer stays a suspect.
const maxHandshakes = 16

// HandshakeConfig is what a HandshakeListener checks and how.
type HandshakeConfig struct {
	Name     string      // the listener's name in the refusals: "peer", "raft"
	TLS      *tls.Config // the server's side of the handshake
	Slots    int         // handshakes in progress at most (at least 1)
	Refusals *Refusals
	// Admit, when set, says whether a connection from remote may
	// handshake at all; one it refuses is closed and counted
	// (RefuseAddress) before any TLS work.
	Admit func(remote net.Addr) bool
	// Check, when set, judges the peer of a completed handshake; an error
	// closes the connection, counted (RefuseNotMember).
	Check func(*tls.ConnectionState) error
	// Log, when set, hears of accept failures other than a close (out of
	// file descriptors, say), after which the listener goes on.
	Log *slog.Logger
}

// HandshakeListener completes each connection's TLS handshake before
// Accept returns it (the server's own handshake is then a no-op), at most
// Slots at a time, each within HandshakeTimeout: a connection past the
// slots is closed at once and counted (RefuseTooMany), so a slow or
// hostile client holds up no one, and a flood of them costs no more CPU
// than Slots handshakes at a time. The peer API and Raft accept through
// it.
type HandshakeListener struct {
	net.Listener
	cfg    HandshakeConfig
	slots  chan struct{}
	ready  chan *tls.Conn
	failed chan error // the inner Accept's error that ended the loop
	done   chan struct{}
	close  sync.Once
}

// NewHandshakeListener accepts from ln, which it owns from now on.
func NewHandshakeListener(ln net.Listener, cfg HandshakeConfig) *HandshakeListener {
	l := &HandshakeListener{Listener: ln, cfg: cfg,
		slots: make(chan struct{}, max(cfg.Slots, 1)), ready: make(chan *tls.Conn), failed: make(chan error, 1), done: make(chan struct{})}
	go l.acceptLoop()
	return l
}

func (l *HandshakeListener) acceptLoop() {
	for {
		c, err := l.Listener.Accept()
		if errors.Is(err, net.ErrClosed) {
			l.failed <- err
			return
		}
		if err != nil {
			// Out of file descriptors, say: the listener stays, as an
			// http.Server's own loop would keep it.
			if l.cfg.Log != nil {
				l.cfg.Log.Warn("accept", "listener", l.cfg.Name, "err", err)
			}
			select {
			case <-l.done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		if l.cfg.Admit != nil && !l.cfg.Admit(c.RemoteAddr()) {
			l.cfg.Refusals.Refuse(l.cfg.Name, RefuseAddress, c.RemoteAddr(), nil)
			c.Close()
			continue
		}
		select {
		case l.slots <- struct{}{}:
		default:
			l.cfg.Refusals.Refuse(l.cfg.Name, RefuseTooMany, c.RemoteAddr(), errors.New("too many TLS handshakes in progress"))
			c.Close()
			continue
		}
		go l.handshake(c)
	}
}

func (l *HandshakeListener) handshake(c net.Conn) {
	tc, err := l.serverHandshake(c)
	<-l.slots
	if err != nil {
		c.Close()
		return
	}
	select {
	case l.ready <- tc:
	case <-l.done:
		tc.Close()
	}
}

func (l *HandshakeListener) serverHandshake(c net.Conn) (*tls.Conn, error) {
	tc := tls.Server(c, l.cfg.TLS)
	ctx, cancel := context.WithTimeout(context.Background(), HandshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		l.cfg.Refusals.Refuse(l.cfg.Name, RefuseHandshake, c.RemoteAddr(), err)
		return nil, err
	}
	if l.cfg.Check != nil {
		st := tc.ConnectionState()
		if err := l.cfg.Check(&st); err != nil {
			l.cfg.Refusals.Refuse(l.cfg.Name, RefuseNotMember, c.RemoteAddr(), err)
			return nil, err
		}
	}
	return tc, nil
}

// Accept returns the next connection whose handshake completed (a
// *tls.Conn).
func (l *HandshakeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case err := <-l.failed:
		l.failed <- err // for the next Accept
		return nil, err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting; connections in their handshake are closed as
// they finish it. Safe to call twice.
func (l *HandshakeListener) Close() error {
	err := net.ErrClosed
	l.close.Do(func() {
		close(l.done)
		err = l.Listener.Close()
	})
	return err
}

// refusalLog is an http.Server's error log: it counts failed TLS
// handshakes (and anything else the server would print) as refusals of
// listener, logged at a bounded rate, instead of one log line each.
func refusalLog(listener string, r *Refusals) *log.Logger {
	return log.New(refusalWriter{listener: listener, r: r}, "", 0)
}

type refusalWriter struct {
	listener string
	r        *Refusals
}

func (w refusalWriter) Write(p []byte) (int, error) {
	reason := "http_error"
	if bytes.Contains(p, []byte("TLS handshake error")) {
		reason = RefuseHandshake
	}
	w.r.Refuse(w.listener, reason, nil, errors.New(string(bytes.TrimSpace(p))))
	return len(p), nil
}

// HandshakeTimeout bounds a TLS handshake on the peer API and Raft.
const HandshakeTimeout = 5 * time.Second
