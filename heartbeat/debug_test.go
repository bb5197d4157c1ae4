package heartbeat

import (
	"flag"
	"fmt"
	"testing"
	"time"
)

var debugSeed = flag.Int("debugseed", -1, "trace one random run")
var debugClass = flag.String("debugclass", "slow", "")

func TestDebugRun(t *testing.T) {
	if *debugSeed < 0 {
		t.Skip("no -debugseed")
	}
	var dc delayClass
	for _, c := range delayClasses {
		if c.name == *debugClass {
			dc = c
		}
	}
	s, _, _, last, desc := faultRun(t, dc, Config{}, *debugSeed, true)
	fmt.Println(desc)
	s.run(last + 3*time.Second)
}
