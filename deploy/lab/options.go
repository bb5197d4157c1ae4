package lab

import (
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"
)

// Options configure a lab.
type Options struct {
	Nodes  int           // node namespaces; 3 if zero
	Binary string        // the shoal binary the namespaces run; os.Executable() if empty
	Base   string        // state and work directories; DefaultBase if empty
	Period time.Duration // agents' heartbeat period; the agent's default if zero
	Server Server        // the HTTP server on every node; ServerBuiltin if empty
	// Servers, if not zero, runs the HTTP server on the first Servers
	// nodes only: the others run the agent alone, at weight 0 on the
	// VIPs' rules (full members that take no connections), so that a big
	// lab measures the agents rather than as many servers.
	Servers int
	Family  Family // the VIPs' address family; Family4 if empty
	// NoAgents builds the network only: no agent, no HTTP server, no rule.
	NoAgents bool
	// ParallelStart starts every agent at once instead of one after the
	// other, each once the cluster before it has converged.
	ParallelStart bool
	// KeepOnFailure leaves a lab that failed to come up in place (for its
	// logs); remove it with Down.
	KeepOnFailure bool
	// MACMode "igmp" builds the switch with IGMP snooping and a querier,
	// adds a bystander namespace on it, and sets the cluster's MAC mode to
	// igmp before the port rule (see SnoopByMAC); "" or "multicast": the
	// flooding switch of NLB's multicast mode.
	MACMode string
	// Routers, in routed mode, is how many routers the nodes peer with
	// (1 if zero): the first is between the client and the nodes; a
	// second sits on the nodes' LAN only.
	Routers int
	// NoForward, in routed mode, turns the agents' forwarding off: each
	// node keeps what the router sends it, as plain ECMP does (for
	// comparisons).
	NoForward bool
	// ReadyTimeout bounds the wait for the cluster to converge; 30 s if zero.
	ReadyTimeout time.Duration
	Log          *slog.Logger // discards if nil
	// KeepLogs, when not empty, is a directory Down copies the processes'
	// logs into, after they stopped and before the lab's files go
	// (SHOAL_LOG_LEVEL=debug in the environment makes the agents log each
	// step of a handoff).
	KeepLogs string
}

// Lab is a running lab.
type Lab struct {
	State
	log *slog.Logger
	ctl Ctl
	// orphan marks a lab opened without its state file: Down then also
	// looks for its namespaces by prefix.
	orphan bool
	// childEhash: the switch's namespace gives the hosts' namespaces a TCP
	// hash table of their own (see createNamespace).
	childEhash bool

	mu    sync.Mutex
	waits map[int]chan struct{} // closed when a child started by this process exits
}

// LoadStarted is the line `shoal lab load` writes to stderr as it starts.
const LoadStarted = "lab load: started"

// RunOptions configure `shoal lab run`.
type RunOptions struct {
	Options
	Duration    time.Duration // each traffic phase; 3 s if zero
	Concurrency int           // load workers; 8 if zero
	Rate        float64       // requests/s over all workers; 0 = as fast as possible
	Keep        bool          // leave the lab up afterwards
	// Pulls is how many plugs to pull (1 if zero). The first is pulled under
	// traffic; each further one, without traffic, after plugging the last
	// victim back in, on the next node, for a distribution of failover times.
	Pulls           int
	FailoverTimeout time.Duration // how long to wait for the survivors; 10 s if zero
	Progress        io.Writer     // live progress lines; none if nil
}

// LoadArgs is one traffic phase from the client namespace.
type LoadArgs struct {
	URL         string // http://VIP/ if empty
	Duration    time.Duration
	Concurrency int
	Rate        float64 // requests/s; 0 = as fast as possible
	KeepAlive   bool
	Timeout     time.Duration // per request; the generator's default if zero
	Held        int           // long-lived connections held beside the requests (load.Options.Held)
	// OnStart, if set, is called once the generator has started in the
	// client namespace (starting a process there takes a while).
	OnStart func()
}

// Status is a lab as `shoal lab status` shows it.
type Status struct {
	State
	NamespaceUp map[string]bool       `json:"namespace_up"`
	ProcAlive   map[int]bool          `json:"process_alive"`
	Agents      map[string]NodeStatus `json:"agents"`
	AgentErrors map[string]string     `json:"agent_errors,omitempty"`
}

// WriteText prints the status for a person.
func (s Status) WriteText(w io.Writer) {
	fmt.Fprintf(w, "lab %s: VIP %s on 198.18.%d.0/24, server %s, work dir %s\n", s.ID, s.VIP, s.Subnet, s.Server, s.Dir)
	if s.Family == FamilyDual {
		fmt.Fprintf(w, "and VIP %s on 2001:db8:0:%d::/64\n", s.VIP6, s.Subnet)
	}
	fmt.Fprintln(w, "namespaces:")
	for _, ns := range s.Namespaces {
		fmt.Fprintf(w, "  %-20s %s\n", ns, upDown(s.NamespaceUp[ns]))
	}
	fmt.Fprintln(w, "hosts:")
	fmt.Fprintf(w, "  %-8s %-16s %s%s\n", s.Client.Name, s.Client.Addr, s.Client.Namespace, addr6(s.Client))
	for _, n := range s.Nodes {
		fmt.Fprintf(w, "  %-8s %-16s %s  socket %s%s\n", n.Name, n.Addr, n.Namespace, n.Socket, addr6(n))
	}
	if len(s.Procs) > 0 {
		fmt.Fprintln(w, "processes:")
		for _, p := range s.Procs {
			state := "running"
			if !s.ProcAlive[p.PID] {
				state = "GONE"
			}
			fmt.Fprintf(w, "  %-8s %-6s pid %-7d %-8s log %s\n", p.Host, p.Role, p.PID, state, p.Log)
		}
	}
	if len(s.Agents)+len(s.AgentErrors) > 0 {
		fmt.Fprintln(w, "agents:")
		for _, n := range s.Nodes {
			if e, ok := s.AgentErrors[n.Name]; ok {
				fmt.Fprintf(w, "  %-8s %s\n", n.Name, e)
				continue
			}
			a := s.Agents[n.Name]
			conv := "converged"
			if !a.Converged {
				conv = "converging"
			}
			fmt.Fprintf(w, "  %-8s id %d  %s  %s  eligible %v  rules index %d  accepting %v\n",
				n.Name, a.NodeID, a.Admin, conv, a.View.Eligible, a.RulesIndex, a.Accepting)
		}
	}
	for _, vip := range s.VIPs() {
		fmt.Fprintf(w, "try: ip netns exec %s curl %s\n", s.Client.Namespace, URL(vip))
	}
}

func addr6(h Host) string {
	if !h.Addr6.IsValid() {
		return ""
	}
	return "  " + h.Addr6.String()
}

func upDown(ok bool) string {
	if ok {
		return "present"
	}
	return "MISSING"
}
