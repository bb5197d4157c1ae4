package drill

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// Plot geometry, in SVG user units.
const (
	plotW      = 960
	plotH      = 440
	padLeft    = 72
	padRight   = 150 // the legend
	padTop     = 56
	padBottom  = 52
	slotMillis = 100.0
)

// palette colours the nodes; failures are always red.
var palette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#bab0ac"}

const failColor = "#d62728"

// WriteSVG draws the drill as an SVG plot: requests/s answered by each node
// stacked over time, failed requests/s in red (with a marker under every
// slot that had one, however few), the event and the moment the cluster
// settled as vertical lines. Elements carry ids (series-<node>, failures,
// event, settled) so tests and tools can find them.
func (r *Report) WriteSVG(w io.Writer) error {
	nodes := r.NodeNames()
	slots := r.Timeline
	spanMS := math.Max(float64(len(slots))*slotMillis, r.DurationMS)
	if spanMS <= 0 {
		spanMS = 1000
	}
	perSec := 1000 / slotMillis
	var top float64
	for _, s := range slots {
		top = math.Max(top, float64(s.Successes+s.Failures)*perSec)
	}
	yMax, yStep := niceAxis(top)
	x0, x1 := float64(padLeft), float64(plotW-padRight)
	y0, y1 := float64(plotH-padBottom), float64(padTop)
	xOf := func(msec float64) float64 { return x0 + (x1-x0)*msec/spanMS }
	yOf := func(rate float64) float64 { return y0 - (y0-y1)*rate/yMax }

	var b strings.Builder
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		plotW, plotH, plotW, plotH)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", plotW, plotH)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", padLeft, esc(r.title()))
	fmt.Fprintf(&b, `<text x="%d" y="40" fill="#555">%s</text>`+"\n", padLeft, esc(r.subtitle()))

	// The settling window, shaded behind everything.
	if r.SettledMS >= 0 {
		fmt.Fprintf(&b, `<rect id="settling" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#fde0dc" opacity="0.6"/>`+"\n",
			xOf(r.EventAtMS), y1, math.Max(xOf(r.EventAtMS+r.SettledMS)-xOf(r.EventAtMS), 1), y0-y1)
	}
	// Grid and axes.
	for v := 0.0; v <= yMax+yStep/2; v += yStep {
		y := yOf(v)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e5e5e5"/>`+"\n", x0, y, x1, y)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-6, y+4, humanRate(v))
	}
	xStep := NiceStep(spanMS/1000/10) * 1000
	for t := 0.0; t <= spanMS+1; t += xStep {
		x := xOf(t)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#f0f0f0"/>`+"\n", x, y1, x, y0)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%g</text>`+"\n", x, y0+16, math.Round(t/100)/10)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">time since the traffic started (s)</text>`+"\n", (x0+x1)/2, plotH-10)
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">requests/s (per 100 ms)</text>`+"\n", (y0+y1)/2)

	// Stacked areas, one per node, as steps over the slots.
	base := make([]float64, len(slots))
	for i, n := range nodes {
		var up, down []string
		for j, s := range slots {
			v := base[j] + float64(s.Responses[n])*perSec
			xa, xb := xOf(s.AtMS), xOf(s.AtMS+slotMillis)
			up = append(up, fmt.Sprintf("%.1f,%.1f %.1f,%.1f", xa, yOf(v), xb, yOf(v)))
			down = append(down, fmt.Sprintf("%.1f,%.1f %.1f,%.1f", xb, yOf(base[j]), xa, yOf(base[j])))
			base[j] = v
		}
		for l, r := 0, len(down)-1; l < r; l, r = l+1, r-1 {
			down[l], down[r] = down[r], down[l]
		}
		pts := strings.Join(append(up, down...), " ")
		c := palette[i%len(palette)]
		fmt.Fprintf(&b, `<polygon id="series-%s" points="%s" fill="%s" fill-opacity="0.85" stroke="%s" stroke-width="0.5"><title>%s: requests/s answered</title></polygon>`+"\n",
			esc(n), pts, c, c, esc(n))
	}
	// Failures: bars on the same scale, and a marker for every slot with any.
	fmt.Fprintf(&b, `<g id="failures" fill="%s">`+"\n", failColor)
	for _, s := range slots {
		if s.Failures == 0 {
			continue
		}
		xa, xb := xOf(s.AtMS), xOf(s.AtMS+slotMillis)
		h := math.Max(y0-yOf(float64(s.Failures)*perSec), 2)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%.1f s: %d failed</title></rect>`+"\n",
			xa, y0-h, math.Max(xb-xa, 1.5), h, s.AtMS/1000, s.Failures)
		xm := (xa + xb) / 2
		fmt.Fprintf(&b, `<path d="M%.1f %.1f l-5 9 h10 z"/>`+"\n", xm, y0+22)
	}
	b.WriteString("</g>\n")
	// The event and the moment it settled.
	xe := xOf(r.EventAtMS)
	fmt.Fprintf(&b, `<g id="event"><line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black" stroke-width="2" stroke-dasharray="6 4"/>`+
		`<text x="%.1f" y="%.1f" font-weight="bold">%s</text></g>`+"\n",
		xe, y1-4, xe, y0, xe+4, y1+12, esc(r.EventLabel()))
	if r.SettledMS >= 0 {
		xs := xOf(r.EventAtMS + r.SettledMS)
		fmt.Fprintf(&b, `<g id="settled"><line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#2a7f2a" stroke-width="2" stroke-dasharray="2 3"/>`+
			`<text x="%.1f" y="%.1f" fill="#2a7f2a">+%.0f ms: %s</text></g>`+"\n",
			xs, y1, xs, y0, xs+4, y1+28, r.SettledMS, esc(r.settledShort()))
	}
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#888"/>`+"\n", x0, y1, x1-x0, y0-y1)

	// Legend.
	lx, ly := x1+16, y1+4
	for i, n := range nodes {
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="14" height="14" fill="%s"/><text x="%.1f" y="%.1f">%s</text>`+"\n",
			lx, ly+float64(i)*22, palette[i%len(palette)], lx+20, ly+float64(i)*22+12, esc(n))
	}
	ly += float64(len(nodes)) * 22
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="14" height="14" fill="%s"/><text x="%.1f" y="%.1f">failed</text>`+"\n",
		lx, ly, failColor, lx+20, ly+12)
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black" stroke-width="2" stroke-dasharray="6 4"/><text x="%.1f" y="%.1f">event</text>`+"\n",
		lx, ly+29, lx+14, ly+29, lx+20, ly+34)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// title is the plot's headline: what happened and what it cost.
