package announce

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"

	"github.com/shoalnet/shoal/rules"
)

// BGPConfig is what StartBGP needs (agent/config's bgp section, checked).
type BGPConfig struct {
	ASN         uint32
	RouterID    netip.Addr
	NextHop     netip.Addr // announced for the IPv4 VIPs; invalid: they are not announced
	NextHop6    netip.Addr // announced for the IPv6 VIPs; invalid: they are not announced
	Communities []uint32
	Neighbors   []Neighbor
	Log         *slog.Logger
}

// Neighbor is one router.
type Neighbor struct {
	Address       netip.Addr
	ASN           uint32
	Password      string
	HoldTime      time.Duration
	Keepalive     time.Duration
	MultihopTTL   uint8
	BFD           bool
	BFDInterval   time.Duration // how often this node sends
	BFDReceive    time.Duration // how often it asks the router to send
	BFDMultiplier uint32
}

// connectRetry is how soon a session that failed or was refused is tried
// again (GoBGP's default is 120 s: a router restarted would wait that long).
const connectRetry = 3 * time.Second

// BGP claims the VIPs in routed mode: an embedded GoBGP speaker announces
// each VIP (/32, /128) to every neighbour, with this node's address as next
// hop, while the node is eligible, and withdraws it when it is not. It
// opens sessions only outbound (it listens on no port) and takes no route
// from anybody (a reject-all import policy). A neighbour that is down,
// refuses, flaps or sends garbage only changes that neighbour's session:
// the speaker runs its own goroutines, and nothing here waits on one.
type BGP struct {
	cfg BGPConfig
	log *slog.Logger
	s   *server.BgpServer

	mu        sync.Mutex // serialises Follow and Close; the host calls Follow from one goroutine
	announced map[netip.Addr]time.Time
	closed    bool

	withdrawn atomic.Uint64 // announcements withdrawn
	flaps     atomic.Uint64 // sessions that left Established
	cancel    func()
}

// StartBGP starts the speaker and adds the neighbours; it announces
// nothing until Follow says the node is eligible.
func StartBGP(cfg BGPConfig) (*BGP, error) {
	if len(cfg.Neighbors) == 0 {
		return nil, errors.New("bgp: no neighbour configured")
	}
	log := cmp.Or(cfg.Log, slog.Default()).With("announcer", "bgp")
	// GoBGP logs every FSM step at info; the announcer logs what matters
	// (sessions up and down, announcements), so GoBGP's own lines below
	// warn are dropped. Its level variable alone filters nothing: the
	// handler is the agent's.
	lvl := &slog.LevelVar{}
	lvl.Set(slog.LevelWarn)
	s := server.NewBgpServer(server.LoggerOption(slog.New(minLevel{log.Handler(), lvl}), lvl))
	go s.Serve()
	b := &BGP{cfg: cfg, log: log, s: s, announced: map[netip.Addr]time.Time{}}
	ctx := context.Background()
	fail := func(err error) (*BGP, error) {
		s.Stop()
		return nil, err
	}
	if err := s.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn: cfg.ASN, RouterId: cfg.RouterID.String(),
		ListenPort: -1, // outbound sessions only
	}}); err != nil {
		return fail(fmt.Errorf("bgp: start: %w", err))
	}
	// Import nothing from the routers: the global import policy rejects
	// every route but this node's own (GoBGP runs the locally added paths
	// through it too, so a bare default of reject would announce nothing).
	policy := &api.Policy{Name: "shoal-import", Statements: []*api.Statement{{
		Name:       "own-routes",
		Conditions: &api.Conditions{RouteType: api.Conditions_ROUTE_TYPE_LOCAL},
		Actions:    &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_ACCEPT},
	}}}
	if err := s.AddPolicy(ctx, &api.AddPolicyRequest{Policy: policy}); err != nil {
		return fail(fmt.Errorf("bgp: import policy: %w", err))
	}
	if err := s.SetPolicyAssignment(ctx, &api.SetPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Name: "global", Direction: api.PolicyDirection_POLICY_DIRECTION_IMPORT,
		Policies: []*api.Policy{{Name: policy.Name}}, DefaultAction: api.RouteAction_ROUTE_ACTION_REJECT,
	}}); err != nil {
		return fail(fmt.Errorf("bgp: import policy: %w", err))
	}
	wctx, cancel := context.WithCancel(ctx)
	b.cancel = cancel
	if err := s.WatchEvent(wctx, server.WatchEventMessageCallbacks{OnPeerUpdate: b.peerEvent}, server.WatchPeer()); err != nil {
		cancel()
		return fail(fmt.Errorf("bgp: watch peers: %w", err))
	}
	for _, n := range cfg.Neighbors {
		if err := s.AddPeer(ctx, &api.AddPeerRequest{Peer: b.peer(n)}); err != nil {
			cancel()
			return fail(fmt.Errorf("bgp: neighbour %s: %w", n.Address, err))
		}
	}
	return b, nil
}

