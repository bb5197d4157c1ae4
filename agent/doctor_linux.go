package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/agent/doctor"
	"github.com/shoalnet/shoal/agent/node"
	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/peer"
	"github.com/shoalnet/shoal/rules"
)

// doctorPeerPath is the peer API's doctor endpoints.
const doctorPeerPath = "/v1/peer/doctor"

type probeRequest struct {
	Nonce uint64 `json:"nonce"`
}

type probeSeen struct {
	Seen bool `json:"seen"`
}

// doctorPeerHandlers serves the probe-frame endpoints and this node's
// report to members.
func (a *Agent) doctorPeerHandlers(mux *http.ServeMux) {
	ready := func(next http.Handler) http.Handler {
		return a.store.Authorize(rules.MembersOnly, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if a.running.Load() == nil || a.probe == nil {
				control.WriteJSON(w, http.StatusServiceUnavailable, control.APIError{Error: "the agent is starting"})
				return
			}
			next.ServeHTTP(w, r)
		}))
	}
	mux.Handle("POST "+doctorPeerPath+"/send", ready(control.Handle(func(ctx context.Context, r probeRequest) error {
		dst, err := doctor.ProbeDst(a.store.State())
		if err != nil {
			return err
		}
		return a.probe.Send(ctx, dst, r.Nonce)
	})))
	mux.Handle("GET "+doctorPeerPath+"/seen", ready(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseUint(r.URL.Query().Get("nonce"), 10, 64)
		if err != nil {
			control.WriteJSON(w, http.StatusBadRequest, control.APIError{Error: "nonce: want a number"})
			return
		}
		control.WriteJSON(w, http.StatusOK, probeSeen{Seen: a.probe.WaitSeen(r.Context(), n)})
	})))
	mux.Handle("GET "+doctorPeerPath, ready(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		control.WriteJSON(w, http.StatusOK, a.doctorNode(r.Context()))
	})))
}

// doctorClient is the doctor's peer client: mutual TLS, bounded.
func (a *Agent) doctorClient() *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: a.sec.certs.ClientConfig()}, Timeout: 15 * time.Second}
}

