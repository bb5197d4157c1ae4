package control

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/peer"
)

// Flow explains where one flow goes, as `shoal query --flow` prints it.
type Flow struct {
	Client   string        `json:"client"`
	To       string        `json:"to"`
	Proto    string        `json:"proto"`
	Rule     filter.RuleID `json:"rule"`      // 0: no port rule covers it, the default host takes it
	RuleDesc string        `json:"rule_desc"` // the rule as `shoal rules` shows it
	Affinity string        `json:"affinity"`
	Key      string        `json:"key"`  // what the affinity hashes: client ip:port, ip, or /24
	Hash     uint32        `json:"hash"` // of the key, under the cluster's seed
	Bucket   uint16        `json:"bucket"`
	View     []string      `json:"view"` // the eligible nodes the owner was computed from
	// Converged says every member advertised that view: the owner takes
	// new connections only then (until then they wait, or the old owner
	// still has them).
	Converged bool              `json:"converged"`
	Owner     string            `json:"owner"`   // "" when nobody takes it
	IfDown    map[string]string `json:"if_down"` // the owner if that node failed
	Nodes     []FlowNode        `json:"nodes"`   // each node's own answer, now
}

// FlowNode is one node's state for a flow's bucket, as that node says.
type FlowNode struct {
	Name  string `json:"name"`
	State string `json:"state,omitempty"` // owned, owned_dirty, draining, not_owned
	// HoldsFlow: the node has this very TCP connection open.
	HoldsFlow bool `json:"holds_flow"`
	// BucketHeld: the node holds connections in the bucket (so it keeps
	// serving their packets even where it does not own it).
	BucketHeld bool `json:"bucket_held"`
	// Routed mode: where a packet of the flow that reaches this node and
	// that it does not take goes (a node's name; "" none), and why.
	ForwardsTo string `json:"forwards_to,omitempty"`
	Forwarding string `json:"forwarding,omitempty"`
	Error      string `json:"error,omitempty"` // the node did not answer
}

// ExplainFlow computes, from the rules and a view alone, which rule covers
// a flow, its key and bucket, its owner, and its owner if any one node of
// the view failed. Every node computes the same answer from the same state.
// owners is filter.Assign over c, or a cache of it.
func ExplainFlow(c *filter.Config, owners func([]filter.NodeID) *filter.Owners, view []filter.NodeID, name func(filter.NodeID) string, client, to netip.AddrPort, proto filter.Protocol) (Flow, error) {
	f := Flow{Client: client.String(), To: to.String(), Proto: proto.String(), IfDown: map[string]string{}}
	if proto != filter.ProtoTCP && proto != filter.ProtoUDP {
		return f, BadRequest("proto %s: want tcp or udp", proto)
	}
	cl := client.Addr().Unmap()
	if cl.Is4() != to.Addr().Is4() {
		return f, BadRequest("%s -> %s: the client and the VIP are of different families", client, to)
	}
	id, bucket, ok := c.Locate(to.Addr(), proto, cl, client.Port(), to.Port())
	if !ok {
		return f, BadRequest("%s is not a VIP of this cluster (VIPs: %v)", to.Addr(), c.VIPs)
	}
	aff := c.Affinity(id)
	k := filter.KeyOf(aff, cl, client.Port())
	f.Rule, f.Bucket, f.Hash, f.Affinity = id, bucket, k.Hash(c.Seed), aff.String()
	switch aff {
	case filter.AffinityNone:
		f.Key = netip.AddrPortFrom(cl, client.Port()).String()
	case filter.AffinityNetwork:
		bits := 24
		if cl.Is6() {
			bits = 64
		}
		f.Key = netip.PrefixFrom(cl, bits).Masked().String()
	default:
		f.Key = cl.String()
	}
	if r := c.Rule(id); r != nil {
		vip := "all"
		if r.VIP.IsValid() {
			vip = r.VIP.String()
		}
		ports := fmt.Sprint(r.PortLo)
		if r.PortHi != r.PortLo {
			ports += fmt.Sprintf("-%d", r.PortHi)
		}
		f.RuleDesc = fmt.Sprintf("%s:%s/%s, %s host, affinity %s, %s", vip, ports, r.Proto, r.Mode, r.Affinity, r.State)
	} else {
		f.RuleDesc = "no port rule covers it: the default host (lowest host priority) takes it"
	}
	owner := func(v []filter.NodeID) string {
		if n := owners(v).Rules[id][bucket]; n != filter.NoNode {
			return name(n)
		}
		return ""
	}
	for _, n := range view {
		f.View = append(f.View, name(n))
	}
	f.Owner = owner(view)
	for _, down := range view {
		f.IfDown[name(down)] = owner(slices.DeleteFunc(slices.Clone(view), func(n filter.NodeID) bool { return n == down }))
	}
	return f, nil
}