// peer is n as GoBGP configures it.
func (b *BGP) peer(n Neighbor) *api.Peer {
	p := &api.Peer{
		Conf: &api.PeerConf{NeighborAddress: n.Address.String(), PeerAsn: n.ASN, AuthPassword: n.Password},
		Timers: &api.Timers{Config: &api.TimersConfig{
			HoldTime: uint64(n.HoldTime / time.Second), KeepaliveInterval: uint64(n.Keepalive / time.Second),
			ConnectRetry: uint64(connectRetry / time.Second), IdleHoldTimeAfterReset: 1,
		}},
	}
	if n.MultihopTTL > 1 {
		p.EbgpMultihop = &api.EbgpMultihop{Enabled: true, MultihopTtl: uint32(n.MultihopTTL)}
	}
	for _, f := range b.families() {
		p.AfiSafis = append(p.AfiSafis, &api.AfiSafi{Config: &api.AfiSafiConfig{Family: f, Enabled: true}})
	}
	if n.BFD {
		p.Bfd = &api.BfdPeerConfig{Enabled: true, DesiredMinimumTxInterval: uint32(n.BFDInterval / time.Microsecond),
			RequiredMinimumReceive: uint32(n.BFDReceive / time.Microsecond), DetectionMultiplier: n.BFDMultiplier}
	}
	return p
}

// families are the address families the sessions carry: IPv4 unicast, and
// IPv6 unicast when the node has an IPv6 next hop to announce.
func (b *BGP) families() []*api.Family {
	fs := []*api.Family{{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}}
	if b.cfg.NextHop6.IsValid() {
		fs = append(fs, &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST})
	}
	return fs
}

func (b *BGP) peerEvent(e *apiutil.WatchEventMessage_PeerEvent, _ time.Time) {
	if e.Type != apiutil.PEER_EVENT_STATE {
		return
	}
	st := e.Peer.State
	if st.SessionState == bgp.BGP_FSM_ESTABLISHED {
		b.log.Info("bgp session up", "neighbor", st.NeighborAddress, "asn", st.PeerASN)
		return
	}
	if st.SessionState == bgp.BGP_FSM_IDLE && st.DisconnectReason != api.PeerState_DISCONNECT_REASON_UNSPECIFIED {
		b.flaps.Add(1)
		b.log.Warn("bgp session down", "neighbor", st.NeighborAddress, "reason", st.DisconnectReason.String(), "message", st.DisconnectMessage)
	}
}

// Follow announces vips while the mode is routed and the node eligible,
// and withdraws every announcement otherwise. Calling it again with the
// same arguments changes nothing.
func (b *BGP) Follow(vips []netip.Addr, mode rules.MACMode, eligible bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	var want []netip.Addr
	if mode == rules.MACRouted && eligible {
		for _, v := range vips {
			if b.nextHop(v).IsValid() {
				want = append(want, v)
			}
		}
	}
	var errs []error
	for v := range b.announced {
		if !slices.Contains(want, v) {
			if err := b.s.DeletePath(apiutil.DeletePathRequest{Paths: []*apiutil.Path{b.path(v)}}); err != nil {
				errs = append(errs, fmt.Errorf("bgp: withdraw %s: %w", v, err))
				continue
			}
			delete(b.announced, v)
			b.withdrawn.Add(1)
			b.log.Info("vip withdrawn", "vip", v)
		}
	}
	for _, v := range want {
		if _, ok := b.announced[v]; ok {
			continue
		}
		if _, err := b.s.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{b.path(v)}}); err != nil {
			errs = append(errs, fmt.Errorf("bgp: announce %s: %w", v, err))
			continue
		}
		b.announced[v] = time.Now()
		b.log.Info("vip announced", "vip", v, "next_hop", b.nextHop(v))
	}
	return errors.Join(errs...)
}

func (b *BGP) nextHop(vip netip.Addr) netip.Addr {
	if vip.Is4() {
		return b.cfg.NextHop
	}
	return b.cfg.NextHop6
}

// path is vip's announcement: a host route with this node as next hop.
func (b *BGP) path(vip netip.Addr) *apiutil.Path {
	nlri, _ := bgp.NewIPAddrPrefix(netip.PrefixFrom(vip, vip.BitLen())) // a host prefix is always valid
	attrs := []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP)}
	family := bgp.RF_IPv4_UC
	if vip.Is4() {
		nh, _ := bgp.NewPathAttributeNextHop(b.cfg.NextHop)
		attrs = append(attrs, nh)
	} else {
		family = bgp.RF_IPv6_UC
		mp, _ := bgp.NewPathAttributeMpReachNLRI(family, []bgp.PathNLRI{{NLRI: nlri}}, b.cfg.NextHop6)
		attrs = append(attrs, mp)
	}
	if len(b.cfg.Communities) > 0 {
		attrs = append(attrs, bgp.NewPathAttributeCommunities(b.cfg.Communities))
	}
	return &apiutil.Path{Family: family, Nlri: nlri, Attrs: attrs}
}

// Announce changes nothing: a route stays announced until withdrawn.
func (b *BGP) Announce([]netip.Addr) {}

// Relink changes nothing: the sessions follow the routing table, not an
// interface index.
func (b *BGP) Relink(int) {}

