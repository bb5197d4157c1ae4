// Package load generates HTTP GET load against a URL and reports what the
// clients saw: totals, each node's share, a timeline and every failure.
package load
