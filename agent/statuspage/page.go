package statuspage

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
	"github.com/shoalnet/shoal/peer"
)

// The live status page: static HTML, CSS and JavaScript embedded in the
// binary (no build step, nothing fetched from elsewhere) that poll
// /status.json on the same address once a second.

//go:embed index.html app.js style.css
var statusAssets embed.FS

// StatusPage is what /status.json serves: the cluster as this node sees it,
// every node's counters as sampled from it, and the recent history.
type StatusPage struct {
	Time           time.Time          `json:"time"`
	Self           string             `json:"self"`
	Converged      bool               `json:"converged"`
	ConvergedSince time.Time          `json:"converged_since"` // when the current state (converged or not) began
	RulesIndex     uint64             `json:"rules_index"`
	Leader         string             `json:"leader"`
	VIPs           []string           `json:"vips"`
	Nodes          []PageNode         `json:"nodes"`
	Rules          []control.RuleInfo `json:"rules"`
	ViewChanges    []ViewChange       `json:"view_changes"` // newest first
	Failovers      []Failover         `json:"failovers"`    // newest first
	// BGP is this node's BGP sessions and announcements in routed mode.
	BGP *control.BGPInfo `json:"bgp,omitempty"`
	// Forwarding is this node's routed-mode forwarding, per peer.
	Forwarding *control.ForwardInfo `json:"forwarding,omitempty"`
}

// PageNode is one registered node: its place in the cluster and, when it
// answered, its own counters.
type PageNode struct {
	control.NodeInfo
	Sample      *NodeSample `json:"sample,omitempty"`
	SampleError string      `json:"sample_error,omitempty"`
}

// NodeSample is one node's counters at one moment; the page turns two
// samples into rates.
type NodeSample struct {
	At          time.Time `json:"at"`
	Admin       string    `json:"admin"`
	Converged   bool      `json:"converged"`
	Accepted    uint64    `json:"accepted"`    // VIP packets accepted, every rule
	Dropped     uint64    `json:"dropped"`     // VIP packets dropped, every rule and reason
	Connections int       `json:"connections"` // TCP connections held on the VIPs
	Draining    int       `json:"draining"`    // buckets held only for existing connections
}

// ViewChange is one change of this node's view, with the cause read from
// what the heartbeats said at that moment.
type ViewChange struct {
	At         time.Time `json:"at"`
	From       []string  `json:"from"`
	To         []string  `json:"to"`
	RulesIndex uint64    `json:"rules_index"`
	Cause      string    `json:"cause"`
	// Converged says whether every member came to advertise the view
	// before it was replaced, and ConvergedAfter how long that took.
	Converged      bool          `json:"converged"`
	ConvergedAfter time.Duration `json:"converged_after"`
}

// Failover is a node that went silent, and how long from its last heartbeat
// until this node had converged on a view without it: the time its share
// had no owner, as this node saw it. A drill that pulls a plug is one.
type Failover struct {
	Node     string        `json:"node"`
	LastSeen time.Time     `json:"last_seen"`
	Duration time.Duration `json:"duration"`
}

// sample is this node's NodeSample, served to the other nodes' pages.
func Sample(st control.Status, p control.Params, now time.Time) NodeSample {
	s := NodeSample{At: now, Admin: st.Admin, Converged: st.Converged, Connections: st.Connections}
	for _, pc := range p.Packets {
		s.Accepted += pc.Accepted
		for _, n := range pc.Dropped {
			s.Dropped += n
		}
	}
	for _, n := range st.Draining {
		s.Draining += n
	}
	return s
}

// Source is what the status page reads of the agent.
type Source interface {
	Status() control.Status
	Query() control.Query
	Params() control.Params
	History() HistorySnapshot
}

// PeerSampler fetches another node's sample through its peer API.
type PeerSampler func(ctx context.Context, apiAddr string) (NodeSample, error)

// PeerSamplerFor asks through hc, the peer API's mutual-TLS client.
func PeerSamplerFor(hc *http.Client) PeerSampler {
	return func(ctx context.Context, addr string) (NodeSample, error) {
		var s NodeSample
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, peer.URL(addr, "/v1/peer/sample"), nil)
		if err != nil {
			return s, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return s, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		if err != nil {
			return s, err
		}
		if resp.StatusCode != http.StatusOK {
			return s, fmt.Errorf("peer api: %s", resp.Status)
		}
		return s, json.Unmarshal(b, &s)
	}
}