// peerJSON sends a request to a peer's API and decodes the answer into out
// (nil: none expected).
func peerJSON(ctx context.Context, cl *http.Client, method, api, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, peer.URL(api, path), body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := cl.Do(req)
	if err != nil {
		return fmt.Errorf("peer api %s: %w", api, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("peer api %s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// doctor runs the checks on this node, and with cluster on every
// registered peer too (over the peer API), this node's report first.
func (a *Agent) Doctor(ctx context.Context, cluster bool) []doctor.Report {
	out := []doctor.Report{a.doctorNode(ctx)}
	if !cluster {
		return out
	}
	st := a.store.State()
	cl := a.doctorClient()
	var peers []rules.Node
	for _, n := range st.Nodes {
		if n.ID != a.self {
			peers = append(peers, n)
		}
	}
	reps := make([]doctor.Report, len(peers))
	var wg sync.WaitGroup
	for i, n := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := peerJSON(ctx, cl, http.MethodGet, n.APIAddr, doctorPeerPath, nil, &reps[i]); err != nil {
				reps[i] = doctor.Report{Node: n.Name, Checks: []doctor.Check{{Name: "peer_api", Verdict: doctor.VerdictFail,
					Detail: fmt.Sprintf("this node's doctor did not answer: %v", err),
					Fix:    "check the node runs (shoal query) and that TCP peer_addr is open between the nodes"}}}
			}
		}()
	}
	wg.Wait()
	return append(out, reps...)
}

// doctorNode runs the checks of this node with the real probes.
func (a *Agent) doctorNode(ctx context.Context) doctor.Report {
	ms := a.node.Snap()
	st, hb := ms.Rules(), ms.Heartbeat()
	live := map[uint32][2]bool{}
	for _, p := range hb.Peers {
		live[p.ID] = [2]bool{p.Live, p.Hears}
	}
	env := doctor.Env{Node: a.cfg.NodeName, Interface: a.cfg.Interface, VIPs: st.VIPs, Mode: st.Settings.MACMode}
	for _, n := range st.Nodes {
		if n.ID == a.self {
			continue
		}
		lh := live[uint32(n.ID)]
		env.Peers = append(env.Peers, doctor.Peer{Name: n.Name, HeartbeatAddr: n.HeartbeatAddr, RaftAddr: n.RaftAddr, APIAddr: n.APIAddr, Live: lh[0], Hears: lh[1]})
	}
	xdpMode := ""
	if a.xdp != nil {
		if m := a.xdp.Mode(); m != "" && m != "none" {
			xdpMode = string(m)
		}
	}
	env.Kernel = func() []doctor.Feature { return doctor.KernelFeatures(xdpMode != "") }
	env.XDP = func() (string, string, string) {
		t, d := doctor.LinkDriver(a.cfg.Interface)
		return t, d, xdpMode
	}
	env.Sysctl = doctor.ReadSysctl
	env.Clock = doctor.ClockSynced
	env.Dial = func(ctx context.Context, addr string) error {
		d := net.Dialer{Timeout: time.Second}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
	cl := a.doctorClient()
	dst, dstErr := doctor.ProbeDst(st)
	env.FramesFrom = func(ctx context.Context, p doctor.Peer) error {
		if dstErr != nil {
			return dstErr
		}
		n := doctor.NewNonce()
		if err := peerJSON(ctx, cl, http.MethodPost, p.APIAddr, doctorPeerPath+"/send", probeRequest{n}, nil); err != nil {
			return err
		}
		if !a.probe.WaitSeen(ctx, n) {
			return fmt.Errorf("none arrived within %v", doctor.ProbeWait)
		}
		return nil
	}
	env.FramesTo = func(ctx context.Context, p doctor.Peer) error {
		if dstErr != nil {
			return dstErr
		}
		n := doctor.NewNonce()
		if err := a.probe.Send(ctx, dst, n); err != nil {
			return err
		}
		var seen probeSeen
		if err := peerJSON(ctx, cl, http.MethodGet, p.APIAddr, doctorPeerPath+"/seen?nonce="+strconv.FormatUint(n, 10), nil, &seen); err != nil {
			return err
		}
		if !seen.Seen {
			return fmt.Errorf("none arrived within %v", doctor.ProbeWait)
		}
		return nil
	}
	env.ARPAnswered = func() uint64 { return a.host.Counters()["arp"]["replied"] + a.host.Counters()["ndp"]["replied"] }
	if a.bgp != nil {
		env.BGP = func() []doctor.BGPSession {
			var out []doctor.BGPSession
			for _, s := range a.bgp.Sessions() {
				out = append(out, doctor.BGPSession{Neighbor: s.Neighbor.String(), State: s.State, BFD: s.BFD, LastError: s.LastError})
			}
			return out
		}
	}
	env.Forwarding = func() *doctor.Forwarding { return a.doctorForwarding() }
	return doctor.Run(ctx, env)
}

// doctorForwarding is the data plane's forwarding as the doctor checks it.
func (a *Agent) doctorForwarding() *doctor.Forwarding {
	t := a.node.Tables()
	if t == nil {
		return nil
	}
	f := &doctor.Forwarding{On: t.Forwarding()}
	if !f.On {
		return f
	}
	f.Self = t.Self.String()
	if fc, err := a.xdp.ForwardCounters(); err == nil {
		f.ClampError = fc.Clamp
	}
	live := map[filter.NodeID]bool{}
	for _, p := range a.node.Snap().Heartbeat().Peers {
		live[filter.NodeID(p.ID)] = p.Live
	}
	rs := a.node.Snap().Rules()
	for i, p := range t.Peers {
		if !p.IsValid() {
			continue
		}
		f.Peers++
		if t.PeerMACs[i] != ([6]byte{}) {
			continue
		}
		for _, n := range rs.Nodes {
			if node.NodeAddr(rs, n.ID) == p && live[n.ID] {
				f.NoMAC = append(f.NoMAC, n.Name)
			}
		}
	}
	return f
}
