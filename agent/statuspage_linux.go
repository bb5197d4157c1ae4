package agent

import (
	"fmt"
	"net/http"
	"time"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/agent/statuspage"
	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/rules"
)

// history is what the status page shows of the past.
func (a *Agent) History() statuspage.HistorySnapshot { return a.hist.Snapshot() }

// nodeNamer names the registered nodes of st.
func nodeNamer(st *rules.State) func(filter.NodeID) string {
	return func(id filter.NodeID) string {
		if n := st.Node(id); n != nil {
			return n.Name
		}
		return fmt.Sprintf("node %d", id)
	}
}

// sampleHandler serves this node's counters to the other nodes' status
// pages (the peer API authorizes the caller).
func (a *Agent) sampleHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		control.WriteJSON(w, http.StatusOK, statuspage.Sample(a.Status(), a.Params(), time.Now()))
	})
}
