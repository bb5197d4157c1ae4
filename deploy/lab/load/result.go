package load

import (
	"math"
	"slices"
	"sort"
	"time"
)

// ErrorClass names why a request failed, coarse enough to compare runs.
type ErrorClass string

// The error classes a request can end with.
const (
	ErrNone      ErrorClass = ""
	ErrRefused   ErrorClass = "refused"    // connection refused (RST to the SYN)
	ErrReset     ErrorClass = "reset"      // connection reset or broken pipe
	ErrTimeout   ErrorClass = "timeout"    // connect or response did not come in time
	ErrClosed    ErrorClass = "closed"     // server closed the connection before a response
	ErrBadStatus ErrorClass = "bad_status" // an HTTP response other than 2xx
	ErrOther     ErrorClass = "other"      // anything else (see the error text)
)

// Record is one request as the client saw it.
type Record struct {
	Start   time.Time     // when the request was issued
	Latency time.Duration // until the body was read, or until it failed
	Class   ErrorClass    // ErrNone on success
	Err     string        // the error text on failure
	Status  int           // the HTTP status, 0 if none arrived
	Node    string        // the X-Shoal-Node header of the response
	// Connect is how long the TCP handshake took; 0 when the request
	// reused a connection or no handshake completed.
	Connect time.Duration
}

// SYNRetransmit is the connect time at and above which a handshake must
// have waited for a retransmitted SYN: Linux's first SYN timeout is 1 s,
// and a handshake in the lab otherwise takes well under a millisecond.
const SYNRetransmit = time.Second

// Delayed reports whether the request succeeded only after a SYN
// retransmission: its connect took SYNRetransmit or more.
func (r Record) Delayed() bool { return r.OK() && r.Connect >= SYNRetransmit }

// OK reports whether the request succeeded.
func (r Record) OK() bool { return r.Class == ErrNone }

// Result is the outcome of a run; it is what `shoal lab load --json` prints.
type Result struct {
	Start      time.Time `json:"start"`
	DurationMS float64   `json:"duration_ms"`
	Requests   int       `json:"requests"`
	Successes  int       `json:"successes"`
	Failures   int       `json:"failures"`
	RatePerSec float64   `json:"rate_per_sec"`
	P50MS      float64   `json:"p50_ms"`
	P99MS      float64   `json:"p99_ms"`
	// Connects counts the requests that opened a connection;
	// ConnectP50MS and ConnectP99MS are over their handshakes.
	Connects     int     `json:"connects"`
	ConnectP50MS float64 `json:"connect_p50_ms"`
	ConnectP99MS float64 `json:"connect_p99_ms"`
	// Delayed counts successful requests whose connect took SYNRetransmit
	// or more: each waited for a retransmitted SYN, as when it landed on
	// a bucket nobody owned.
	Delayed     int       `json:"syn_delayed"`
	DelayedList []Failure `json:"syn_delayed_list,omitempty"`
	// Retransmits counts the TCP segments the requests' connections sent
	// again after a loss (TCP_INFO, Linux; nil where the system does not
	// say): packets a filter or a queue dropped on the way. A slow server
	// causes none.
	Retransmits *uint64            `json:"retransmits,omitempty"`
	ByNode      map[string]int     `json:"by_node"`
	Share       map[string]float64 `json:"share"`
	Errors      map[ErrorClass]int `json:"errors,omitempty"`
	BucketMS    float64            `json:"bucket_ms"`
	Timeline    []Slot             `json:"timeline"`
	FailureList []Failure          `json:"failure_list,omitempty"`
	// FailuresDropped counts failures left out of FailureList to keep it short.
	FailuresDropped int `json:"failures_dropped,omitempty"`
	// Held: the long-lived connections held beside the requests
	// (Options.Held); nil without them.
	Held *HeldResult `json:"held,omitempty"`
}

// Slot is one timeline bucket: the requests that started in it.
type Slot struct {
	AtMS      float64        `json:"at_ms"` // bucket start, from the run's start
	Successes int            `json:"successes"`
	Failures  int            `json:"failures"`
	P50MS     float64        `json:"p50_ms"` // over successful requests
	P99MS     float64        `json:"p99_ms"`
	Delayed   int            `json:"syn_delayed,omitempty"` // successes delayed by a SYN retransmission
	ByNode    map[string]int `json:"by_node,omitempty"`
}

