package rules

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/shoalnet/shoal/peer"
)

// Sentinel errors callers can branch on with errors.Is. Business errors
// returned by Apply wrap one of them, also when the write was forwarded to
// the leader.
var (
	ErrInvalid     = peer.ErrInvalid                         // a value out of range or malformed
	ErrConflict    = errors.New("conflict")                  // overlap, duplicate priority or name
	ErrUnknownNode = errors.New("unknown node")              // no such node in the registry
	ErrUnknownRule = errors.New("unknown rule")              // no such port rule
	ErrUnknownVIP  = errors.New("unknown vip")               // no such cluster VIP
	ErrNoQuorum    = errors.New("no quorum")                 // the write could not commit in time
	ErrNotMember   = errors.New("not a member")              // this node has not joined a cluster
	ErrAuth        = peer.ErrAuth                            // TLS: the peer is not of this cluster, or refused us
	ErrStopped     = errors.New("rules application stopped") // an entry could not be applied; see Store.Halted
	ErrUnsupported = errors.New("unsupported by a member")   // a command some member's shoal cannot apply
	errNotLeader   = errors.New("not the raft leader")       // internal: retry elsewhere
)

// sentinels maps the wire code of a business error to its sentinel.
var sentinels = map[string]error{
	"invalid":      ErrInvalid,
	"conflict":     ErrConflict,
	"unknown-node": ErrUnknownNode,
	"unknown-rule": ErrUnknownRule,
	"unknown-vip":  ErrUnknownVIP,
	"no-quorum":    ErrNoQuorum,
	"not-member":   ErrNotMember,
	"not-leader":   errNotLeader,
	"stopped":      ErrStopped,
	"unsupported":  ErrUnsupported,
}

// errorCode returns the wire code of err's sentinel, or "" for any other
// error.
func errorCode(err error) string {
	for code, s := range sentinels {
		if errors.Is(err, s) {
			return code
		}
	}
	return ""
}

// remoteError is a business error that a peer returned: it prints the
// peer's message and matches the peer's sentinel.
type remoteError struct {
	sentinel error
	msg      string
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.sentinel }

func decodeError(code, msg string) error {
	if code == "" && msg == "" {
		return nil
	}
	if s, ok := sentinels[code]; ok {
		return &remoteError{sentinel: s, msg: msg}
	}
	return errors.New(msg)
}

func splitHostPort(addr string) (string, uint16, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("port %q: %w", port, err)
	}
	return host, uint16(p), nil
}
