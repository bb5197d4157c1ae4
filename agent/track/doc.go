// Package track knows which buckets this host holds TCP connections in:
// kernel-filtered socket dumps of the VIPs, run only when asked and while
// buckets drain.
package track
