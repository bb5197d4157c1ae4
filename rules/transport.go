package rules

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Raft's own TCP connections are authenticated with the cluster key too:
// without it, anyone who reaches the Raft port could append entries. Each
// connection starts with a mutual challenge-response before Raft sees it:
//
//	dialer -> listener: raftMagic, dialer nonce (16 bytes)
//	listener -> dialer: listener nonce (16), HMAC(key, "listener", nonces)
//	dialer -> listener: HMAC(key, "dialer", nonces)
//
// Each side proves it holds the key over nonces the other chose, so a
// recorded handshake cannot be replayed. The stream after the handshake is
// plain TCP, as in raft.NewTCPTransport.
const (
	raftMagic        = "shoalrf1"
	nonceSize        = 16
	handshakeTimeout = 5 * time.Second
)

func handshakeMAC(key []byte, role string, dialerNonce, listenerNonce []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(raftMagic))
	m.Write([]byte(role))
	m.Write(dialerNonce)
	m.Write(listenerNonce)
	return m.Sum(nil)
}

// authStream is a raft.StreamLayer over TCP whose connections have passed
// the handshake.
type authStream struct {
	ln        net.Listener
	advertise net.Addr
	key       []byte
	log       *slog.Logger
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

// listenAuthStream listens on bind. Peers dial advertise, or the bound
// address when advertise is nil, which must then be a specific IP.
func listenAuthStream(bind string, advertise net.Addr, key []byte, log *slog.Logger) (*authStream, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	addr := advertise
	if addr == nil {
		addr = ln.Addr()
	}
	if ta, ok := addr.(*net.TCPAddr); !ok || ta.IP == nil || ta.IP.IsUnspecified() {
		ln.Close()
		return nil, fmt.Errorf("%w: raft address %s cannot be dialled by peers; set the raft advertise address", ErrInvalid, addr)
	}
	a := &authStream{ln: ln, advertise: addr, key: bytes.Clone(key), log: log, conns: make(chan net.Conn), done: make(chan struct{})}
	go a.acceptLoop()
	return a, nil
}

// acceptLoop accepts connections and hands over those whose handshake
// succeeds; handshakes run concurrently so a slow peer holds up no one.
func (a *authStream) acceptLoop() {
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
		go func() {
			if err := a.serverHandshake(c); err != nil {
				a.log.Warn("refused raft connection", "remote", c.RemoteAddr(), "err", err)
				c.Close()
				return
			}
			select {
			case a.conns <- c:
			case <-a.done:
				c.Close()
			}
		}()
	}
}

func (a *authStream) serverHandshake(c net.Conn) error {
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	hello := make([]byte, len(raftMagic)+nonceSize)
	if _, err := io.ReadFull(c, hello); err != nil {
		return fmt.Errorf("read hello: %w", err)
	}
	if string(hello[:len(raftMagic)]) != raftMagic {
		return errors.New("not a shoal raft peer")
	}
	dn := hello[len(raftMagic):]
	ln := make([]byte, nonceSize)
	rand.Read(ln)
	if _, err := c.Write(append(bytes.Clone(ln), handshakeMAC(a.key, "listener", dn, ln)...)); err != nil {
		return fmt.Errorf("write challenge: %w", err)
	}
	got := make([]byte, sha256.Size)
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("read proof: %w", err)
	}
	if !hmac.Equal(got, handshakeMAC(a.key, "dialer", dn, ln)) {
		return errors.New("bad proof; is the cluster key the same on every node?")
	}
	return c.SetDeadline(time.Time{})
}

// Dial implements raft.StreamLayer.
func (a *authStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", string(addr), timeout)
	if err != nil {
		return nil, err
	}
	if err := a.clientHandshake(c, timeout); err != nil {
		c.Close()
		return nil, fmt.Errorf("raft peer %s: %w", addr, err)
	}
	return c, nil
}

func (a *authStream) clientHandshake(c net.Conn, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = handshakeTimeout
	}
	c.SetDeadline(time.Now().Add(timeout))
	dn := make([]byte, nonceSize)
	rand.Read(dn)
	if _, err := c.Write(append([]byte(raftMagic), dn...)); err != nil {
		return fmt.Errorf("write hello: %w", err)
	}
	reply := make([]byte, nonceSize+sha256.Size)
	if _, err := io.ReadFull(c, reply); err != nil {
		return fmt.Errorf("read challenge (wrong cluster key?): %w", err)
	}
	ln := reply[:nonceSize]
	if !hmac.Equal(reply[nonceSize:], handshakeMAC(a.key, "listener", dn, ln)) {
		return fmt.Errorf("%w: the peer does not hold the cluster key", ErrAuth)
	}
	if _, err := c.Write(handshakeMAC(a.key, "dialer", dn, ln)); err != nil {
		return fmt.Errorf("write proof: %w", err)
	}
	return c.SetDeadline(time.Time{})
}

// Accept implements net.Listener.
func (a *authStream) Accept() (net.Conn, error) {
	select {
	case c := <-a.conns:
		return c, nil
	case <-a.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (a *authStream) Close() error {
	var err error
	a.closeOnce.Do(func() {
		close(a.done)
		err = a.ln.Close()
	})
	return err
}

// Addr implements net.Listener: the address peers dial.
func (a *authStream) Addr() net.Addr { return a.advertise }
