package lab

import (
	"context"
	"os"
	"path/filepath"
)

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
