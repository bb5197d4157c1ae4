// Package metrics exports the agent's state and counters to Prometheus,
// read from published snapshots when scraped.
package metrics
