package rules

import (
	"fmt"
	"strings"
)

// AdminState is a node's administrative state, set by an operator and
// replicated so every node sees it.
type AdminState uint8

// Admin states, as NLB names them: a started node takes traffic; a stopped
// node takes none at once; a draining node finishes its connections and
// takes no new ones (drainstop); a suspended node is stopped and stays so
// across restarts until resumed.
const (
	AdminStarted AdminState = iota
	AdminStopped
	AdminDraining
	AdminSuspended
)

// String returns the state's name as the CLI prints it.
func (a AdminState) String() string {
	switch a {
	case AdminStarted:
		return "started"
	case AdminStopped:
		return "stopped"
	case AdminDraining:
		return "draining"
	case AdminSuspended:
		return "suspended"
	}
	return fmt.Sprintf("admin(%d)", uint8(a))
}

// ParseAdminState parses "started", "stopped", "draining" or "suspended".
func ParseAdminState(s string) (AdminState, error) {
	switch strings.ToLower(s) {
	case "started", "start":
		return AdminStarted, nil
	case "stopped", "stop":
		return AdminStopped, nil
	case "draining", "drain", "drainstop":
		return AdminDraining, nil
	case "suspended", "suspend":
		return AdminSuspended, nil
	}
	return 0, fmt.Errorf("%w: admin state %q: want started, stopped, draining or suspended", ErrInvalid, s)
}

// MarshalText writes the state's name, so JSON shows "draining", not 2.
func (a AdminState) MarshalText() ([]byte, error) {
	if a > AdminSuspended {
		return nil, fmt.Errorf("%w: admin state %d", ErrInvalid, uint8(a))
	}
	return []byte(a.String()), nil
}

// UnmarshalText parses a state's name.
func (a *AdminState) UnmarshalText(b []byte) error {
	v, err := ParseAdminState(string(b))
	if err != nil {
		return err
	}
	*a = v
	return nil
}