// Failure is one failed request, or one delayed by a SYN retransmission
// (then Class is empty and ConnectMS says how long the handshake took).
type Failure struct {
	AtMS      float64    `json:"at_ms"` // request start, from the run's start
	LatencyMS float64    `json:"latency_ms"`
	ConnectMS float64    `json:"connect_ms,omitempty"`
	Class     ErrorClass `json:"class,omitempty"`
	Status    int        `json:"status,omitempty"`
	Error     string     `json:"error,omitempty"`
}

// MaxFailureList caps Result.FailureList so a run against a dead server
// does not print megabytes.
const MaxFailureList = 1000

// Summarize turns records into a Result. start is the run's start, dur its
// length, bucket the timeline resolution (100 ms if zero). It is pure so the
// report can be tested without a network.
func Summarize(records []Record, start time.Time, dur, bucket time.Duration) Result {
	if bucket <= 0 {
		bucket = 100 * time.Millisecond
	}
	recs := slices.Clone(records)
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].Start.Before(recs[j].Start) })
	r := Result{
		Start:      start,
		DurationMS: ms(dur),
		Requests:   len(recs),
		ByNode:     map[string]int{},
		Share:      map[string]float64{},
		BucketMS:   ms(bucket),
	}
	var lat, conn []time.Duration
	slotLat := map[int][]time.Duration{}
	slots := map[int]*Slot{}
	last := -1
	for _, rec := range recs {
		i := int(rec.Start.Sub(start) / bucket)
		if i < 0 {
			i = 0
		}
		s := slots[i]
		if s == nil {
			s = &Slot{AtMS: ms(time.Duration(i) * bucket)}
			slots[i] = s
		}
		last = max(last, i)
		if rec.Connect > 0 {
			conn = append(conn, rec.Connect)
		}
		if rec.Delayed() {
			r.Delayed++
			s.Delayed++
			if len(r.DelayedList) < MaxFailureList {
				r.DelayedList = append(r.DelayedList, Failure{AtMS: ms(rec.Start.Sub(start)), LatencyMS: ms(rec.Latency), ConnectMS: ms(rec.Connect)})
			}
		}
		if rec.OK() {
			r.Successes++
			lat = append(lat, rec.Latency)
			slotLat[i] = append(slotLat[i], rec.Latency)
			s.Successes++
			if rec.Node != "" {
				r.ByNode[rec.Node]++
				if s.ByNode == nil {
					s.ByNode = map[string]int{}
				}
				s.ByNode[rec.Node]++
			}
			continue
		}
		r.Failures++
		s.Failures++
		if r.Errors == nil {
			r.Errors = map[ErrorClass]int{}
		}
		r.Errors[rec.Class]++
		if len(r.FailureList) >= MaxFailureList {
			r.FailuresDropped++
			continue
		}
		r.FailureList = append(r.FailureList, Failure{
			AtMS:      ms(rec.Start.Sub(start)),
			LatencyMS: ms(rec.Latency),
			Class:     rec.Class,
			Status:    rec.Status,
			Error:     rec.Err,
		})
	}
	for i := 0; i <= last; i++ {
		s := slots[i]
		if s == nil {
			s = &Slot{AtMS: ms(time.Duration(i) * bucket)}
		}
		s.P50MS = ms(Percentile(slotLat[i], 50))
		s.P99MS = ms(Percentile(slotLat[i], 99))
		r.Timeline = append(r.Timeline, *s)
	}
	r.P50MS = ms(Percentile(lat, 50))
	r.P99MS = ms(Percentile(lat, 99))
	r.Connects = len(conn)
	r.ConnectP50MS = ms(Percentile(conn, 50))
	r.ConnectP99MS = ms(Percentile(conn, 99))
	if r.Successes > 0 {
		for n, c := range r.ByNode {
			r.Share[n] = float64(c) / float64(r.Successes)
		}
	}
	if dur > 0 {
		r.RatePerSec = float64(r.Requests) / dur.Seconds()
	}
	return r
}

// Percentile returns the p-th percentile (nearest rank) of d, 0 if empty.
// d is sorted in place.
func Percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	// Nearest rank: the smallest value with at least p% of values <= it.
	k := int(math.Ceil(float64(len(d))*p/100)) - 1
	k = min(max(k, 0), len(d)-1)
	return d[k]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
