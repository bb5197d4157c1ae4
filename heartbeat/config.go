package heartbeat

import (
	"errors"
	"fmt"
	"time"
)

// Defaults. A heartbeat every 75 ms and death after 12 silent periods detect
// a pulled plug in about 0.9 s and cover it in about 1.05 s in the
// simulator (about 1.2 s in the lab), leaving room under the 1.5 s target on
// a loaded machine, while a false death under 20% independent loss needs 12
// losses in a row on one link (0.2^12 ≈ 4e-9 per heartbeat). 100 ms and 10
// periods covered a plug in 1.2 s simulated but past 1.5 s in the lab on a
// busy machine; DESIGN.md's first guess, 200 ms and 5 periods, flaps under
// 20% loss (a false death about every 3,000 heartbeats per link).
const (
	DefaultPeriod    = 75 * time.Millisecond
	DefaultTolerance = 12
	DefaultLagGrace  = 10
)

// deathHold is how many periods a node waits, after adopting a view that
// drops a node which may still be alive (silent, or cut off on a link, and
// not confirmed dead by a probe), before it acquires in that view: time for
// the dropped node to hear that view and yield, since one-way delays stay
// below a period, with one heartbeat to spare against loss. The periods are
// Config.HoldPeriod's: the settings' period, not the one ScaledTiming
// lengthened for a big cluster. The dropped node learns from the
// heartbeats every member sends at once on adopting the view, not from the
// next periodic ones, and in a big cluster it hears more of them: the
// scaled period made the hold, and so every failover, 150 ms longer at 32
// nodes and 300 ms at 64 for nothing.
const deathHold = 2

// FastProfile is the fastest failover that keeps 0 false deaths at 20%
// independent heartbeat loss in the simulator (TestSimFastProfile): a dead
// peer is detected after Tolerance periods of silence, and its buckets are
// covered about a round trip later (with the agent's probe confirming the
// death). Use it where the nodes' CPUs keep heartbeats on time.
var FastProfile = struct {
	Period    time.Duration
	Tolerance int
}{Period: 20 * time.Millisecond, Tolerance: 12}

// KeySize is the length of the cluster key.
const KeySize = 32

// Config is one node's membership settings. The zero value of a field takes
// its default in WithDefaults.
type Config struct {
	ClusterID uint32 // heartbeats of other clusters are rejected
	Self      uint32 // this node's id, not 0
	// Incarnation is this start's number, not 0: peers treat a higher one
	// as a fresh member and reject lower ones forever. It must grow across
	// restarts: take it from LoadIncarnation, never from the clock.
	Incarnation uint64
	Period      time.Duration // P: one heartbeat per period
	Tolerance   int           // T: a peer is dead after T periods without a valid heartbeat
	LagGrace    int           // periods a node's rules index may lag the newest seen before it stops being eligible
	// HoldPeriod is the period deathHold counts in: the settings' period
	// when ScaledTiming lengthened Period for a big cluster; at most
	// Period. 0 means Period.
	HoldPeriod time.Duration
}

// WithDefaults returns c with every zero setting replaced by its default.
func (c Config) WithDefaults() Config {
	if c.Period == 0 {
		c.Period = DefaultPeriod
	}
	if c.Tolerance == 0 {
		c.Tolerance = DefaultTolerance
	}
	if c.HoldPeriod == 0 {
		c.HoldPeriod = c.Period
	}
	if c.LagGrace == 0 {
		c.LagGrace = DefaultLagGrace
	}
	return c
}

// Validate checks that the settings can work.
func (c Config) Validate() error {
	var errs []error
	if c.Self == 0 {
		errs = append(errs, errors.New("node id 0 is reserved: set a node id"))
	}
	if c.Incarnation == 0 {
		errs = append(errs, errors.New("incarnation 0: take one from heartbeat.LoadIncarnation"))
	}
	if c.Period < time.Millisecond {
		errs = append(errs, fmt.Errorf("heartbeat period %v is below 1ms", c.Period))
	}
	if c.HoldPeriod < time.Millisecond || c.HoldPeriod > c.Period {
		errs = append(errs, fmt.Errorf("hold period %v is not within 1ms and the period %v", c.HoldPeriod, c.Period))
	}
	if c.Tolerance < 2 {
		errs = append(errs, fmt.Errorf("tolerance %d is below 2 periods", c.Tolerance))
	}
	if c.LagGrace < 1 {
		errs = append(errs, fmt.Errorf("rules lag grace %d is below 1 period", c.LagGrace))
	}
	return errors.Join(errs...)
}
