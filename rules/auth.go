package rules

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

// The peer API runs over HTTPS with mutual TLS 1.3 (see Certs), which
// authenticates both ends, encrypts requests and replies, and makes a
// captured connection useless to replay: each connection has fresh keys,
// and records carry sequence numbers. What is left to check per request is
// who may ask for what: see authorize.

// KeySize is the length of the cluster key.
const KeySize = 32

// MaxPeerBody bounds a peer request's body; real ones are a few hundred
// bytes (a command is at most maxCommandSize).
const MaxPeerBody = maxCommandSize + 4096

// maxPeerReply bounds a peer API reply read by a client.
const maxPeerReply = 1 << 20

func checkKey(key []byte) error {
	if len(key) != KeySize {
		return fmt.Errorf("%w: cluster key is %d bytes, want %d", ErrInvalid, len(key), KeySize)
	}
	return nil
}

// Access says who may call a peer API endpoint.
type Access int

// Access levels.
const (
	// AnyCertified: any client with a certificate of the cluster, from any
	// address (joins, and drills when enabled).
	AnyCertified Access = iota
	// MembersOnly: a client whose certificate names a registered node,
	// connecting from a registered node's address. While this node knows no
	// cluster, it is AnyCertified.
	MembersOnly
)

// Authorize wraps h so that it only sees requests over mutual TLS from a
// client the access level admits, with bodies capped at MaxPeerBody. The
// agent wraps its own peer endpoints with it too.
func (s *Store) Authorize(access Access, h http.Handler) http.Handler {
	h = http.MaxBytesHandler(h, MaxPeerBody)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if reason, err := s.authorize(access, r); err != nil {
			s.cfg.Refusals.Refuse("peer", reason, remoteAddr(r), err)
			http.Error(w, "forbidden: "+err.Error(), http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (s *Store) authorize(access Access, r *http.Request) (reason string, err error) {
	name := PeerName(r.TLS)
	if name == "" {
		return RefuseHandshake, fmt.Errorf("no client certificate; peers must use mutual TLS")
	}
	if access == AnyCertified {
		return "", nil
	}
	names, ips, ok := s.knownPeers()
	if !ok {
		return "", nil
	}
	ap, perr := netip.ParseAddrPort(r.RemoteAddr)
	if perr != nil || !ips[ap.Addr().Unmap()] {
		return RefuseAddress, fmt.Errorf("%s is not the address of a node of this cluster", r.RemoteAddr)
	}
	if !names[name] {
		return RefuseNotMember, fmt.Errorf("%q is not a node of this cluster", name)
	}
	// A forwarded request names the member that forwarded it; it must be
	// the one whose certificate came with it.
	if fw := r.Header.Get(headerForwarded); fw != "" && fw != name {
		return RefuseImpersonate, fmt.Errorf("request forwarded on behalf of %q with the certificate of %q", fw, name)
	}
	return "", nil
}

// remoteAddr is r's client address for a refusal's log line.
type addrString string

func (a addrString) Network() string { return "tcp" }
func (a addrString) String() string  { return string(a) }

func remoteAddr(r *http.Request) addrString { return addrString(r.RemoteAddr) }

// NewPeerClient returns an HTTPS client that presents certs' certificate
// and checks the server's, for the peer API of rules and of the agent.
func NewPeerClient(certs *Certs) *http.Client {
	tr := &http.Transport{
		TLSClientConfig:       certs.ClientConfig(),
		ForceAttemptHTTP2:     false,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   handshakeTimeout,
		ResponseHeaderTimeout: 30 * time.Second,
	}
	return &http.Client{Transport: tr}
}

// PeerURL returns the URL of path on the peer API at addr (host:port).
func PeerURL(addr, path string) string {
	return "https://" + addr + "/" + strings.TrimPrefix(path, "/")
}

// NewPeerServer returns an HTTP server for a peer API listener, with
// timeouts that keep a slow or idle client from holding a connection: the
// TLS handshake and the request headers must arrive within 5 s, the whole
// request within 10 s, and the reply (a join waits for Raft) within 30 s.
// Errors it would print are counted in refusals under listener instead.
func NewPeerServer(h http.Handler, listener string, refusals *Refusals) *http.Server {
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

// PeerListener wraps a TCP listener for the peer API: at most maxPeerConns
// connections open at once, each over mutual TLS under certs.
func PeerListener(ln net.Listener, certs *Certs, refusals *Refusals) net.Listener {
	return tls.NewListener(LimitListener(ln, "peer", maxPeerConns, refusals), certs.ServerConfig())
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
