package heartbeat

import "flag"

// Every test of the package checks Tick's skipped recomputes, unless
// -verifyskips=false runs the skips as the agent does.
func init() {
	flag.BoolVar(&verifySkips, "verifyskips", true, "recompute at every skipped Tick and panic if the state would change")
}
