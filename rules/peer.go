package rules

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/peer"
)

// PeerPathPrefix is where the agent mounts PeerHandler on its peer listener.
const PeerPathPrefix = "/v1/rules/"

// Peer API paths.
const (
	pathApply  = PeerPathPrefix + "apply"  // POST an encoded command; leader only
	pathJoin   = PeerPathPrefix + "join"   // POST a NodeInfo; any member
	pathRemove = PeerPathPrefix + "remove" // POST a removeRequest; leader only
	pathPing   = PeerPathPrefix + "ping"   // GET: is this node's API up
	pathState  = PeerPathPrefix + "state"  // GET: this node's State as JSON
)

// headerForwarded marks a request a member forwarded to the leader, which
// must not forward it again (a stale leader view could loop).
const headerForwarded = "X-Shoal-Forwarded"

// peerReply is the body of every peer API answer.
type peerReply struct {
	Result Result `json:",omitzero"`
	Code   string `json:",omitempty"` // the sentinel of a business error
	Error  string `json:",omitempty"`
}

type removeRequest struct {
	ID    filter.NodeID
	ReqID uint64 // kept through retries, as for writes
}

type pingReply struct {
	Name   string
	Index  uint64
	Leader bool
}

// PeerHandler returns the peer API. Mount it on the agent's peer listener
// (PeerListener) at PeerPathPrefix. Joins come from nodes not registered
// yet, so any certificate of the cluster may ask for one; everything else
// is for members only (see Authorize).
func (s *Store) PeerHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST "+pathApply, s.Authorize(MembersOnly, http.HandlerFunc(s.handleApply)))
	mux.Handle("POST "+pathJoin, s.Authorize(AnyCertified, http.HandlerFunc(s.handleJoin)))
	mux.Handle("POST "+pathRemove, s.Authorize(MembersOnly, http.HandlerFunc(s.handleRemove)))
	mux.Handle("GET "+pathPing, s.Authorize(MembersOnly, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, pingReply{Name: s.cfg.NodeName, Index: s.fsm.current().Index, Leader: s.IsLeader()})
	})))
	mux.Handle("GET "+pathState, s.Authorize(MembersOnly, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.fsm.current())
	})))
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeReply(w http.ResponseWriter, res Result, err error) {
	rep := peerReply{Result: res}
	if err != nil {
		rep = peerReply{Code: errorCode(err), Error: err.Error()}
	}
	writeJSON(w, http.StatusOK, rep)
}

func (s *Store) leaderCtx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), s.cfg.ApplyTimeout)
}

func (s *Store) handleApply(w http.ResponseWriter, r *http.Request) {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	cmd, reqID, err := decodeEntry(data)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest) // never let a bad entry into the log
		return
	}
	if !s.IsLeader() {
		writeReply(w, Result{}, errNotLeader)
		return
	}
	ctx, cancel := s.leaderCtx(r)
	defer cancel()
	res, err := s.checkAndApply(ctx, cmd, reqID, data)
	writeReply(w, res, err)
}

func (s *Store) handleJoin(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var info NodeInfo
	if err == nil {
		err = json.Unmarshal(body, &info)
	}
	if err == nil {
		err = info.check()
	}
	if err != nil {
		http.Error(w, "join: "+err.Error(), http.StatusBadRequest)
		return
	}
	if reason, err := s.checkJoiner(r, info); err != nil {
		s.cfg.Refusals.Refuse("peer", reason, remoteAddr(r), err)
		http.Error(w, "forbidden: join: "+err.Error(), http.StatusForbidden)
		return
	}
	ctx, cancel := s.leaderCtx(r)
	defer cancel()
	if r.Header.Get(headerForwarded) != "" {
		if !s.IsLeader() {
			writeReply(w, Result{}, errNotLeader)
			return
		}
		res, err := s.joinAsLeader(ctx, info)
		writeReply(w, res, err)
		return
	}
	res, err := leaderDo(ctx, s,
		func(ctx context.Context) (Result, error) { return s.joinAsLeader(ctx, info) },
		func(ctx context.Context, api string) (Result, error) {
			return s.forward(ctx, api, pathJoin, body, true)
		})
	writeReply(w, res, err)
}

// checkJoiner checks who asks for a join. A member forwarding one to the
// leader must be a member, as for any forwarded request. With an operator
// CA a node joins only as itself: its certificate must carry the name it
// joins under. (With a derived CA any key holder can mint any name, so the
// check would prove nothing.)
func (s *Store) checkJoiner(r *http.Request, info NodeInfo) (reason string, err error) {
	if r.Header.Get(headerForwarded) != "" {
		return s.authorize(MembersOnly, r)
	}
	if name := peer.Name(r.TLS); s.cfg.TLS.Operator() && name != info.Name {
		return peer.RefuseImpersonate, fmt.Errorf("the certificate is for %q, not for %q", name, info.Name)
	}
	return "", nil
}

func (s *Store) handleRemove(w http.ResponseWriter, r *http.Request) {
	var req removeRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, "remove: "+err.Error(), http.StatusBadRequest)
		return
	}
	if !s.IsLeader() {
		writeReply(w, Result{}, errNotLeader)
		return
	}
	ctx, cancel := s.leaderCtx(r)
	defer cancel()
	res, err := s.removeAsLeader(ctx, req.ID, req.ReqID)
	writeReply(w, res, err)
}

func jsonBody(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode peer request: %w", err)
	}
	return b, nil
}

// forward posts body to path on the peer API at api and decodes the reply.
// A member passing a join on to the leader sets forwarded.
func (s *Store) forward(ctx context.Context, api, path string, body []byte, forwarded bool) (Result, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, peer.URL(api, path), bytes.NewReader(body))
	if err != nil {
		return Result{}, fmt.Errorf("%w: peer request to %s: %w", ErrInvalid, api, err)
	}
	if forwarded {
		req.Header.Set(headerForwarded, s.cfg.NodeName)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return Result{}, fmt.Errorf("peer %s: %w", api, peer.AuthError(err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxPeerReply))
	if err != nil {
		return Result{}, fmt.Errorf("peer %s: %w", api, err)
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized, resp.StatusCode == http.StatusForbidden:
		return Result{}, fmt.Errorf("%w by %s: %s", ErrAuth, api, bytes.TrimSpace(b))
	case resp.StatusCode == http.StatusBadRequest:
		return Result{}, fmt.Errorf("%w: peer %s: %s", ErrInvalid, api, bytes.TrimSpace(b))
	case resp.StatusCode != http.StatusOK:
		return Result{}, fmt.Errorf("peer %s: %s: %s", api, resp.Status, bytes.TrimSpace(b))
	}
	var rep peerReply
	if err := json.Unmarshal(b, &rep); err != nil {
		return Result{}, fmt.Errorf("peer %s: bad reply: %w", api, err)
	}
	if err := decodeError(rep.Code, rep.Error); err != nil {
		return Result{}, err
	}
	return rep.Result, nil
}

// ping checks that the peer API at api answers, authenticated.
func (s *Store) ping(ctx context.Context, api string) error {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, peer.URL(api, pathPing), nil)
	if err != nil {
		return err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("ping %s: %s", api, resp.Status)
	}
	return nil
}
