package rules

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
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

// tlsStream is a raft.StreamLayer over mutual TLS.
type tlsStream struct {
	ln        net.Listener
	advertise net.Addr
	certs     *peer.Certs
	// admitAddr says whether a connection from an address may handshake,
	// admitName whether a peer with that certificate may talk Raft.
	admitAddr func(netip.Addr) bool
	admitName func(string) bool
	refusals  *peer.Refusals
	log       *slog.Logger

	handshakes chan struct{} // one token per handshake in progress
	conns      chan net.Conn
	done       chan struct{}
	closeOnce  sync.Once
}

// streamConfig is what listenTLSStream needs.
type streamConfig struct {
	bind      string
	advertise net.Addr // nil: the bound address, which must then be a specific IP
	certs     *peer.Certs
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
	if cfg.admitAddr == nil {
		cfg.admitAddr = func(netip.Addr) bool { return true }
	}
	if cfg.admitName == nil {
		cfg.admitName = func(string) bool { return true }
	}
	a := &tlsStream{
		ln: peer.LimitListener(ln, "raft", maxRaftConns, cfg.refusals), advertise: addr, certs: cfg.certs,
		admitAddr: cfg.admitAddr, admitName: cfg.admitName, refusals: cfg.refusals, log: cfg.log,
		handshakes: make(chan struct{}, maxRaftHandshakes), conns: make(chan net.Conn), done: make(chan struct{}),
	}
	go a.acceptLoop()
	return a, nil
}

// acceptLoop accepts connections and hands over those that pass the
// checks; handshakes run concurrently, a bounded number at once, so a slow
// or hostile client holds up no one.
func (a *tlsStream) acceptLoop() {
	for {
		c, err := a.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			a.log.Warn("raft accept", "err", err)
			select {
			case <-a.done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err != nil || !a.admitAddr(ap.Addr().Unmap()) {
			a.refusals.Refuse("raft", peer.RefuseAddress, c.RemoteAddr(), nil)
			c.Close()
			continue
		}
		select {
		case a.handshakes <- struct{}{}:
		default:
			a.refusals.Refuse("raft", peer.RefuseTooMany, c.RemoteAddr(), errors.New("too many handshakes in progress"))
			c.Close()
			continue
		}
		go func() {
			tc, err := a.serverHandshake(c)
			<-a.handshakes
			if err != nil {
				c.Close()
				return
			}
			select {
			case a.conns <- &idleConn{Conn: tc, idle: raftIdleTimeout}:
			case <-a.done:
				tc.Close()
			}
		}()
	}
}

func (a *tlsStream) serverHandshake(c net.Conn) (*tls.Conn, error) {
	tc := tls.Server(c, a.certs.ServerConfig())
	ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		a.refusals.Refuse("raft", peer.RefuseHandshake, c.RemoteAddr(), err)
		return nil, err
	}
	st := tc.ConnectionState()
	if name := peer.Name(&st); !a.admitName(name) {
		err := fmt.Errorf("%q is not a node of this cluster", name)
		a.refusals.Refuse("raft", peer.RefuseNotMember, c.RemoteAddr(), err)
		return nil, err
	}
	return tc, nil
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

// Accept implements net.Listener.
func (a *tlsStream) Accept() (net.Conn, error) {
	select {
	case c := <-a.conns:
		return c, nil
	case <-a.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (a *tlsStream) Close() error {
	var err error
	a.closeOnce.Do(func() {
		close(a.done)
		err = a.ln.Close()
	})
	return err
}

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