// pageCacheTTL bounds how often the page's data is rebuilt however many
// browsers watch it: peers are asked at most this often.
const pageCacheTTL = 500 * time.Millisecond

// Handler serves the page at / and its data at /status.json.
// Nothing is computed while nobody watches.
func Handler(src Source, peers PeerSampler) http.Handler {
	var assets fs.FS = statusAssets
	c := &pageCache{src: src, peers: peers, now: time.Now}
	mux := http.NewServeMux()
	files := http.FileServerFS(assets)
	mux.Handle("GET /{$}", files)
	mux.Handle("GET /statuspage/", http.StripPrefix("/statuspage", files))
	mux.HandleFunc("GET /status.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		control.WriteJSON(w, http.StatusOK, c.get(r.Context()))
	})
	return mux
}

// pageCache builds the page's data at most once per pageCacheTTL.
type pageCache struct {
	src   Source
	peers PeerSampler
	now   func() time.Time

	mu    sync.Mutex // serializes builds: concurrent viewers share one
	built time.Time
	page  StatusPage
}

func (c *pageCache) get(ctx context.Context) StatusPage {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := c.now(); now.Sub(c.built) >= pageCacheTTL {
		c.page, c.built = buildPage(ctx, c.src, c.peers, now), now
	}
	return c.page
}

// peerSampleTimeout bounds the wait for a slow or dead peer.
const peerSampleTimeout = 400 * time.Millisecond

func buildPage(ctx context.Context, src Source, peers PeerSampler, now time.Time) StatusPage {
	q, st, h := src.Query(), src.Status(), src.History()
	page := StatusPage{Time: now, Self: q.Self, Converged: q.Converged, ConvergedSince: h.since,
		RulesIndex: q.RulesIndex, Leader: q.Leader, VIPs: q.VIPs, Rules: q.Rules,
		ViewChanges: h.views, Failovers: h.failovers, BGP: q.BGP, Forwarding: q.Forwarding}
	self := Sample(st, src.Params(), now)
	page.Nodes = make([]PageNode, len(q.Nodes))
	var wg sync.WaitGroup
	for i, n := range q.Nodes {
		page.Nodes[i].NodeInfo = n
		switch {
		case n.Name == q.Self:
			page.Nodes[i].Sample = &self
		case !n.Live:
			page.Nodes[i].SampleError = "not live"
		default:
			wg.Add(1)
			go func(pn *PageNode) {
				defer wg.Done()
				cctx, cancel := context.WithTimeout(ctx, peerSampleTimeout)
				defer cancel()
				s, err := peers(cctx, pn.APIAddr)
				if err != nil {
					pn.SampleError = err.Error()
					return
				}
				pn.Sample = &s
			}(&page.Nodes[i])
		}
	}
	wg.Wait()
	return page
}

// HistorySnapshot is an immutable copy of the history for readers.
type HistorySnapshot struct {
	since     time.Time
	views     []ViewChange
	failovers []Failover
}

// Bounds of the history the page shows.
const (
	maxViewChanges = 20
	maxFailovers   = 10
)

// History remembers the last view changes and failovers. The agent
// feeds it every heartbeat status it acts on; it keeps its own lock, so a
// reader never waits on the agent.
type History struct {
	self filter.NodeID

	mu        sync.Mutex
	name      func(filter.NodeID) string // valid during observe
	started   bool
	view      heartbeat.View
	converged bool
	since     time.Time
	peers     map[uint32]heartbeat.PeerStatus
	views     []ViewChange         // newest first
	failovers []Failover           // newest first
	pending   map[uint32]*Failover // silent nodes whose share has not been taken yet
	dead      map[uint32]bool      // nodes that left the view silent and have not come back
}

func NewHistory(self filter.NodeID) *History {
	return &History{self: self, peers: map[uint32]heartbeat.PeerStatus{}, pending: map[uint32]*Failover{}, dead: map[uint32]bool{}}
}

// ViewState is what the history needs of a heartbeat status.
type ViewState struct {
	View      heartbeat.View
	Converged bool
	Peers     []heartbeat.PeerStatus
}

