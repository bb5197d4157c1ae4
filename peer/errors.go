package peer

import "errors"

// Errors callers branch on; rules re-exports them as its own.
var (
	ErrInvalid = errors.New("invalid")           // a value out of range or malformed
	ErrAuth    = errors.New("peer auth refused") // TLS: the peer is not of this cluster, or refused us
)
