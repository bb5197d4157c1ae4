package heartbeat

import "flag"

// Every test of the package checks Tick's skips, unless -verifyskips=false
// runs them as the agent does.
func init() {
	flag.BoolVar(&verifySkips, "verifyskips", true, "run every skipped tick and panic if it would have changed the state")
}