// observe records what changed since the last status; name names a node.
// It returns the view change it recorded, if the view changed.
func (h *History) Observe(now time.Time, st ViewState, name func(filter.NodeID) string) (ViewChange, bool) {
	if h == nil {
		return ViewChange{}, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.name = name
	prevPeers := h.peers
	h.peers = make(map[uint32]heartbeat.PeerStatus, len(st.Peers))
	for _, p := range st.Peers {
		h.peers[p.ID] = p
	}
	if !h.started {
		h.started, h.view, h.converged, h.since = true, st.View, st.Converged, now
		return ViewChange{}, false
	}
	var vc ViewChange
	changed := !st.View.Equal(h.view)
	if changed {
		vc = ViewChange{At: now, From: h.names(h.view.Eligible), To: h.names(st.View.Eligible),
			RulesIndex: st.View.RulesIndex, Cause: h.cause(now, h.view, st.View, prevPeers)}
		h.views = slices.Insert(h.views, 0, vc)[:min(len(h.views)+1, maxViewChanges)]
		for _, id := range h.view.Eligible {
			if st.View.Has(id) || id == uint32(h.self) {
				continue
			}
			if p, ok := h.peers[id]; ok && !p.Live {
				h.pending[id] = &Failover{Node: h.name(filter.NodeID(id)), LastSeen: p.LastHeard}
				h.dead[id] = true
			}
		}
		for _, id := range st.View.Eligible {
			delete(h.dead, id) // back: the cause above said so
		}
		h.view = st.View
		h.converged = false
		h.since = now
	}
	if st.Converged && !h.converged {
		if len(h.views) > 0 && !h.views[0].Converged {
			h.views[0].Converged, h.views[0].ConvergedAfter = true, now.Sub(h.views[0].At)
		}
		for id, f := range h.pending {
			if !st.View.Has(id) {
				f.Duration = now.Sub(f.LastSeen)
				h.failovers = slices.Insert(h.failovers, 0, *f)[:min(len(h.failovers)+1, maxFailovers)]
			}
			delete(h.pending, id)
		}
	}
	if st.Converged != h.converged {
		h.converged, h.since = st.Converged, now
	}
	return vc, changed
}

func (h *History) names(ids []uint32) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = h.name(filter.NodeID(id))
	}
	return out
}

// cause explains a view change from what the peers' heartbeats said.
func (h *History) cause(now time.Time, from, to heartbeat.View, before map[uint32]heartbeat.PeerStatus) string {
	var causes []string
	for _, id := range from.Eligible {
		if to.Has(id) {
			continue
		}
		name := h.name(filter.NodeID(id))
		p, ok := h.peers[id]
		switch {
		case id == uint32(h.self):
			causes = append(causes, name+" (this node) left: stopped, draining, unhealthy or cut off")
		case !ok:
			causes = append(causes, name+" was removed")
		case !p.Live:
			causes = append(causes, fmt.Sprintf("%s dead: no heartbeat for %s", name, now.Sub(p.LastHeard).Round(time.Millisecond)))
		case p.Admin != heartbeat.Started:
			causes = append(causes, fmt.Sprintf("%s is %s", name, p.Admin))
		case !p.Healthy:
			causes = append(causes, name+" health check failed")
		case p.Lagging:
			causes = append(causes, name+" lags on the rules")
		default:
			causes = append(causes, name+" left")
		}
	}
	for _, id := range to.Eligible {
		if from.Has(id) {
			continue
		}
		name := h.name(filter.NodeID(id))
		if b, ok := before[id]; (ok && !b.Live) || h.dead[id] {
			causes = append(causes, name+" is back")
		} else {
			causes = append(causes, name+" joined")
		}
	}
	if from.RulesIndex != to.RulesIndex {
		causes = append(causes, fmt.Sprintf("rules changed (index %d -> %d)", from.RulesIndex, to.RulesIndex))
	}
	if from.Seed != to.Seed {
		causes = append(causes, "hash seed changed")
	}
	if len(causes) == 0 {
		return "view changed"
	}
	out := causes[0]
	for _, c := range causes[1:] {
		out += "; " + c
	}
	return out
}

func (h *History) Snapshot() HistorySnapshot {
	if h == nil {
		return HistorySnapshot{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return HistorySnapshot{since: h.since, views: slices.Clone(h.views), failovers: slices.Clone(h.failovers)}
}
