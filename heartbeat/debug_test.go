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
	sizes := []int{2, 3, 4, 5, 8}
	var dc delayClass
	for _, c := range delayClasses {
		if c.name == *debugClass {
			dc = c
		}
	}
	seed := *debugSeed
	n := sizes[seed%len(sizes)]
	s := newSim(t, n, Config{}, uint64(seed)*7919+uint64(len(dc.name)))
	maxD := dc.maxDelay(s.cfg.Period)
	s.setAllLinks(func(l *simLink) {
		l.delay = 20*time.Microsecond + time.Duration(s.rng.Int64N(int64(maxD/2)))
		l.jitter = time.Duration(s.rng.Int64N(int64(maxD - l.delay)))
	})
	s.trace = func(m string) { fmt.Printf("%v %s\n", s.elapsed(), m) }
	start := s.startAll(3 * time.Second)
	from := start + time.Second
	last, desc := s.faultPlan(from, from+6*time.Second, 2+s.rng.IntN(6))
	fmt.Println(desc)
	s.run(last + 3*time.Second)
}
