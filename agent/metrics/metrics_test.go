package metrics

import (
	"encoding/json"
	"io"
	"net/http/httptest"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/shoalnet/shoal/agent/announce"
	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/filter"
)

type fakeMetrics struct{}

func (fakeMetrics) Status() control.Status {
	return control.Status{Converged: true, Healthy: true, Connections: 7, RulesIndex: 12, UpdateFailures: 4, DataplaneHealthy: true,
		View:      control.ViewInfo{Eligible: []filter.NodeID{1, 2, 3}},
		Accepting: map[filter.RuleID]int{1: 1365}, Dirty: map[filter.RuleID]int{1: 5}, Draining: map[filter.RuleID]int{1: 2},
		BGP: &control.BGPInfo{
			Sessions: []announce.Session{
				{Neighbor: netip.MustParseAddr("198.18.1.1"), State: "established", BFD: "up"},
				{Neighbor: netip.MustParseAddr("198.18.1.2"), State: "active", BFD: "down"},
			},
			Announced: map[netip.Addr]time.Time{netip.MustParseAddr("198.18.1.100"): time.Unix(1, 0)},
		}}
}

func (fakeMetrics) Params() control.Params {
	return control.Params{Packets: map[filter.RuleID]control.PacketCounters{1: {Accepted: 42, Dropped: map[string]uint64{"not-owned": 84}}},
		Heartbeat: map[string]uint64{"sent": 9, "rejected_bad-mac": 1}, ARP: map[string]uint64{"replied": 3},
		BGP: map[string]uint64{"session_failures": 2, "withdrawn": 5}}
}

func TestMetrics(t *testing.T) {
	rec := httptest.NewRecorder()
	Handler(fakeMetrics{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	out := string(body)
	for _, want := range []string{
		`shoal_packets_accepted_total{rule="1"} 42`,
		`shoal_packets_dropped_total{reason="not-owned",rule="1"} 84`,
		`shoal_heartbeat_events_total{event="rejected_bad-mac"} 1`,
		`shoal_arp_events_total{event="replied"} 3`,
		`shoal_converged 1`,
		`shoal_buckets{rule="1",state="owned"} 1360`,
		`shoal_buckets{rule="1",state="owned_dirty"} 5`,
		`shoal_buckets{rule="1",state="draining"} 2`,
		`shoal_connections 7`,
		`shoal_rules_index 12`,
		`shoal_eligible_nodes 3`,
		`shoal_dataplane_update_failures_total 4`,
		`shoal_dataplane_healthy 1`,
		`shoal_bgp_session_established{neighbor="198.18.1.1"} 1`,
		`shoal_bgp_session_established{neighbor="198.18.1.2"} 0`,
		`shoal_bgp_bfd_up{neighbor="198.18.1.2"} 0`,
		`shoal_bgp_announced_vips 1`,
		`shoal_bgp_events_total{event="session_failures"} 2`,
		`shoal_bgp_events_total{event="withdrawn"} 5`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// Every metric the Grafana dashboard plots exists.
	b, err := os.ReadFile("../../deploy/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(b) {
		t.Fatal("deploy/grafana-dashboard.json is not valid JSON")
	}
	for _, name := range regexp.MustCompile(`shoal_[a-z_]+`).FindAllString(string(b), -1) {
		if !strings.Contains(out, name) {
			t.Errorf("the dashboard plots %s, which the agent does not export", name)
		}
	}
}
