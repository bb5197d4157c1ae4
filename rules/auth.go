package rules

import (
	"fmt"
	"net/http"
	"net/netip"

	"github.com/shoalnet/shoal/peer"
)

// The peer API runs over HTTPS with mutual TLS 1.3 (see Certs), which
// authenticates both ends, encrypts requests and replies, and makes a
// captured connection useless to replay: each connection has fresh keys,
// and records carry sequence numbers. What is left to check per request is
// who may ask for what: see authorize.

// MaxPeerBody bounds a peer request's body; real ones are a few hundred
// bytes (a command is at most maxCommandSize).
const MaxPeerBody = maxCommandSize + 4096

// maxPeerReply bounds a peer API reply read by a client.
const maxPeerReply = 1 << 20

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
	name := peer.Name(r.TLS)
	if name == "" {
		return peer.RefuseHandshake, fmt.Errorf("no client certificate; peers must use mutual TLS")
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
		return peer.RefuseAddress, fmt.Errorf("%s is not the address of a node of this cluster", r.RemoteAddr)
	}
	if !names[name] {
		return peer.RefuseNotMember, fmt.Errorf("%q is not a node of this cluster", name)
	}
	// A forwarded request names the member that forwarded it; it must be
	// the one whose certificate came with it.
	if fw := r.Header.Get(headerForwarded); fw != "" && fw != name {
		return peer.RefuseImpersonate, fmt.Errorf("request forwarded on behalf of %q with the certificate of %q", fw, name)
	}
	return "", nil
}

// remoteAddr is r's client address for a refusal's log line.
type addrString string

func (a addrString) Network() string { return "tcp" }
func (a addrString) String() string  { return string(a) }

func remoteAddr(r *http.Request) addrString { return addrString(r.RemoteAddr) }
