package control

import (
	"fmt"

	"github.com/shoalnet/shoal/rules"
)

// Halter is what status and metrics need to know of a stopped rules FSM.
type Halter interface {
	Halted() (rules.Halt, bool)
}

// RulesStopped describes a stopped rules FSM for status; "" when applying.
func RulesStopped(h Halter) string {
	st, ok := h.Halted()
	if !ok {
		return ""
	}
	return fmt.Sprintf("stopped at raft index %d: %s; upgrade this node's shoal, it resumes from that index on start", st.Index, st.Reason)
}
