package agent

import (
	"fmt"

	"github.com/shoalnet/shoal/rules"
)

// halter is what status and metrics need to know of a stopped rules FSM.
type halter interface {
	Halted() (rules.Halt, bool)
}

// rulesStopped describes a stopped rules FSM for status; "" when applying.
func rulesStopped(h halter) string {
	st, ok := h.Halted()
	if !ok {
		return ""
	}
	return fmt.Sprintf("stopped at raft index %d: %s; upgrade this node's shoal, it resumes from that index on start", st.Index, st.Reason)
}
