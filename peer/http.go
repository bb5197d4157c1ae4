package peer

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
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
// connections open at once, each over mutual TLS under certs.
func Listener(ln net.Listener, certs *Certs, refusals *Refusals) net.Listener {
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

// HandshakeTimeout bounds a TLS handshake on the peer API and Raft.
const HandshakeTimeout = 5 * time.Second