// OwnersCache remembers filter.Assign's answer per view for one config, so
// that explaining many flows costs one assignment per view (the current one
// and each with one node less), not one per flow.
type OwnersCache struct {
	mu     sync.Mutex
	cfg    *filter.Config
	byView map[string]*filter.Owners
}

// maxCachedViews bounds the cache; a config has its view and one per node
// less in use at a time.
const maxCachedViews = 70

// owners returns a function computing the owners under c, cached.
func (oc *OwnersCache) Owners(c *filter.Config) func([]filter.NodeID) *filter.Owners {
	return func(view []filter.NodeID) *filter.Owners {
		key := fmt.Sprint(view)
		oc.mu.Lock()
		defer oc.mu.Unlock()
		if oc.cfg != c || len(oc.byView) >= maxCachedViews {
			oc.cfg, oc.byView = c, map[string]*filter.Owners{}
		}
		o := oc.byView[key]
		if o == nil {
			o = filter.Assign(c, view)
			oc.byView[key] = o
		}
		return o
	}
}

// parseFlowTarget parses "VIP:PORT", "VIP:PORT/tcp" or "VIP:PORT/udp".
func parseFlowTarget(s string) (netip.AddrPort, filter.Protocol, error) {
	addr, proto, _ := strings.Cut(s, "/")
	to, err := netip.ParseAddrPort(addr)
	if err != nil {
		return to, 0, BadRequest("%q: want VIP:PORT[/tcp|/udp]: %v", s, err)
	}
	p, err := filter.ParseProtocol(OrDefault(proto, "tcp"))
	if err != nil || (p != filter.ProtoTCP && p != filter.ProtoUDP) {
		return to, 0, BadRequest("%q: the protocol is tcp or udp", s)
	}
	return to, p, nil
}

// flowQuery is the query string of a flow request, to this node or a peer.
func FlowQuery(client, to netip.AddrPort, proto filter.Protocol) string {
	return url.Values{"client": {client.String()}, "to": {to.String() + "/" + proto.String()}}.Encode()
}

// parseFlowQuery reads what flowQuery wrote.
func ParseFlowQuery(q url.Values) (client, to netip.AddrPort, proto filter.Protocol, err error) {
	client, err = netip.ParseAddrPort(q.Get("client"))
	if err != nil {
		return client, to, 0, BadRequest("client=%q: want IP:PORT: %v", q.Get("client"), err)
	}
	to, proto, err = parseFlowTarget(q.Get("to"))
	return client, to, proto, err
}

// flowPeer asks another node for its FlowNode.
// peerAskTimeout bounds each peer's answer.
const peerAskTimeout = 400 * time.Millisecond

type flowPeer func(ctx context.Context, apiAddr, query string) (FlowNode, error)

// FlowPeerFor asks through hc, the peer API's mutual-TLS client.
func FlowPeerFor(hc *http.Client) flowPeer {
	return func(ctx context.Context, addr, query string) (FlowNode, error) {
		var fn FlowNode
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, peer.URL(addr, "/v1/peer/flow?"+query), nil)
		if err != nil {
			return fn, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return fn, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		if err != nil {
			return fn, err
		}
		if resp.StatusCode != http.StatusOK {
			return fn, fmt.Errorf("peer api: %s: %s", resp.Status, strings.TrimSpace(string(b)))
		}
		return fn, json.Unmarshal(b, &fn)
	}
}

// AskFlowNodes fills f.Nodes: this node's answer, then every other live
// node's, asked in parallel.
func AskFlowNodes(ctx context.Context, f *Flow, q Query, here FlowNode, ask flowPeer, query string) {
	f.Nodes = make([]FlowNode, len(q.Nodes))
	var wg sync.WaitGroup
	for i, n := range q.Nodes {
		switch {
		case n.Name == q.Self:
			f.Nodes[i] = here
		case !n.Live:
			f.Nodes[i] = FlowNode{Name: n.Name, Error: "not live"}
		default:
			wg.Add(1)
			go func(i int, n NodeInfo) {
				defer wg.Done()
				cctx, cancel := context.WithTimeout(ctx, peerAskTimeout)
				defer cancel()
				fn, err := ask(cctx, n.APIAddr, query)
				if err != nil {
					fn = FlowNode{Error: err.Error()}
				}
				fn.Name = n.Name
				f.Nodes[i] = fn
			}(i, n)
		}
	}
	wg.Wait()
}
