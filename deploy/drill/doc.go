// Package drill runs failover drills against a shoal cluster (a lab or a
// real one) under load and reports what the clients saw: a timeline per
// 100 ms, the failover time, the failed requests, as text, JSON and SVG.
package drill
