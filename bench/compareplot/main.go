// Command compareplot draws bench/compare.sh's results (its .tsv) as an SVG
// bar chart: for each tool and connection mode, requests/s through (a) the
// VIP with 2 nodes, (b) HAProxy, (c) one backend direct and (d) the VIP
// with 1 node, one bar per round, with the ratios a/b and d/c underneath.
//
//	go run ./bench/compareplot bench/out/compare-XXXX.tsv > compare.svg
package main

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/shoalnet/shoal/deploy/drill"
)

var targets = []struct{ key, label, color string }{
	{"a-vip2", "(a) shoal VIP, 2 nodes", "#4e79a7"},
	{"b-haproxy", "(b) HAProxy, 2 backends", "#e15759"},
	{"c-direct", "(c) one backend direct", "#76b7b2"},
	{"d-vip1", "(d) shoal VIP, 1 node", "#f28e2b"},
}

type key struct{ round, tool, mode string }

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: compareplot RESULTS.tsv > plot.svg")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer f.Close()
	rps, groups, rounds, err := read(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	title := "requests/s, " + strings.TrimSuffix(lastPath(os.Args[1]), ".tsv")
	write(os.Stdout, title, rps, groups, rounds)
}

func lastPath(p string) string { return p[strings.LastIndex(p, "/")+1:] }

// read parses round, target, tool, mode, rps, ... lines.
func read(r io.Reader) (map[key]map[string]float64, []key, []string, error) {
	rps := map[key]map[string]float64{}
	seenG := map[key]bool{}
	seenR := map[string]bool{}
	var groups []key
	var rounds []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) < 5 || f[0] == "round" {
			continue
		}
		v, err := strconv.ParseFloat(f[4], 64)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("bad rps %q", f[4])
		}
		k := key{f[0], f[2], f[3]}
		if rps[k] == nil {
			rps[k] = map[string]float64{}
		}
		rps[k][f[1]] = v
		g := key{"", f[2], f[3]}
		if !seenG[g] {
			seenG[g] = true
			groups = append(groups, g)
		}
		if !seenR[f[0]] {
			seenR[f[0]] = true
			rounds = append(rounds, f[0])
		}
	}
	sort.Strings(rounds)
	return rps, groups, rounds, sc.Err()
}

func write(w io.Writer, title string, rps map[key]map[string]float64, groups []key, rounds []string) {
	const (
		width, height       = 980, 460
		left, right, top, b = 70, 20, 60, 110
	)
	var maxV float64
	for _, m := range rps {
		for _, v := range m {
			maxV = math.Max(maxV, v)
		}
	}
	step := drill.NiceStep(maxV / 5)
	yMax := math.Ceil(maxV/step) * step
	if yMax == 0 {
		yMax, step = 1, 1
	}
	plotW, plotH := float64(width-left-right), float64(height-top-b)
	yOf := func(v float64) float64 { return float64(top) + plotH*(1-v/yMax) }
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(w, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(w, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))
	for i, t := range targets {
		x := left + i*220
		fmt.Fprintf(w, `<rect x="%d" y="34" width="12" height="12" fill="%s"/><text x="%d" y="45">%s</text>`+"\n", x, t.color, x+16, t.label)
	}
	for v := 0.0; v <= yMax+step/2; v += step {
		fmt.Fprintf(w, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e5e5e5"/><text x="%d" y="%.1f" text-anchor="end">%.0f</text>`+"\n",
			left, yOf(v), width-right, yOf(v), left-6, yOf(v)+4, v)
	}
	groupW := plotW / float64(len(groups))
	barW := groupW * 0.8 / float64(len(targets)*len(rounds))
	for gi, g := range groups {
		gx := float64(left) + float64(gi)*groupW + groupW*0.1
		for ti, t := range targets {
			for ri, r := range rounds {
				v := rps[key{r, g.tool, g.mode}][t.key]
				x := gx + float64(ti*len(rounds)+ri)*barW
				fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" stroke="white"><title>round %s %s: %.0f req/s</title></rect>`+"\n",
					x, yOf(v), barW, float64(top)+plotH-yOf(v), t.color, r, t.label, v)
			}
		}
		mode := "new connections"
		if g.mode == "keepalive" {
			mode = "keep-alive"
		}
		cx := float64(left) + (float64(gi)+0.5)*groupW
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="middle" font-weight="bold">%s, %s</text>`+"\n", cx, float64(top)+plotH+18, g.tool, mode)
		for ri, r := range rounds {
			m := rps[key{r, g.tool, g.mode}]
			fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="middle">round %s: a/b %.2f, d/c %.2f</text>`+"\n",
				cx, float64(top)+plotH+36+float64(ri)*16, r, ratio(m["a-vip2"], m["b-haproxy"]), ratio(m["d-vip1"], m["c-direct"]))
		}
	}
	fmt.Fprintf(w, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">requests/s (bars: one per round)</text>`+"\n", float64(top)+plotH/2)
	fmt.Fprintln(w, "</svg>")
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
