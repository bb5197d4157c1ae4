package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// NodeHeader is the response header that names the node that served a
// request (set by the lab's HTTP servers).
const NodeHeader = "X-Shoal-Node"

// Options configure a run. Either Duration or Requests (or both) bound it.
type Options struct {
	URL         string
	Concurrency int           // parallel workers; 1 if zero
	Rate        float64       // requests per second over all workers; 0 = as fast as possible
	Duration    time.Duration // stop issuing requests after this long
	Requests    int           // stop after this many requests
	KeepAlive   bool          // reuse connections; otherwise one new connection per request
	Timeout     time.Duration // per request, connect included; 2 s if zero
	Bucket      time.Duration // timeline resolution; 100 ms if zero
	// Held opens this many long-lived keep-alive connections before the
	// requests begin and sends a request on each every HeldEvery while the
	// run lasts, beside the other requests (Result.Held).
	Held int

	// Progress, if set, is called every ProgressEvery (1 s if zero) while
	// the run lasts.
	Progress      func(Progress)
	ProgressEvery time.Duration
}

// Progress is a live snapshot for a progress line.
type Progress struct {
	Elapsed   time.Duration
	Requests  int     // so far
	Failures  int     // so far
	PerSecond float64 // requests completed in the last interval, per second
	P99       time.Duration
}

// String formats p as one progress line.
func (p Progress) String() string {
	return fmt.Sprintf("%5.1fs  %8.0f req/s  %7d requests  %5d failures  p99 %v",
		p.Elapsed.Seconds(), p.PerSecond, p.Requests, p.Failures, p.P99.Round(10*time.Microsecond))
}

// ErrNoBound is returned when a run has neither a duration nor a request count.
var ErrNoBound = errors.New("load: set a duration or a request count")

// Run sends GET requests to o.URL until o.Duration has passed or
// o.Requests were issued, and returns what happened. Requests in flight when
// the duration ends are completed (up to o.Timeout), not cut short.
// Cancelling ctx aborts the run; the requests it cut are not counted.
func Run(ctx context.Context, o Options) (Result, error) {
	if o.Duration <= 0 && o.Requests <= 0 {
		return Result{}, ErrNoBound
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 1
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	req, err := http.NewRequest(http.MethodGet, o.URL, nil)
	if err != nil {
		return Result{}, fmt.Errorf("load: url %q: %w", o.URL, err)
	}
	tally := newRetransTally()
	tr := &http.Transport{
		Proxy:               nil, // the lab's client must never go through a proxy from the environment
		DialContext:         tally.dialer((&net.Dialer{Timeout: o.Timeout}).DialContext),
		DisableKeepAlives:   !o.KeepAlive,
		MaxIdleConnsPerHost: o.Concurrency,
		DisableCompression:  true,
	}
	if o.KeepAlive {
		// One connection per worker, opened again only when one ends.
		// Without the cap, a worker whose next request starts before its
		// connection is back in the idle pool (a goroutine of the
		// transport returns it) dials another, and under a burst of CPU
		// load the dial may win: a connection counted as new that nothing
		// broke.
		tr.MaxConnsPerHost = o.Concurrency
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var held []*heldConn
	if o.Held > 0 {
		if held, err = openHeld(ctx, req.URL, o.Held, o.Timeout); err != nil {
			return Result{}, err
		}
	}
	stopHeld := make(chan struct{})
	heldDone := make(chan HeldResult, 1)
	go func() { heldDone <- hold(held, req.URL, o.Timeout, stopHeld) }()

	start := time.Now()
	var deadline time.Time
	if o.Duration > 0 {
		deadline = start.Add(o.Duration)
	}
	var (
		issued  atomic.Int64
		done    atomic.Int64
		failed  atomic.Int64
		latMu   sync.Mutex
		recent  []time.Duration
		perWork = make([][]Record, o.Concurrency)
		wg      sync.WaitGroup
	)
	// next hands out a request's slot: its index and, with a rate, the time
	// it may start. ok is false once the run is over.
	next := func() (at time.Time, ok bool) {
		n := issued.Add(1) - 1
		if o.Requests > 0 && n >= int64(o.Requests) {
			return time.Time{}, false
		}
		if o.Rate > 0 {
			at = start.Add(time.Duration(float64(n) / o.Rate * float64(time.Second)))
		} else {
			at = time.Now()
		}
		if !deadline.IsZero() && !at.Before(deadline) {
			return time.Time{}, false
		}
		return at, true
	}
	for w := range o.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				at, ok := next()
				if !ok {
					return
				}
				if d := time.Until(at); d > 0 {
					t := time.NewTimer(d)
					select {
					case <-ctx.Done():
						t.Stop()
						return
					case <-t.C:
					}
				}
				if ctx.Err() != nil {
					return
				}
				rec := do(ctx, client, req, o.Timeout)
				if ctx.Err() != nil {
					return // aborted by the caller, not a failure of the server
				}
				perWork[w] = append(perWork[w], rec)
				done.Add(1)
				if !rec.OK() {
					failed.Add(1)
				} else {
					latMu.Lock()
					recent = append(recent, rec.Latency)
					latMu.Unlock()
				}
			}
		}()
	}
	stopProgress := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		if o.Progress == nil {
			return
		}
		every := o.ProgressEvery
		if every <= 0 {
			every = time.Second
		}
		tk := time.NewTicker(every)
		defer tk.Stop()
		var lastDone int64
		last := start
		for {
			select {
			case <-stopProgress:
				return
			case now := <-tk.C:
				latMu.Lock()
				l := recent
				recent = nil
				latMu.Unlock()
				d := done.Load()
				o.Progress(Progress{
					Elapsed:   now.Sub(start),
					Requests:  int(d),
					Failures:  int(failed.Load()),
					PerSecond: float64(d-lastDone) / now.Sub(last).Seconds(),
					P99:       Percentile(l, 99),
				})
				lastDone, last = d, now
			}
		}
	}()
	wg.Wait()
	close(stopProgress)
	<-progressDone
	close(stopHeld)
	heldRes := <-heldDone
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("load: aborted: %w", err)
	}
	elapsed := time.Since(start)
	if o.Duration > 0 {
		elapsed = min(elapsed, o.Duration)
	}
	var all []Record
	for _, p := range perWork {
		all = append(all, p...)
	}
	res := Summarize(all, start, elapsed, o.Bucket)
	if n, ok := tally.sum(); ok {
		res.Retransmits = &n
	}
	if o.Held > 0 {
		res.Held = &heldRes
	}
	return res, nil
}

