package agent_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/shoalnet/shoal/deploy/lab"
)

var updateScreenshot = flag.Bool("update-screenshot", false, "copy the status page's screenshot to docs/img/statuspage.png")

// The browser half of TestE2EStatusPage runs in a child test process inside
// the lab's client namespace (chromium and the DevTools connection both live
// there), told what to check through these variables.
const (
	envPageURL   = "SHOAL_STATUSPAGE_URL"
	envPageNodes = "SHOAL_STATUSPAGE_NODES"
	envPageRules = "SHOAL_STATUSPAGE_RULES"
	envPageDrain = "SHOAL_STATUSPAGE_DRAINING"
	envPageFail  = "SHOAL_STATUSPAGE_FAILOVER"
	envPageShot  = "SHOAL_STATUSPAGE_SHOT"
)

// TestE2EStatusPage opens node1's status page in headless Chromium while
// traffic flows and node3 drains with connections open, after node2's plug
// was pulled and put back, and checks what it shows: every node and rule,
// packet counts that move, node3 draining, node2's failover and its cause.
func TestE2EStatusPage(t *testing.T) {
	if _, err := exec.LookPath("chromium"); err != nil && os.Geteuid() == 0 && !testing.Short() {
		if os.Getenv("CI") != "" {
			t.Fatal("chromium is missing: .ci/run installs it")
		}
		t.Skip("needs Debian's chromium (apt-get install chromium)")
	}
	l := upLab(t, 3)

	// A failover for the page to show: node2's plug pulled, then put back.
	mustShoal(t, l, "node2", "plug", "pull")
	poll(t, 10*time.Second, "node1 and node3 cover node2's share", func() error { return covered(l, "node1", "node3") })
	mustShoal(t, l, "node2", "plug", "restore")
	poll(t, 10*time.Second, "node2 back", func() error { return covered(l, "node1", "node2", "node3") })

	// Connections held on node3, so that its drain lasts.
	var conns []*heldConn
	for len(byNode(conns)["node3"]) < 3 {
		if len(conns) > 300 {
			t.Fatalf("300 connections opened, only %d on node3", len(byNode(conns)["node3"]))
		}
		batch := dialFromClient(t, l, 20)
		for _, c := range batch {
			if err := c.get(l.VIP.String()); err != nil {
				t.Fatal(err)
			}
		}
		conns = append(conns, batch...)
	}
	h := hold(t, l, conns, 200*time.Millisecond)
	t.Cleanup(h.close)
	mustShoal(t, l, "node3", "drainstop", "--no-wait")

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	loadDone := make(chan error, 1)
	go func() {
		_, err := l.Load(ctx, lab.LoadArgs{Duration: 40 * time.Second, Concurrency: 2, Rate: 300, Timeout: 2 * time.Second}, nil)
		loadDone <- err
	}()

	var rules []string
	for _, r := range mustRules(t, l) {
		rules = append(rules, strconv.Itoa(int(r)))
	}
	shot := filepath.Join(t.ArtifactDir(), "statuspage.png")
	n1 := node(t, l, "node1")
	cmd := exec.Command("ip", "netns", "exec", l.Client.Namespace, os.Args[0], "-test.run=^TestStatusPageBrowser$", "-test.v", "-test.timeout=90s")
	cmd.Env = append(os.Environ(),
		envPageURL+"=http://"+n1.Addr.String()+":"+strconv.Itoa(lab.MetricsPort)+"/",
		envPageNodes+"=node1,node2,node3", envPageRules+"="+strings.Join(rules, ","),
		envPageDrain+"=node3", envPageFail+"=node2", envPageShot+"="+shot)
	out, err := cmd.CombinedOutput()
	t.Logf("browser:\n%s", out)
	if err != nil {
		t.Fatalf("the status page check failed: %v", err)
	}
	cancel()
	if err := <-loadDone; err != nil && !errors.Is(err, context.Canceled) {
		t.Logf("load: %v", err)
	}
	if *updateScreenshot {
		b, err := os.ReadFile(shot)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile("../docs/img/statuspage.png", b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// mustRules returns the lab's rule ids.
func mustRules(t *testing.T, l *lab.Lab) []int {
	t.Helper()
	q, err := client(t, l, "node1").Query(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []int
	for _, r := range q.Rules {
		ids = append(ids, int(r.ID))
	}
	if len(ids) == 0 {
		t.Fatal("the lab has no rule")
	}
	return ids
}

// TestStatusPageBrowser is the browser half of TestE2EStatusPage; run
// alone it skips.
func TestStatusPageBrowser(t *testing.T) {
	url := os.Getenv(envPageURL)
	if url == "" {
		t.Skip("run by TestE2EStatusPage inside the lab's client namespace")
	}
	nodes := strings.Split(os.Getenv(envPageNodes), ",")
	rules := strings.Split(os.Getenv(envPageRules), ",")
	draining := os.Getenv(envPageDrain)

	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath("chromium"),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 1000),
	}
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	ctx, cancel = context.WithTimeout(ctx, 60*time.Second)
	t.Cleanup(cancel)

	if err := chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(`#nodes .card`))); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	// eval polls a JavaScript predicate until it holds.
	eval := func(what, js string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js))
			if err == nil && ok {
				return
			}
			if time.Now().After(deadline) {
				html, _ := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("main")))
				t.Fatalf("%s: not within 20s (err %v); page:\n%s", what, err, html)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	for _, n := range nodes {
		eval("node "+n+" shown", fmt.Sprintf(`!!document.querySelector('#nodes .card[data-node=%q] [data-field=accepted]')`, n))
		for _, r := range rules {
			eval("node "+n+" in rule "+r, fmt.Sprintf(`!!document.querySelector('#rules .rule[data-rule=%q] .share[data-node=%q] .bar i')`, r, n))
		}
	}
	eval("the cluster converged", `document.getElementById('cluster').dataset.converged === 'true'`)
	eval(draining+" shown draining", fmt.Sprintf(`(() => {
		const c = document.querySelector('#nodes .card[data-node=%q]');
		const d = document.querySelector('#drain [data-drain=%q] [data-field=remaining]');
		return c && c.dataset.admin === 'draining' && c.classList.contains('draining') &&
			!document.getElementById('drain-section').hidden && d && /^[1-9][0-9]* connections left/.test(d.textContent);
	})()`, draining, draining))

	failed := os.Getenv(envPageFail)
	eval(failed+"'s failover shown", fmt.Sprintf(`(() => {
		const f = document.querySelector('#failovers [data-failover=%q]');
		return !!f && /: [0-9.]+ (ms|s)$/.test(f.textContent) &&
			[...document.querySelectorAll('#views li')].some(li => li.textContent.includes(%q + ' dead: no heartbeat for'));
	})()`, failed, failed))

	// Numbers move without a reload: every serving node's accepted count
	// grows, and its rate shows, while the page stays the same document.
	grab := `Object.fromEntries([...document.querySelectorAll('#nodes .card')].map(c => [c.dataset.node, (c.querySelector('[data-field=accepted]')||{}).textContent]))`
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.__sameDocument = true`)); err != nil {
		t.Fatal(err)
	}
	before, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]string](grab))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n == draining {
			continue
		}
		eval("node "+n+"'s accepted packets grow", fmt.Sprintf(`(() => {
			const c = document.querySelector('#nodes .card[data-node=%q]');
			const a = Number(c.querySelector('[data-field=accepted]').textContent);
			const r = c.querySelector('[data-field=accepted-rate]').textContent;
			return window.__sameDocument === true && a > %s && r !== '–' && Number(r.replace(/[kM]$/, '')) > 0;
		})()`, n, orZero(before[n])))
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(os.Getenv(envPageShot), png, 0o644); err != nil {
		t.Fatal(err)
	}
	// A phone: the same page, one column, no horizontal scrolling.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(390, 844)); err != nil {
		t.Fatal(err)
	}
	scroll, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth + 1`))
	if err != nil {
		t.Fatal(err)
	}
	if scroll {
		t.Error("on a 390 px wide screen the page scrolls sideways")
	}
}

func orZero(s string) string {
	if _, err := strconv.ParseUint(s, 10, 64); err != nil {
		return "0"
	}
	return s
}
