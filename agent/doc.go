// Package agent runs shoal on one host: it sets up the VIPs, answers ARP
// with the cluster MAC, drives the XDP data plane from the converged view and
// the replicated rules, and serves the control API and metrics.
package agent
