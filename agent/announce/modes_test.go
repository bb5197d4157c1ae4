package announce

import (
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/shoalnet/shoal/rules"
)

// fakeClaimer records what it is told.
type fakeClaimer struct {
	vips      []netip.Addr
	eligible  bool
	announced [][]netip.Addr
}

func (f *fakeClaimer) Follow(vips []netip.Addr, _ rules.MACMode, eligible bool) error {
	f.vips, f.eligible = vips, eligible
	return nil
}
func (f *fakeClaimer) Announce(vips []netip.Addr)             { f.announced = append(f.announced, vips) }
func (f *fakeClaimer) Relink(int)                             {}
func (f *fakeClaimer) Health() error                          { return nil }
func (f *fakeClaimer) Counters() map[string]map[string]uint64 { return map[string]map[string]uint64{} }
func (f *fakeClaimer) Memberships() []string                  { return nil }
func (f *fakeClaimer) Close() error                           { return nil }

// TestModes: the mode decides which claimer follows the VIPs; the other
// follows none; leaving routed mode announces the VIPs on the LAN at once;
// routed mode without a speaker is unhealthy.
func TestModes(t *testing.T) {
	vips := []netip.Addr{netip.MustParseAddr("198.18.1.100")}
	l2, bgp := &fakeClaimer{}, &fakeClaimer{}
	m := &Modes{L2: l2, BGP: bgp}
	for _, step := range []struct {
		mode          rules.MACMode
		l2, bgp       []netip.Addr
		announcements int
	}{
		{rules.MACMulticast, vips, vips, 0}, // BGP is told the VIPs and the mode, and claims nothing outside routed mode
		{rules.MACRouted, nil, vips, 0},
		{rules.MACIGMP, vips, vips, 1},
		{rules.MACIGMP, vips, vips, 1},
	} {
		if err := m.Follow(vips, step.mode, true); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(l2.vips, step.l2) || !slices.Equal(bgp.vips, step.bgp) || len(l2.announced) != step.announcements {
			t.Errorf("%s: L2 follows %v, BGP %v, L2 announced %d times; want %v, %v, %d", step.mode, l2.vips, bgp.vips, len(l2.announced), step.l2, step.bgp, step.announcements)
		}
	}
	noBGP := &Modes{L2: &fakeClaimer{}}
	if err := noBGP.Follow(vips, rules.MACRouted, true); err != nil {
		t.Fatal(err)
	}
	if noBGP.Health() == nil {
		t.Error("routed mode without a BGP speaker reports healthy")
	}
	if err := noBGP.Follow(vips, rules.MACMulticast, true); err != nil || noBGP.Health() != nil {
		t.Errorf("back in multicast mode: %v, health %v", err, noBGP.Health())
	}
}

// TestMinLevel: GoBGP's info lines do not reach the agent's log.
func TestMinLevel(t *testing.T) {
	var b strings.Builder
	lvl := &slog.LevelVar{}
	lvl.Set(slog.LevelWarn)
	log := slog.New(minLevel{slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug}), lvl}).With("k", "v")
	log.Info("fsm step")
	log.Warn("peer down")
	if out := b.String(); strings.Contains(out, "fsm step") || !strings.Contains(out, "peer down") || !strings.Contains(out, "k=v") {
		t.Errorf("log: %q, want the warning (with its attributes) only", out)
	}
}
