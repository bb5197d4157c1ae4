// Package rules replicates shoal's configuration (VIPs, port rules, per-node
// weights and priorities, the node registry, admin states and cluster
// settings) across the cluster with Raft, and serves the authenticated peer
// API that forwards writes and joins to the leader.
package rules