func (r *Report) title() string {
	s := "shoal drill: " + r.EventLabel()
	if r.SettledMS >= 0 {
		s += fmt.Sprintf(", settled in %.0f ms", r.SettledMS)
	} else {
		s += ", did NOT settle"
	}
	return s + fmt.Sprintf(", %d of %d requests failed", r.Failures, r.Requests)
}

func (r *Report) subtitle() string {
	conn := "new connections"
	if r.KeepAlive {
		conn = "keep-alive"
	}
	s := fmt.Sprintf("%s, %s, concurrency %d, p50 %.2f ms, p99 %.2f ms", r.Target, conn, r.Concurrency, r.P50MS, r.P99MS)
	if r.HeartbeatPeriod != "" {
		s += fmt.Sprintf(", heartbeat %s x %d", r.HeartbeatPeriod, r.HeartbeatTolerance)
	}
	return s
}

// niceAxis returns an axis maximum >= v and a tick step, both round.
func niceAxis(v float64) (top, step float64) {
	if v <= 0 {
		return 10, 2
	}
	step = NiceStep(v / 5)
	return math.Ceil(v/step) * step, step
}

// NiceStep rounds v up to 1, 2 or 5 times a power of ten.
func NiceStep(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// humanRate prints a rate as 800, 1.5k, 12k.
func humanRate(v float64) string {
	switch {
	case v >= 1000 && math.Mod(v, 1000) == 0:
		return fmt.Sprintf("%.0fk", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.1fk", v/1000)
	}
	return fmt.Sprintf("%.0f", v)
}

func esc(s string) string { return html.EscapeString(s) }

// settledShort names the settling moment in a few words, for the plot.
func (r *Report) settledShort() string {
	switch r.Scenario {
	case Plug, Kill, Drainstop:
		return "every bucket owned again"
	case Join:
		return "node joined"
	}
	return "rebalanced"
}
