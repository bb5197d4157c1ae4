package agent

import (
	"context"
	"net/http"
	"net/netip"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/agent/node"
	"github.com/shoalnet/shoal/agent/track"
	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/peer"
	"github.com/shoalnet/shoal/rules"
)

// flow explains a flow from this node's rules and view; with peers, every
// live node adds its own state for the flow's bucket.
func (a *Agent) Flow(ctx context.Context, client, to netip.AddrPort, proto filter.Protocol, peers bool) (control.Flow, error) {
	ms := a.node.Snap()
	fcfg, rs := ms.Filter(), ms.Rules()
	view, converged := node.NodeIDs(ms.Heartbeat().View.Eligible), ms.Heartbeat().Converged
	name := func(id filter.NodeID) string {
		if n := rs.Node(id); n != nil {
			return n.Name
		}
		return ""
	}
	f, err := control.ExplainFlow(fcfg, a.flowOwners.Owners(fcfg), view, name, client, to, proto)
	if err != nil {
		return f, err
	}
	f.Converged = converged
	here := a.flowHere(client, to, proto)
	if !peers {
		f.Nodes = []control.FlowNode{here}
		return f, nil
	}
	control.AskFlowNodes(ctx, &f, a.Query(), here, control.FlowPeerFor(peer.NewClient(a.sec.certs)), control.FlowQuery(client, to, proto))
	return f, nil
}

// flowHere is this node's own state for a flow: its bucket's state in the
// tables the data plane has, and, from a socket scan made for the question,
// whether the node holds connections in that bucket and this very one.
func (a *Agent) flowHere(client, to netip.AddrPort, proto filter.Protocol) control.FlowNode {
	ms, tables := a.node.Snap(), a.node.Tables()
	fn := control.FlowNode{Name: a.cfg.NodeName}
	id, bucket, ok := ms.Filter().Locate(to.Addr(), proto, client.Addr(), client.Port(), to.Port())
	if ok {
		fn.State = filter.NotOwned.String()
		if t := tables; t != nil && t.States[id] != nil {
			fn.State = t.States[id][bucket].String()
		}
	}
	fcfg, vips := ms.Filter(), ms.Rules().VIPs
	if !ok {
		fn.Error = "not a flow to a VIP of this node's rules"
		return fn
	}
	if tables != nil && tables.Forwarding() {
		fn.ForwardsTo, fn.Forwarding = forwardsTo(tables, ms.Rules(), id, bucket)
	}
	if proto != filter.ProtoTCP {
		return fn
	}
	conns, err := track.Scan(vips)
	if err != nil {
		fn.Error = "socket scan: " + err.Error()
		return fn
	}
	for _, c := range conns {
		if c.Client == client.Addr() && c.ClientPort == client.Port() && c.VIP == to.Addr() && c.VIPPort == to.Port() {
			fn.HoldsFlow = true
		}
		if cid, cb, ok := fcfg.Locate(c.VIP, filter.ProtoTCP, c.Client, c.ClientPort, c.VIPPort); ok && cid == id && cb == bucket {
			fn.BucketHeld = true
		}
	}
	return fn
}

// flowPeerHandler answers another node's flow question with this node's state.
func (a *Agent) flowPeerHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		client, to, proto, err := control.ParseFlowQuery(r.URL.Query())
		if err != nil {
			control.WriteError(w, err)
			return
		}
		control.WriteJSON(w, http.StatusOK, a.flowHere(client, to, proto))
	})
}

// forwardsTo says where routed mode's data plane sends a packet of bucket
// b of rule id that reaches this node (whichever node the router picked)
// and that it does not take, and why.
func forwardsTo(t *filter.Tables, rs *rules.State, id filter.RuleID, b uint16) (name, why string) {
	to := t.ForwardTarget(id, b)
	for _, n := range rs.Nodes {
		if to.IsValid() && node.NodeAddr(rs, n.ID) == to {
			name = n.Name
		}
	}
	var st filter.BucketState
	if s := t.States[id]; s != nil {
		st = s[b]
	}
	pending := t.HandTo[id] != nil && t.HandTo[id][b] == filter.HandPending
	switch {
	case st == filter.Owned:
		return "", "takes every packet: it owns the bucket"
	case to == (netip.Addr{}):
		return "", "drops what it does not take: no node to forward to"
	case st == filter.OwnedDirty:
		why = "takes SYNs and the connections it holds; forwards the rest to " + name + ", which holds connections in the bucket (second chance)"
	case pending:
		why = "acquiring the bucket: forwards what it does not hold to " + name + ", its owner until it lets go, which hands new SYNs back"
	case st == filter.Draining:
		why = "takes the connections it holds; forwards the rest to " + name + ", the bucket's owner"
	default:
		why = "forwards every packet to " + name + ", the bucket's owner"
	}
	return name, why
}
