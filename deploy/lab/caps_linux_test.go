package lab

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// agentCaps is the capability bounding set deploy/shoal.service gives the
// agent; TestAgentLeastPrivilege proves it is enough.
var agentCaps = []string{"net_admin", "net_raw", "bpf", "perfmon"}

// capBits are the numbers of the capabilities in agentCaps
// (linux/capability.h).
var capBits = map[string]uint{"net_admin": 12, "net_raw": 13, "sys_admin": 21, "perfmon": 38, "bpf": 39}

// TestAgentLeastPrivilege runs a 2-node lab whose agents hold only the
// capabilities of the systemd unit (setpriv drops the rest from the
// bounding set, as CapabilityBoundingSet does): they load and attach XDP,
// answer ARP on a raw socket, set addresses and sysctls over netlink and
// /proc, converge and serve the VIP.
func TestAgentLeastPrivilege(t *testing.T) {
	needRoot(t)
	if testing.Short() {
		t.Skip("builds shoal and a 2-node lab; skipped with -short")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) not installed")
	}
	caps := agentCaps
	if v := os.Getenv("SHOAL_TEST_CAPS"); v != "" { // to try other sets by hand
		caps = strings.Split(v, ",")
	}
	bin := buildShoal(t)
	// The lab runs its binary for agents, servers and the CLI: only agents
	// get the reduced set.
	wrapper := filepath.Join(t.TempDir(), "shoal-caps")
	script := fmt.Sprintf("#!/bin/sh\nif [ \"$1\" = agent ]; then exec %s --bounding-set=-all,+%s -- %s \"$@\"; fi\nexec %s \"$@\"\n",
		setpriv, strings.Join(caps, ",+"), bin, bin)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := Up(ctx, Options{Nodes: 2, Binary: wrapper, Base: t.TempDir(), KeepOnFailure: false})
	if err != nil {
		t.Fatalf("a lab whose agents hold only %v: %v", caps, err)
	}
	t.Cleanup(func() {
		if err := l.Down(context.Background()); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	var want uint64
	for _, c := range caps {
		want |= 1 << capBits[c]
	}
	for host, v := range agentProcStatus(t, l, "CapEff") {
		if got, _ := strconv.ParseUint(v, 16, 64); got != want {
			t.Errorf("agent of %s has capabilities %x, want %x (%v)", host, got, want, caps)
		}
	}
	// The VIP answers from the client.
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: nsDialer(t, l.Client.Namespace), DisableKeepAlives: true}}
	for range 10 {
		resp, err := c.Get(fmt.Sprintf("http://%s:%d/", l.VIP, HTTPPort))
		if err != nil {
			t.Fatalf("GET the VIP: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Shoal-Node") == "" {
			t.Fatalf("GET the VIP: %s, served by %q", resp.Status, resp.Header.Get("X-Shoal-Node"))
		}
	}
}
