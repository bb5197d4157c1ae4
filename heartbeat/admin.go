package heartbeat

import "fmt"

// AdminState is a node's administrative state, as set by the operator and
// replicated by Raft. Only a Started node takes traffic.
type AdminState uint8

// Admin states, as NLB names them.
const (
	Started   AdminState = iota // takes traffic
	Stopped                     // takes no traffic
	Draining                    // finishes its connections, takes no new ones
	Suspended                   // stopped, and stays so across restarts
)

var adminNames = [...]string{Started: "started", Stopped: "stopped", Draining: "draining", Suspended: "suspended"}

// String returns the state's lower-case name.
func (a AdminState) String() string {
	if int(a) < len(adminNames) {
		return adminNames[a]
	}
	return fmt.Sprintf("admin(%d)", uint8(a))
}

// Valid reports whether a is one of the defined states.
func (a AdminState) Valid() bool { return int(a) < len(adminNames) }

// ParseAdminState parses the name String returns.
func ParseAdminState(s string) (AdminState, error) {
	for i, n := range adminNames {
		if n == s {
			return AdminState(i), nil
		}
	}
	return 0, fmt.Errorf("unknown admin state %q: want started, stopped, draining or suspended", s)
}
