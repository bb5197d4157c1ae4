package lab

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Status is a lab as `shoal lab status` shows it.
type Status struct {
	State
	NamespaceUp map[string]bool       `json:"namespace_up"`
	ProcAlive   map[int]bool          `json:"process_alive"`
	Agents      map[string]NodeStatus `json:"agents"`
	AgentErrors map[string]string     `json:"agent_errors,omitempty"`
}

// Status checks the lab's namespaces and processes and asks every agent.
func (l *Lab) Status(ctx context.Context) Status {
	s := Status{State: l.State, NamespaceUp: map[string]bool{}, ProcAlive: map[int]bool{},
		Agents: map[string]NodeStatus{}, AgentErrors: map[string]string{}}
	for _, ns := range l.Namespaces {
		_, err := os.Stat(filepath.Join("/run/netns", ns))
		s.NamespaceUp[ns] = err == nil
	}
	for _, p := range l.Procs {
		s.ProcAlive[p.PID] = alive(p)
	}
	if l.ctl.Binary == "" {
		return s
	}
	for _, n := range l.Nodes {
		st, err := l.ctl.Status(ctx, n.Socket)
		if err != nil {
			s.AgentErrors[n.Name] = err.Error()
			continue
		}
		s.Agents[n.Name] = st
	}
	return s
}

// WriteText prints the status for a person.
func (s Status) WriteText(w io.Writer) {
	fmt.Fprintf(w, "lab %s: VIP %s on 198.18.%d.0/24, work dir %s\n", s.ID, s.VIP, s.Subnet, s.Dir)
	fmt.Fprintln(w, "namespaces:")
	for _, ns := range s.Namespaces {
		fmt.Fprintf(w, "  %-20s %s\n", ns, upDown(s.NamespaceUp[ns]))
	}
	fmt.Fprintln(w, "hosts:")
	fmt.Fprintf(w, "  %-8s %-16s %s\n", s.Client.Name, s.Client.Addr, s.Client.Namespace)
	for _, n := range s.Nodes {
		fmt.Fprintf(w, "  %-8s %-16s %s  socket %s\n", n.Name, n.Addr, n.Namespace, n.Socket)
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
	fmt.Fprintf(w, "try: ip netns exec %s curl http://%s/\n", s.Client.Namespace, s.VIP)
}

func upDown(ok bool) string {
	if ok {
		return "present"
	}
	return "MISSING"
}
