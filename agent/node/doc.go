// Package node is the agent's running core on one host: the membership
// goroutine (heartbeats and the convergence machine), the reconciler that
// turns the view and the rules into tables in the kernel, and the tracker
// of held connections, wired one way through latest-value mailboxes.
package node