// do performs one request and classifies its outcome.
func do(ctx context.Context, c *http.Client, req *http.Request, timeout time.Duration) (rec Record) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rec = Record{Start: time.Now()}
	// The transport dials in a goroutine of its own, which may outlive the
	// request: the trace hands its figures over atomically, and a request
	// served on a reused connection keeps no connect time.
	var connStart, connect atomic.Int64
	var reused atomic.Bool
	trace := &httptrace.ClientTrace{
		ConnectStart: func(string, string) { connStart.Store(time.Now().UnixNano()) },
		ConnectDone: func(_, _ string, err error) {
			if t0 := connStart.Load(); err == nil && t0 != 0 {
				connect.Store(time.Now().UnixNano() - t0)
			}
		},
		GotConn: func(info httptrace.GotConnInfo) { reused.Store(info.Reused) },
	}
	defer func() {
		if !reused.Load() {
			rec.Connect = time.Duration(connect.Load())
		}
	}()
	resp, err := c.Do(req.Clone(httptrace.WithClientTrace(rctx, trace)))
	if err != nil {
		rec.Latency = time.Since(rec.Start)
		rec.Class, rec.Err = Classify(err), err.Error()
		return rec
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	rec.Latency = time.Since(rec.Start)
	rec.Status = resp.StatusCode
	rec.Node = resp.Header.Get(NodeHeader)
	switch {
	case err != nil:
		rec.Class, rec.Err = Classify(err), err.Error()
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		rec.Class, rec.Err = ErrBadStatus, resp.Status
	}
	return rec
}

// Classify maps a request error to its class.
func Classify(err error) ErrorClass {
	var ne net.Error
	switch {
	case err == nil:
		return ErrNone
	case errors.Is(err, syscall.ECONNREFUSED):
		return ErrRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return ErrReset
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return ErrTimeout
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return ErrClosed
	}
	return ErrOther
}
