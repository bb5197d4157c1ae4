package rules

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/hashicorp/raft"
	"github.com/shoalnet/shoal/peer"
)

// Raft's connections run over mutual TLS 1.3 (see Certs): without it,
// anyone who reaches the Raft port, or sits on the path, could append
// entries. A connection reaches Raft only when it comes from the address of
// a known node, completes its handshake in time with a certificate of the
// cluster, and names a known node (see Store.admit). A node that knows no
// cluster yet (it waits to be joined) takes any certificate of the cluster.
const (
	handshakeTimeout = peer.HandshakeTimeout // a TLS handshake on Raft
	// raftIdleTimeout closes an accepted connection with nothing to read
	// for this long; a leader sends heartbeats every few tens of ms, and
	// Raft redials a connection it lost.
	raftIdleTimeout = 2 * time.Minute
	// maxRaftConns bounds the accepted connections open at once (Raft pools
	// up to three per peer) and maxRaftHandshakes those still handshaking.
	maxRaftConns      = 256
	maxRaftHandshakes = 16
)

// tlsStream is a raft.StreamLayer over mutual TLS: it accepts through a
// peer.HandshakeListener (a bounded number of handshakes at once, so a
// slow or hostile client holds up no one), which admits a connection by
// its address and its certificate's node name.
type tlsStream struct {
	ln        *peer.HandshakeListener
	advertise net.Addr
	certs     *peer.Certs
	// admitName says whether a peer with that certificate may talk Raft.
	admitName func(string) bool
}

// streamConfig is what listenTLSStream needs.
type streamConfig struct {
	bind      string
	advertise net.Addr // nil: the bound address, which must then be a specific IP
	certs     *peer.Certs
	// admitAddr says whether a connection from an address may handshake,
	// admitName whether a peer with that certificate may talk Raft.
	admitAddr func(netip.Addr) bool
	admitName func(string) bool
	refusals  *peer.Refusals
	log       *slog.Logger
}

func listenTLSStream(cfg streamConfig) (*tlsStream, error) {
	ln, err := net.Listen("tcp", cfg.bind)
	if err != nil {
		return nil, err
	}
	addr := cfg.advertise
	if addr == nil {
		addr = ln.Addr()
	}
	if ta, ok := addr.(*net.TCPAddr); !ok || ta.IP == nil || ta.IP.IsUnspecified() {
		ln.Close()
		return nil, fmt.Errorf("%w: raft address %s cannot be dialled by peers; set the raft advertise address", ErrInvalid, addr)
	}
	admitAddr, admitName := cfg.admitAddr, cfg.admitName
	if admitAddr == nil {
		admitAddr = func(netip.Addr) bool { return true }
	}
	if admitName == nil {
		admitName = func(string) bool { return true }
	}
	hl := peer.NewHandshakeListener(peer.LimitListener(ln, "raft", maxRaftConns, cfg.refusals), peer.HandshakeConfig{
		Name: "raft", TLS: cfg.certs.ServerConfig(), Slots: maxRaftHandshakes, Refusals: cfg.refusals, Log: cfg.log,
		Admit: func(remote net.Addr) bool {
			ap, err := netip.ParseAddrPort(remote.String())
			return err == nil && admitAddr(ap.Addr().Unmap())
		},
		Check: func(st *tls.ConnectionState) error {
			if name := peer.Name(st); !admitName(name) {
				return fmt.Errorf("%q is not a node of this cluster", name)
			}
			return nil
		},
	})
	return &tlsStream{ln: hl, advertise: addr, certs: cfg.certs, admitName: admitName}, nil
}

// Dial implements raft.StreamLayer.
func (a *tlsStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if timeout <= 0 {
		timeout = handshakeTimeout
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout}, Config: a.certs.ClientConfig()}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", string(addr))
	if err != nil {
		return nil, fmt.Errorf("raft peer %s: %w", addr, err)
	}
	tc := c.(*tls.Conn)
	st := tc.ConnectionState()
	if name := peer.Name(&st); !a.admitName(name) {
		tc.Close()
		return nil, fmt.Errorf("%w: raft peer %s presents a certificate for %q, not a node of this cluster", ErrAuth, addr, name)
	}
	return tc, nil
}

// Accept implements net.Listener: the next connection that passed the
// checks, closed after raftIdleTimeout without a byte to read.
func (a *tlsStream) Accept() (net.Conn, error) {
	c, err := a.ln.Accept()
	if err != nil {
		return nil, err
	}
	return &idleConn{Conn: c, idle: raftIdleTimeout}, nil
}

// Close implements net.Listener.
func (a *tlsStream) Close() error { return a.ln.Close() }

// Addr implements net.Listener: the address peers dial.
func (a *tlsStream) Addr() net.Addr { return a.advertise }

// idleConn closes a connection on which nothing arrives for idle: each
// read pushes the deadline on.
type idleConn struct {
	net.Conn
	idle time.Duration
}

func (c *idleConn) Read(p []byte) (int, error) {
	c.Conn.SetReadDeadline(time.Now().Add(c.idle))
	return c.Conn.Read(p)
}
