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
	DefaultConverge  = 2
	DefaultLagGrace  = 10
)

// KeySize is the length of the cluster key.
const KeySize = 32

// Config is one node's membership settings. The zero value of a field takes
// its default in WithDefaults.
type Config struct {
	ClusterID uint32 // heartbeats of other clusters are rejected
	Self      uint32 // this node's id, not 0
	// Incarnation is this run's boot nonce; a peer that sees a new one treats
	// the node as a fresh member. Use a value that grows across restarts
	// (NewMachine uses the injected clock's Unix nanoseconds when it is 0).
	Incarnation uint64
	Key         []byte        // cluster key, KeySize bytes, for the HMAC
	Period      time.Duration // P: one heartbeat per period
	Tolerance   int           // T: a peer is dead after T periods without a valid heartbeat
	Converge    int           // K: periods every member must advertise a view before it is acted on
	LagGrace    int           // periods a node's rules index may lag the newest seen before it stops being eligible
}

// WithDefaults returns c with every zero setting replaced by its default.
func (c Config) WithDefaults() Config {
	if c.Period == 0 {
		c.Period = DefaultPeriod
	}
	if c.Tolerance == 0 {
		c.Tolerance = DefaultTolerance
	}
	if c.Converge == 0 {
		c.Converge = DefaultConverge
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
	if len(c.Key) != KeySize {
		errs = append(errs, fmt.Errorf("cluster key is %d bytes, want %d", len(c.Key), KeySize))
	}
	if c.Period < time.Millisecond {
		errs = append(errs, fmt.Errorf("heartbeat period %v is below 1ms", c.Period))
	}
	if c.Tolerance < 2 {
		errs = append(errs, fmt.Errorf("tolerance %d is below 2 periods", c.Tolerance))
	}
	if c.Converge < 1 {
		errs = append(errs, fmt.Errorf("convergence %d is below 1 period", c.Converge))
	}
	if c.LagGrace < 1 {
		errs = append(errs, fmt.Errorf("rules lag grace %d is below 1 period", c.LagGrace))
	}
	return errors.Join(errs...)
}
