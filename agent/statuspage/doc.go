// Package statuspage serves the live status page: static files embedded in
// the binary that poll a JSON snapshot of the cluster, built from published
// snapshots and the other nodes' samples, and the history of view changes
// and failovers it shows.
package statuspage
