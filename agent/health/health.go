package health

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/shoalnet/shoal/agent/config"
)

// healthState turns probe results into a verdict with hysteresis: Fall
// failures in a row make a node sick, Rise successes in a row make it
// healthy again, so one slow response does not move buckets. It starts
// sick: a node becomes eligible only once its service has answered Rise
// probes in a row, never before it listens.
type healthState struct {
	rise, fall int
	healthy    bool
	streak     int // consecutive results that disagree with healthy
	lastErr    string
}

func newHealthState(rise, fall int) *healthState {
	return &healthState{rise: rise, fall: fall}
}

// observe records one probe result and reports whether the verdict changed.
func (h *healthState) observe(err error) bool {
	ok := err == nil
	if err != nil {
		h.lastErr = err.Error()
	}
	if ok == h.healthy {
		h.streak = 0
		return false
	}
	h.streak++
	need := h.fall
	if !h.healthy {
		need = h.rise
	}
	if h.streak < need {
		return false
	}
	h.healthy, h.streak = ok, 0
	return true
}

// Checker probes the local application and publishes the verdict.
type Checker struct {
	cfg     config.Health
	probe   func(context.Context) error
	healthy atomic.Bool
	lastErr atomic.Value // string
}

// NewChecker returns a checker of cfg's probe; with none it is always
// healthy.
func NewChecker(cfg config.Health) *Checker {
	hc := &Checker{cfg: cfg}
	hc.lastErr.Store("")
	switch {
	case cfg.URL != "":
		client := &http.Client{Timeout: cfg.Timeout}
		hc.probe = func(ctx context.Context) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.URL, nil)
			if err != nil {
				return err
			}
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode >= 400 {
				return fmt.Errorf("health check %s: status %d", cfg.URL, resp.StatusCode)
			}
			return nil
		}
	case cfg.TCP != "":
		hc.probe = func(ctx context.Context) error {
			d := net.Dialer{Timeout: cfg.Timeout}
			c, err := d.DialContext(ctx, "tcp", cfg.TCP)
			if err != nil {
				return err
			}
			return c.Close()
		}
	default:
		hc.healthy.Store(true) // nothing to probe
		return hc
	}
	hc.lastErr.Store("no probe has passed yet")
	return hc
}

// AssumeHealthy starts the checker healthy (a restarted agent whose
// predecessor last saw the application healthy): Fall failed probes make
// it sick, as for any healthy node. Call before run.
func (hc *Checker) AssumeHealthy() {
	hc.healthy.Store(true)
	hc.lastErr.Store("")
}

// Run probes every interval until ctx ends, calling changed on each flip.
func (hc *Checker) Run(ctx context.Context, changed func(healthy bool)) {
	if hc.probe == nil {
		return
	}
	st := newHealthState(hc.cfg.Rise, hc.cfg.Fall)
	st.healthy = hc.healthy.Load()
	t := time.NewTicker(hc.cfg.Interval)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, hc.cfg.Timeout)
		err := hc.probe(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if st.observe(err) {
			hc.healthy.Store(st.healthy)
			changed(st.healthy)
		}
		hc.lastErr.Store(st.lastErr)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Healthy reports the last verdict.
func (hc *Checker) Healthy() bool { return hc.healthy.Load() }

// Err says why the application is sick ("" while healthy).
func (hc *Checker) Err() string {
	s, _ := hc.lastErr.Load().(string)
	return s
}
