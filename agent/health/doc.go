// Package health probes the local application (HTTP or TCP) with rise and
// fall counts; a sick node is drained.
package health
