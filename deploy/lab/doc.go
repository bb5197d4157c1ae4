// Package lab builds a whole shoal cluster on one machine: a switch, N nodes
// and a client, each in its own network namespace, with real agents and an
// HTTP server per node; it drives traffic and a pulled-plug drill through it
// and removes everything it made.
package lab
