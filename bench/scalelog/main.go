// Command scalelog reads the agents' debug logs of a lab (SHOAL_LOG_LEVEL=
// debug) and prints, per node and over the nodes, how long a change took
// to reach the node's tables, for bench/scale.sh:
//
//	scalelog -since T -rules IDX node*.agent.log
//	    time from T (RFC 3339) to the node's first tables pushed under
//	    rules index IDX or later: a rule change reaching every node.
//	scalelog -since T -without ID node*.agent.log
//	    for the node's first tables pushed after T under a view without
//	    node ID: the time from T, and the time from adopting that view to
//	    the tables in the kernel (recompute and push).
//
// It prints one line: "nodes N p50 P max M" in milliseconds (with
// -without, also "apply p50 P max M"), and exits 1 when a node has no such
// push.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

var (
	reTime    = regexp.MustCompile(`^time=(\S+) `)
	reRules   = regexp.MustCompile(` rules=(\d+) `)
	reView    = regexp.MustCompile(` view="?\[([0-9 ]*)\]"? `)
	reAdopted = regexp.MustCompile(` since_adopted=(\S+)`)
)

func main() {
	since := flag.String("since", "", "the change's time (RFC 3339)")
	rules := flag.Uint64("rules", 0, "the rules index of a rule change")
	without := flag.Int("without", 0, "the node a view change left out")
	flag.Parse()
	t0, err := time.Parse(time.RFC3339Nano, *since)
	if err != nil || (*rules == 0) == (*without == 0) {
		fmt.Fprintln(os.Stderr, "usage: scalelog -since RFC3339 (-rules IDX | -without ID) LOG...")
		os.Exit(2)
	}
	var reach, apply []float64
	var missing []string
	for _, path := range flag.Args() {
		r, a, ok, err := first(path, t0, *rules, *without)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if !ok {
			missing = append(missing, path)
			continue
		}
		reach, apply = append(reach, r), append(apply, a)
	}
	fmt.Printf("nodes %d p50 %.0f max %.0f", len(reach), pct(reach, 50), pct(reach, 100))
	if *without != 0 {
		fmt.Printf(" apply p50 %.1f max %.1f", pct(apply, 50), pct(apply, 100))
	}
	fmt.Println()
	if len(missing) > 0 {
		fmt.Fprintf(os.Stderr, "no such push in %s\n", strings.Join(missing, ", "))
		os.Exit(1)
	}
}

// first finds the node's first matching push after t0: ms from t0, and ms
// from the view's adoption to the push.
func first(path string, t0 time.Time, rules uint64, without int) (float64, float64, bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `msg="tables pushed"`) {
			continue
		}
		m := reTime.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil || at.Before(t0) {
			continue
		}
		if rules != 0 {
			r := reRules.FindStringSubmatch(line)
			if r == nil {
				continue
			}
			if n, _ := strconv.ParseUint(r[1], 10, 64); n < rules {
				continue
			}
		} else {
			v := reView.FindStringSubmatch(line)
			if v == nil || slices.Contains(strings.Fields(v[1]), strconv.Itoa(without)) {
				continue
			}
		}
		var apply float64
		if a := reAdopted.FindStringSubmatch(line); a != nil {
			if d, err := time.ParseDuration(a[1]); err == nil {
				apply = float64(d) / 1e6
			}
		}
		return float64(at.Sub(t0)) / 1e6, apply, true, nil
	}
	return 0, 0, false, sc.Err()
}

// pct is the p-th percentile (nearest rank); 0 for none.
func pct(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(p/100*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}