// Health is always nil: a neighbour that is down only stops that router
// from sending this node traffic, and is shown in Sessions.
func (b *BGP) Health() error { return nil }

// Memberships is none: routed mode joins no multicast group.
func (b *BGP) Memberships() []string { return nil }

// Session is one neighbour's session as the operator sees it.
type Session struct {
	Neighbor  netip.Addr `json:"neighbor"`
	ASN       uint32     `json:"asn"`
	State     string     `json:"state"`          // idle, connect, active, opensent, openconfirm, established
	Since     time.Time  `json:"since,omitzero"` // when it was established, or went down
	BFD       string     `json:"bfd,omitempty"`  // up, down, init, admin_down; "" when BFD is off
	Flaps     uint64     `json:"flaps"`          // times BFD saw the session fail
	Sent      uint64     `json:"sent"`           // routes advertised to the neighbour now
	Received  uint64     `json:"received"`       // routes it sent (all rejected by the import policy)
	LastError string     `json:"last_error,omitempty"`
}

// Sessions lists the neighbours' sessions, by address.
func (b *BGP) Sessions() []Session {
	var out []Session
	_ = b.s.ListPeer(context.Background(), &api.ListPeerRequest{EnableAdvertised: true}, func(p *api.Peer) {
		s := Session{State: "unknown"}
		if p.Conf != nil {
			s.Neighbor, _ = netip.ParseAddr(p.Conf.NeighborAddress)
			s.ASN = p.Conf.PeerAsn
		}
		if st := p.State; st != nil {
			s.State = sessionState(st.SessionState)
			s.LastError = st.DisconnectMessage
			if bs := st.BfdState; bs != nil && p.Bfd != nil && p.Bfd.Enabled {
				s.BFD = bfdState(bs.SessionState)
				s.Flaps = bs.FailureTransitions
			}
		}
		for _, af := range p.AfiSafis {
			if af.State != nil {
				s.Sent += af.State.Advertised
				s.Received += af.State.Received
			}
		}
		if t := p.Timers; t != nil && t.State != nil {
			if s.State == "established" && t.State.Uptime != nil {
				s.Since = t.State.Uptime.AsTime()
			} else if t.State.Downtime != nil {
				s.Since = t.State.Downtime.AsTime()
			}
		}
		out = append(out, s)
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Neighbor.Less(out[j].Neighbor) })
	return out
}

func sessionState(s api.PeerState_SessionState) string {
	switch s {
	case api.PeerState_SESSION_STATE_IDLE:
		return "idle"
	case api.PeerState_SESSION_STATE_CONNECT:
		return "connect"
	case api.PeerState_SESSION_STATE_ACTIVE:
		return "active"
	case api.PeerState_SESSION_STATE_OPENSENT:
		return "opensent"
	case api.PeerState_SESSION_STATE_OPENCONFIRM:
		return "openconfirm"
	case api.PeerState_SESSION_STATE_ESTABLISHED:
		return "established"
	}
	return "unknown"
}

func bfdState(s api.BfdSessionState) string {
	switch s {
	case api.BfdSessionState_BFD_SESSION_STATE_UP:
		return "up"
	case api.BfdSessionState_BFD_SESSION_STATE_DOWN:
		return "down"
	case api.BfdSessionState_BFD_SESSION_STATE_INIT:
		return "init"
	case api.BfdSessionState_BFD_SESSION_STATE_ADMIN_DOWN:
		return "admin_down"
	}
	return "unknown"
}

// Announced returns the VIPs announced now, with when each was.
func (b *BGP) Announced() map[netip.Addr]time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[netip.Addr]time.Time, len(b.announced))
	for v, t := range b.announced {
		out[v] = t
	}
	return out
}

// Counters are the speaker's counters: sessions established now, session
// failures, VIPs announced and withdrawals.
func (b *BGP) Counters() map[string]map[string]uint64 {
	up := uint64(0)
	for _, s := range b.Sessions() {
		if s.State == "established" {
			up++
		}
	}
	b.mu.Lock()
	announced := uint64(len(b.announced))
	b.mu.Unlock()
	return map[string]map[string]uint64{"bgp": {
		"sessions_established": up, "session_failures": b.flaps.Load(),
		"announced": announced, "withdrawn": b.withdrawn.Load(),
	}}
}

// Close withdraws every announcement, closes the sessions (a Cease
// notification each, so the routers drop this node at once rather than
// after the hold time) and stops the speaker.
func (b *BGP) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	var errs []error
	if len(b.announced) > 0 {
		if err := b.s.DeletePath(apiutil.DeletePathRequest{DeleteAll: true}); err != nil {
			errs = append(errs, fmt.Errorf("bgp: withdraw: %w", err))
		}
		b.announced = map[netip.Addr]time.Time{}
	}
	b.mu.Unlock()
	b.cancel()
	b.s.Stop()
	return errors.Join(errs...)
}

// minLevel is a handler that passes records at its level or above.
type minLevel struct {
	slog.Handler
	min slog.Leveler
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min.Level() && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(a []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(a), h.min}
}
func (h minLevel) WithGroup(n string) slog.Handler { return minLevel{h.Handler.WithGroup(n), h.min} }
