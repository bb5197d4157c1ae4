package rules

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/peer"
)

// MaxVoters is how many nodes vote in Raft; further nodes join as
// non-voters, which replicate the rules but do not slow commits.
const MaxVoters = 5

// DefaultApplyTimeout bounds a write: past it, Apply gives up with
// ErrNoQuorum and the agent keeps the rules it has.
const DefaultApplyTimeout = 3 * time.Second

// Timing holds the Raft timeouts.
type Timing struct {
	HeartbeatTimeout   time.Duration // a follower without contact this long starts an election
	ElectionTimeout    time.Duration // a candidate without a win this long starts another
	LeaderLeaseTimeout time.Duration // a leader without quorum contact this long steps down
	CommitTimeout      time.Duration // the longest a follower waits to learn of a commit
	// SettledHeartbeatTimeout and SettledElectionTimeout replace the two
	// timeouts above once this node has a leader (it follows one or leads).
	// A leader sends each follower a heartbeat every tenth of its heartbeat
	// timeout, so the longer settled one costs an idle cluster fewer
	// round trips, while a new node still elects or finds its first leader
	// after the short one. Zero: keep the first ones. LeaderLeaseTimeout
	// must be at least half of SettledHeartbeatTimeout (2.5 of the longest
	// gaps between heartbeats, hashicorp/raft's default ratio).
	SettledHeartbeatTimeout time.Duration
	SettledElectionTimeout  time.Duration
}

// DefaultTiming is the production Raft timing. An idle leader sends each
// follower a heartbeat every tenth to fifth of its heartbeat timeout, and
// each one wakes both agents (a TLS round trip), so the timeouts are what
// an idle cluster pays for Raft (bench/idle.sh). A node starts with 2.5 s
// heartbeat and election timeouts and settles on 4 s ones once it has a
// leader: an idle leader then sends each follower 1.3-2.5 heartbeats a
// second. A crashed leader is replaced after 4-8 s: writes proposed
// meanwhile wait or fail, but the data plane never waits for Raft. The
// lease, 2 s, is 2.5 of the longest settled gaps between heartbeats
// (hashicorp/raft's ratio), so an idle leader does not step down between
// them; a leader cut off from its quorum steps down after it. A fresh
// bootstrap does not wait a heartbeat timeout for its first election (see
// bootstrap). The commit timeout is how often an idle leader sends each
// follower an empty AppendEntries besides the heartbeats: at 5 ms that was
// 130-200 TLS round trips a second per follower. Followers still learn of
// a commit at once: every write is followed by a barrier, whose
// replication carries the new commit index (see applyLocal).
func DefaultTiming() Timing {
	return Timing{
		HeartbeatTimeout:        2500 * time.Millisecond,
		ElectionTimeout:         2500 * time.Millisecond,
		LeaderLeaseTimeout:      2 * time.Second,
		CommitTimeout:           4 * time.Second,
		SettledHeartbeatTimeout: 4 * time.Second,
		SettledElectionTimeout:  4 * time.Second,
	}
}

// validate checks what hashicorp/raft does not: the settled timeouts.
func (t Timing) validate() error {
	if t.SettledHeartbeatTimeout == 0 && t.SettledElectionTimeout == 0 {
		return nil
	}
	if t.SettledHeartbeatTimeout < t.HeartbeatTimeout || t.SettledElectionTimeout < t.ElectionTimeout {
		return fmt.Errorf("%w: raft timing: settled timeouts (%v, %v) below the first ones (%v, %v)", ErrInvalid,
			t.SettledHeartbeatTimeout, t.SettledElectionTimeout, t.HeartbeatTimeout, t.ElectionTimeout)
	}
	if 2*t.LeaderLeaseTimeout < t.SettledHeartbeatTimeout {
		return fmt.Errorf("%w: raft timing: leader lease %v shorter than half the settled heartbeat timeout %v: an idle leader would step down between heartbeats",
			ErrInvalid, t.LeaderLeaseTimeout, t.SettledHeartbeatTimeout)
	}
	return nil
}

// StoreConfig configures a Store.
type StoreConfig struct {
	NodeName      string // unique in the cluster; the Raft server ID
	DataDir       string // holds raft.db (log and stable store) and snapshots
	RaftBind      string // host:port the Raft transport listens on
	RaftAdvertise string // host:port peers dial; empty: the bound address
	HeartbeatAddr string // registered for this node (bootstrap; default for Join)
	APIAddr       string // this node's peer API, where others forward to
	HostPriority  int    // registered at bootstrap; 0: the lowest free
	Zone          string // where the node is (NodeInfo.Zone); registered at bootstrap and join
	// TLS is the node's certificate and trusted CAs for Raft and the peer
	// API; nil: derived from Key (the 32-byte cluster key) for NodeName
	// and the node's addresses.
	TLS      *peer.Certs
	Key      []byte
	Refusals *peer.Refusals // counts what the Raft listener refuses; nil: not counted
	// Bootstrap makes a new one-node cluster when DataDir holds no Raft
	// state; with existing state the node restarts from it either way.
	Bootstrap    bool
	Timing       Timing        // zero: DefaultTiming
	Voters       VoterPolicy   // zero: DefaultVoterPolicy
	ApplyTimeout time.Duration // zero: DefaultApplyTimeout
	Logger       *slog.Logger  // nil: slog.Default()
	// Settings a bootstrapped cluster starts with; zero fields take
	// DefaultHeartbeatPeriod and DefaultHeartbeatTolerance.
	HeartbeatPeriod    time.Duration
	HeartbeatTolerance int
	// NoSync skips the fsync of each log write; only for benchmarks
	// comparing against it and tests, never in production.
	NoSync bool
}

// raftConfigHook lets tests change the raft config (snapshot thresholds).
var raftConfigHook func(*raft.Config)

// Store is one node's replica of the rules: a Raft node, its storage, and
// the client side of the peer API.
type Store struct {
	cfg    StoreConfig
	log    *slog.Logger
	fsm    *fsm
	raft   *raft.Raft
	trans  *raft.NetworkTransport
	bolt   *raftboltdb.BoltStore
	client *http.Client

	apFields
	votersChanged atomic.Uint64 // promotions and demotions made as leader

	readyTerm atomic.Uint64 // the term leaderReady last caught up in
	closing   atomic.Bool   // Close began: raft's complaints are expected

	subMu  sync.Mutex
	subs   map[int]chan struct{}
	nextID int

	closed    chan struct{}  // closed by Close
	bg        sync.WaitGroup // settle
	closeOnce sync.Once
	closeErr  error
}

// Open starts this node's Raft replica from cfg.DataDir: a fresh one-node
// cluster with cfg.Bootstrap and no existing state, otherwise whatever the
// directory holds (possibly nothing yet: then the node waits to be joined).
func Open(cfg StoreConfig) (*Store, error) {
	if cfg.NodeName == "" || cfg.DataDir == "" || cfg.RaftBind == "" {
		return nil, fmt.Errorf("%w: open rules store: node name, data dir and raft bind address are required", ErrInvalid)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Refusals == nil {
		cfg.Refusals = peer.NewRefusals(cfg.Logger)
	}
	if cfg.TLS == nil {
		certs, err := peer.NewCerts(peer.TLSOptions{Name: cfg.NodeName, Addrs: hostAddrs(cfg.RaftBind, cfg.RaftAdvertise, cfg.APIAddr), Keys: [][]byte{cfg.Key}})
		if err != nil {
			return nil, err
		}
		cfg.TLS = certs
	}
	if cfg.Timing == (Timing{}) {
		cfg.Timing = DefaultTiming()
	}
	if err := cfg.Timing.validate(); err != nil {
		return nil, err
	}
	if cfg.ApplyTimeout == 0 {
		cfg.ApplyTimeout = DefaultApplyTimeout
	}
	if cfg.Voters == (VoterPolicy{}) {
		cfg.Voters = DefaultVoterPolicy()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Store{cfg: cfg, log: cfg.Logger, client: peer.NewClient(cfg.TLS), subs: map[int]chan struct{}{}, closed: make(chan struct{})}
	s.fsm = newFSM(s.broadcast)
	s.fsm.onHalt = func(h Halt) {
		s.log.Error("rules application stopped: an entry of the raft log cannot be applied by this shoal; the data plane keeps the last rules it applied",
			"index", h.Index, "reason", h.Reason, "fix", "upgrade this node to a shoal that knows the entry; it resumes from that index on start")
	}
	if err := s.open(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Store) open() error {
	cfg := &s.cfg
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("open rules store: %w", err)
	}
	hl := newHCLogger(s.log, &s.closing)
	bolt, err := raftboltdb.New(raftboltdb.Options{
		Path:        filepath.Join(cfg.DataDir, "raft.db"),
		BoltOptions: &bbolt.Options{Timeout: time.Second},
		NoSync:      cfg.NoSync,
	})
	if err != nil {
		return fmt.Errorf("open raft log %s: %w (is another agent using this data dir?)", cfg.DataDir, err)
	}
	s.bolt = bolt
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, 2, hl)
	if err != nil {
		return fmt.Errorf("open raft snapshots: %w", err)
	}
	var adv net.Addr
	if cfg.RaftAdvertise != "" {
		a, err := net.ResolveTCPAddr("tcp", cfg.RaftAdvertise)
		if err != nil {
			return fmt.Errorf("raft advertise address %q: %w", cfg.RaftAdvertise, err)
		}
		adv = a
	}
	stream, err := listenTLSStream(streamConfig{
		bind: cfg.RaftBind, advertise: adv, certs: cfg.TLS,
		admitAddr: s.admitAddr, admitName: s.admitName, refusals: cfg.Refusals, log: s.log,
	})
	if err != nil {
		return fmt.Errorf("raft transport on %s: %w", cfg.RaftBind, err)
	}
	trans := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  stream,
		MaxPool: 3,
		Timeout: 5 * time.Second,
		Logger:  hl,
	})
	s.trans = trans

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeName)
	rc.HeartbeatTimeout = cfg.Timing.HeartbeatTimeout
	rc.ElectionTimeout = cfg.Timing.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.Timing.LeaderLeaseTimeout
	rc.CommitTimeout = cfg.Timing.CommitTimeout
	rc.Logger = hl
	if raftConfigHook != nil {
		raftConfigHook(rc)
	}
	if err := raft.ValidateConfig(rc); err != nil {
		return fmt.Errorf("raft config: %w", err)
	}
	existing, err := raft.HasExistingState(bolt, bolt, snaps)
	if err != nil {
		return fmt.Errorf("read raft state: %w", err)
	}
	r, err := raft.NewRaft(rc, s.fsm, bolt, bolt, snaps, trans)
	if err != nil {
		return fmt.Errorf("start raft: %w", err)
	}
	s.raft = r
	s.bg.Add(1)
	go s.runAutopilot()
	if cfg.Timing.SettledHeartbeatTimeout != 0 {
		s.bg.Add(1)
		go s.settle()
	}
	switch {
	case !cfg.Bootstrap:
		return nil
	case existing:
		// An earlier bootstrap may have stopped between making the cluster
		// and initialising it; finish that once this node leads.
		go s.finishBootstrap()
		return nil
	}
	return s.bootstrap()
}

// settle switches Raft to the settled timeouts once this node has a
// leader, or returns when the store closes first. It learns of the leader
// from Raft's observations, without polling.
func (s *Store) settle() {
	defer s.bg.Done()
	seen := make(chan raft.Observation, 1)
	obs := raft.NewObserver(seen, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	s.raft.RegisterObserver(obs)
	defer s.raft.DeregisterObserver(obs)
	for {
		if addr, _ := s.raft.LeaderWithID(); addr != "" {
			break
		}
		select {
		case <-s.closed:
			return
		case <-seen:
		}
	}
	t := s.cfg.Timing
	rc := s.raft.ReloadableConfig()
	rc.HeartbeatTimeout, rc.ElectionTimeout = t.SettledHeartbeatTimeout, t.SettledElectionTimeout
	if err := s.raft.ReloadConfig(rc); err != nil {
		s.log.Warn("raft: keeping the first timeouts", "err", err)
		return
	}
	s.log.Debug("raft: settled timeouts", "heartbeat_timeout", t.SettledHeartbeatTimeout, "election_timeout", t.SettledElectionTimeout)
}

// finishBootstrap initialises the cluster and registers this node if a
// bootstrap was cut short, when this node leads a cluster of itself alone.
// It gives up after a minute or when the store closes.
func (s *Store) finishBootstrap() {
	deadline := time.After(time.Minute)
	for {
		select {
		case <-s.closed:
			return
		case <-deadline:
			return
		case <-time.After(100 * time.Millisecond):
		}
		st := s.fsm.current()
		if st.Settings.ClusterID != 0 && st.NodeByName(s.cfg.NodeName) != nil {
			return
		}
		if !s.IsLeader() {
			continue
		}
		members, err := s.Members()
		if err != nil || len(members) != 1 {
			return // others joined, so the bootstrap had finished
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ApplyTimeout)
		err = s.initAndRegister(ctx)
		cancel()
		if err == nil {
			return
		}
		s.log.Warn("finish interrupted bootstrap", "err", err)
	}
}

// bootstrap makes a one-node cluster, then initialises it with random ids
// and registers this node.
func (s *Store) bootstrap() error {
	self := raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(s.cfg.NodeName), Address: s.trans.LocalAddr()}
	if err := s.raft.BootstrapCluster(raft.Configuration{Servers: []raft.Server{self}}).Error(); err != nil {
		return fmt.Errorf("bootstrap raft: %w", err)
	}
	// A one-node cluster elects itself after a heartbeat timeout. A shorter
	// timeout (the lease: hashicorp/raft accepts none below it) makes Raft
	// check a follower's contact at once, and a node that never heard a
	// leader stands for election then: a new cluster needs no wait.
	if t := s.cfg.Timing; t.LeaderLeaseTimeout < t.HeartbeatTimeout {
		rc := s.raft.ReloadableConfig()
		rc.HeartbeatTimeout = t.LeaderLeaseTimeout
		if err := s.raft.ReloadConfig(rc); err != nil {
			s.log.Warn("raft: first election after the heartbeat timeout", "err", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*s.cfg.Timing.ElectionTimeout+2*s.cfg.ApplyTimeout)
	defer cancel()
	// Wait for the election here so that a slow one does not eat the
	// writes' own timeout.
	for !s.IsLeader() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("bootstrap: this node did not become leader of its own cluster: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return s.initAndRegister(ctx)
}

// initAndRegister proposes the cluster's random ids and registers this
// node, each unless already done.
func (s *Store) initAndRegister(ctx context.Context) error {
	if err := s.leaderReady(ctx); err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	if s.fsm.current().Settings.ClusterID != 0 {
		return s.registerSelf(ctx)
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	clusterID := binary.BigEndian.Uint32(b[:4]) | 1 // never 0
	init := &InitCluster{Settings: Settings{
		ClusterID:          clusterID,
		HashSeed:           binary.BigEndian.Uint32(b[4:]),
		HeartbeatPeriod:    cmp.Or(s.cfg.HeartbeatPeriod, DefaultHeartbeatPeriod),
		HeartbeatTolerance: cmp.Or(s.cfg.HeartbeatTolerance, DefaultHeartbeatTolerance),
	}}
	if _, err := s.Apply(ctx, init); err != nil {
		return fmt.Errorf("bootstrap: initialise cluster: %w", err)
	}
	s.log.Info("bootstrapped rules cluster", "node", s.cfg.NodeName, "cluster_id", fmt.Sprintf("%08x", clusterID))
	return s.registerSelf(ctx)
}

func (s *Store) registerSelf(ctx context.Context) error {
	if s.fsm.current().NodeByName(s.cfg.NodeName) != nil {
		return nil
	}
	if _, err := s.Apply(ctx, &RegisterNode{Info: s.selfInfo(NodeInfo{})}); err != nil {
		return fmt.Errorf("bootstrap: register %s: %w", s.cfg.NodeName, err)
	}
	return nil
}

// selfInfo fills what me leaves blank from the store's config.
func (s *Store) selfInfo(me NodeInfo) NodeInfo {
	if me.Name == "" {
		me.Name = s.cfg.NodeName
	}
	if me.HostPriority == 0 {
		me.HostPriority = s.cfg.HostPriority
	}
	if me.HeartbeatAddr == "" {
		me.HeartbeatAddr = s.cfg.HeartbeatAddr
	}
	if me.RaftAddr == "" {
		me.RaftAddr = string(s.trans.LocalAddr())
	}
	if me.APIAddr == "" {
		me.APIAddr = s.cfg.APIAddr
	}
	if me.Zone == "" {
		me.Zone = s.cfg.Zone
	}
	if CommandLevel > 1 {
		me.CommandLevel = CommandLevel
	}
	return me
}

// RaftAddr returns the address peers reach this node's Raft transport at.
func (s *Store) RaftAddr() string { return string(s.trans.LocalAddr()) }

// State returns a copy of the local replica's state. It never waits for
// Raft; Index says how recent it is.
func (s *Store) State() *State { return s.fsm.current().Clone() }

// Leader returns the name of the current Raft leader, if one is known.
func (s *Store) Leader() (name string, ok bool) {
	_, id := s.raft.LeaderWithID()
	return string(id), id != ""
}

// IsLeader reports whether this node is the Raft leader.
func (s *Store) IsLeader() bool { return s.raft.State() == raft.Leader }

// Member is a server in the Raft configuration.
type Member struct {
	Name     string
	RaftAddr string
	Voter    bool
}

// Members returns the Raft configuration as this node knows it.
func (s *Store) Members() ([]Member, error) {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("raft configuration: %w", err)
	}
	var ms []Member
	for _, srv := range f.Configuration().Servers {
		ms = append(ms, Member{Name: string(srv.ID), RaftAddr: string(srv.Address), Voter: srv.Suffrage == raft.Voter})
	}
	return ms, nil
}

// Subscribe returns a channel that receives a value after each change the
// local replica applies (commands and snapshot restores), and a function to
// stop. Notifications coalesce: a slow reader sees one, then reads State.
func (s *Store) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	s.subMu.Lock()
	id := s.nextID
	s.nextID++
	s.subs[id] = ch
	s.subMu.Unlock()
	return ch, func() {
		s.subMu.Lock()
		delete(s.subs, id)
		s.subMu.Unlock()
	}
}

func (s *Store) broadcast() {
	s.subMu.Lock()
	defer s.subMu.Unlock()
	for _, ch := range s.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// WaitIndex waits until the local replica has applied index idx.
func (s *Store) WaitIndex(ctx context.Context, idx uint64) error {
	ch, stop := s.Subscribe()
	defer stop()
	for s.fsm.current().Index < idx {
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("wait for rules index %d (have %d): %w", idx, s.fsm.current().Index, ctx.Err())
		}
	}
	return nil
}

// Apply commits cmd through Raft from any node: on the leader it is applied
// here, elsewhere it is forwarded to the leader's peer API. The leader checks
// the command against its up-to-date state before proposing it, so a bad
// command never reaches the log; this node's own check of its local state
// (which may lag) stands in when no leader can be reached. Every attempt
// carries one request id, so a retry after a leader change or a lost reply
// gets the first attempt's result and never applies the command twice.
// Apply returns when the leader has
// applied the command and, on a follower, when this node has too (or the
// timeout passed). Business errors wrap ErrInvalid, ErrConflict,
// ErrUnknownNode, ErrUnknownRule or ErrUnknownVIP; a write that cannot commit
// within the apply timeout returns ErrNoQuorum, and the local rules stay as
// they were.
func (s *Store) Apply(ctx context.Context, cmd Command) (Result, error) {
	reqID := newRequestID()
	data, err := encodeEntry(cmd, reqID)
	if err != nil {
		return Result{}, err
	}
	// The local state may lag a change that was just committed, so its
	// verdict is not final: the leader checks again, up to date, and this
	// one only stands in when no leader answers.
	localErr := s.fsm.current().Check(cmd)
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ApplyTimeout)
	defer cancel()
	res, err := leaderDo(ctx, s,
		func(ctx context.Context) (Result, error) { return s.checkAndApply(ctx, cmd, reqID, data) },
		func(ctx context.Context, api string) (Result, error) {
			return s.forward(ctx, api, pathApply, data, true)
		})
	if err != nil {
		if localErr != nil && (errors.Is(err, ErrNoQuorum) || errors.Is(err, ErrNotMember)) {
			return res, localErr
		}
		return res, err
	}
	// Read your writes: the local state reflects the change when Apply
	// returns. The write has committed either way.
	if err := s.WaitIndex(ctx, res.Index); err != nil {
		s.log.Warn("rules write committed but not applied here yet", "index", res.Index, "err", err)
	}
	return res, nil
}

// leaderReady makes sure this leader's state holds every entry committed
// before its term, once per term. A newly elected leader has those entries in
// its log but applies them only after its first commit; validating against
// its state before that could reject a write that depends on them.
func (s *Store) leaderReady(ctx context.Context) error {
	term := s.raft.CurrentTerm()
	if s.readyTerm.Load() == term {
		return nil
	}
	if err := waitFuture(ctx, s.raft.Barrier(0)); err != nil {
		return err
	}
	s.readyTerm.Store(term)
	return nil
}

// newRequestID returns a random, non-zero request id.
func newRequestID() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:]) | 1
}

// checkAndApply validates cmd against the leader's state, then proposes it;
// a request that already committed gets its first result back instead.
func (s *Store) checkAndApply(ctx context.Context, cmd Command, reqID uint64, data []byte) (Result, error) {
	if err := s.leaderReady(ctx); err != nil {
		return Result{}, err
	}
	if ar, ok := s.fsm.lookup(reqID); ok {
		return ar.res, ar.err
	}
	if h, ok := s.fsm.halted(); ok {
		return Result{}, h.err()
	}
	st := s.fsm.current()
	if err := st.CheckSupported(cmd); err != nil {
		return Result{}, err
	}
	if err := st.Check(cmd); err != nil {
		return Result{}, err
	}
	return s.applyLocal(ctx, data)
}

// leaderDo runs local on the leader, or remote against the leader's peer
// API, retrying through elections and lost connections until ctx ends.
func leaderDo[T any](ctx context.Context, s *Store, local func(context.Context) (T, error), remote func(ctx context.Context, api string) (T, error)) (T, error) {
	var zero T
	backoff := 10 * time.Millisecond
	var last error
	for {
		if s.raft.State() == raft.Leader {
			v, err := local(ctx)
			if err != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
				return zero, s.noQuorum(err) // proposed, but no majority answered in time
			}
			if !errors.Is(err, errNotLeader) {
				return v, err
			}
			last = err
		} else if _, id := s.raft.LeaderWithID(); id != "" {
			if n := s.fsm.current().NodeByName(string(id)); n != nil && n.APIAddr != "" {
				v, err := remote(ctx, n.APIAddr)
				if err == nil || !retryable(err) {
					return v, err
				}
				last = err
			} else {
				last = fmt.Errorf("leader %s is not in the local registry yet", id)
			}
		} else {
			if !s.hasConfiguration() {
				return zero, fmt.Errorf("%w: %s has not joined a cluster; join one (shoal join) or bootstrap", ErrNotMember, s.cfg.NodeName)
			}
			last = errors.New("no leader known")
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return zero, ctx.Err()
			}
			return zero, s.noQuorum(last)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

// hasConfiguration reports whether this node knows any Raft configuration:
// false until it bootstraps or is joined.
func (s *Store) hasConfiguration() bool {
	f := s.raft.GetConfiguration()
	return f.Error() == nil && len(f.Configuration().Servers) > 0
}

// retryable reports whether a forwarded request may be sent again: the
// peer was not the leader or could not be reached. Business errors are not.
func retryable(err error) bool {
	var re *remoteError
	if errors.As(err, &re) {
		return errors.Is(err, errNotLeader)
	}
	return !errors.Is(err, ErrAuth) && !errors.Is(err, ErrInvalid)
}

// applyLocal proposes data on this node, which believes it leads, and waits
// for the FSM's result.
func (s *Store) applyLocal(ctx context.Context, data []byte) (Result, error) {
	f := s.raft.Apply(data, 0)
	if err := waitFuture(ctx, f); err != nil {
		return Result{}, err
	}
	// A follower learns that an entry is committed from the next
	// AppendEntries, which an idle leader sends only every CommitTimeout.
	// Appending a barrier replicates at once, with the new commit index, so
	// every follower applies the write now. Nothing waits for the barrier.
	s.raft.Barrier(time.Second)
	ar, ok := f.Response().(applyResult)
	if !ok {
		return Result{}, fmt.Errorf("rules fsm returned %T", f.Response())
	}
	return ar.res, ar.err
}

// waitFuture waits for a raft future within ctx, mapping a lost leadership
// to errNotLeader so the caller retries with the new leader.
func waitFuture(ctx context.Context, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		switch {
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
			errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrAbortedByRestore):
			return fmt.Errorf("%w: %w", errNotLeader, err)
		case err != nil:
			return fmt.Errorf("raft: %w", err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// noQuorum builds the error for a write that could not commit: how many
// voters answer, and which do not.
func (s *Store) noQuorum(cause error) error {
	members, err := s.Members()
	if err != nil || len(members) == 0 {
		return fmt.Errorf("%w: this node knows no cluster (%v); join one or bootstrap", ErrNotMember, cause)
	}
	st := s.fsm.current()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	type probe struct {
		name string
		ok   bool
	}
	var voters []string
	results := make(chan probe)
	for _, m := range members {
		if !m.Voter {
			continue
		}
		voters = append(voters, m.Name)
		go func() {
			if m.Name == s.cfg.NodeName {
				results <- probe{m.Name, true}
				return
			}
			n := st.NodeByName(m.Name)
			results <- probe{m.Name, n != nil && s.ping(ctx, n.APIAddr) == nil}
		}()
	}
	var down []string
	for range voters {
		if p := <-results; !p.ok {
			down = append(down, p.name)
		}
	}
	slices.Sort(down)
	return fmt.Errorf("%w: %d of %d voters reachable (unreachable: %s), a write needs %d; the change was not committed within %v (last error: %v); this node keeps filtering with the rules of index %d; bring the unreachable voters back",
		ErrNoQuorum, len(voters)-len(down), len(voters), strings.Join(down, ", "), len(voters)/2+1, s.cfg.ApplyTimeout, cause, st.Index)
}

// Join asks the cluster member whose peer API is at member to add this
// node: the leader registers it (assigning its id) and adds it to Raft as a
// voter while there are fewer than MaxVoters, else as a non-voter. Fields of
// me left blank come from the store's config. This store must be open
// without Bootstrap and must not be part of another cluster.
func (s *Store) Join(ctx context.Context, member string, me NodeInfo) (filter.NodeID, error) {
	me = s.selfInfo(me)
	if me.Name != s.cfg.NodeName {
		return 0, fmt.Errorf("%w: join as %q, but this store's raft id is %q", ErrInvalid, me.Name, s.cfg.NodeName)
	}
	if err := me.check(); err != nil {
		return 0, err
	}
	body, err := jsonBody(me)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*s.cfg.ApplyTimeout)
	defer cancel()
	backoff := 50 * time.Millisecond
	for {
		res, err := s.forward(ctx, member, pathJoin, body, false)
		if err == nil {
			// A restarting member is joined again. The leader's
			// replication to it may have failed (on the connections of its
			// previous process, most likely), and then waits for the next
			// write or the commit timeout (4-8 s: DefaultTiming) before it
			// tries again: rather than wait, join again, which writes
			// (docs/BENCHMARKS.md, "a restarted agent's Raft catch-up").
			wctx, wcancel := context.WithTimeout(ctx, rejoinAfter)
			werr := s.WaitIndex(wctx, res.Index)
			wcancel()
			if werr == nil {
				return res.NodeID, nil
			}
			if ctx.Err() != nil {
				return res.NodeID, fmt.Errorf("joined as node %d, but the rules did not replicate here: %w", res.NodeID, werr)
			}
			continue
		}
		if !retryable(err) {
			return 0, fmt.Errorf("join through %s: %w", member, err)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("join through %s: %w (last error: %v)", member, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// rejoinAfter is how long Join waits for its registration to replicate
// here before it joins again (see Join).
const rejoinAfter = 300 * time.Millisecond

// joinAsLeader registers info and adds it to the Raft configuration.
func (s *Store) joinAsLeader(ctx context.Context, info NodeInfo) (Result, error) {
	cmd := &RegisterNode{Info: info}
	data, err := EncodeCommand(cmd)
	if err != nil {
		return Result{}, err
	}
	res, err := s.checkAndApply(ctx, cmd, 0, data)
	if err != nil {
		return res, err
	}
	cf := s.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return Result{}, fmt.Errorf("%w: %w", errNotLeader, err)
	}
	voters := 0
	for _, srv := range cf.Configuration().Servers {
		if srv.ID == raft.ServerID(info.Name) {
			if srv.Address == raft.ServerAddress(info.RaftAddr) {
				return res, nil // a retried join that already took effect
			}
			continue
		}
		if srv.Suffrage == raft.Voter {
			voters++
		}
	}
	var f raft.IndexFuture
	if voters < MaxVoters {
		f = s.raft.AddVoter(raft.ServerID(info.Name), raft.ServerAddress(info.RaftAddr), 0, 0)
	} else {
		f = s.raft.AddNonvoter(raft.ServerID(info.Name), raft.ServerAddress(info.RaftAddr), 0, 0)
	}
	if err := waitFuture(ctx, f); err != nil {
		return Result{}, fmt.Errorf("add %s to raft: %w", info.Name, err)
	}
	s.log.Info("node joined", "node", info.Name, "id", res.NodeID, "voter", voters < MaxVoters)
	return res, nil
}

// Leave removes this node from the cluster gracefully: from Raft and from
// the registry, through the leader. Close the store afterwards, and clear
// the data dir before joining any cluster again.
func (s *Store) Leave(ctx context.Context) error {
	n := s.fsm.current().NodeByName(s.cfg.NodeName)
	if n == nil {
		return fmt.Errorf("%w: %s is not in the registry", ErrNotMember, s.cfg.NodeName)
	}
	return s.RemoveNode(ctx, n.ID)
}

// RemoveNode removes node id from Raft and from the registry, for a node
// that is dead or leaving. Any node may call it; it runs on the leader.
func (s *Store) RemoveNode(ctx context.Context, id filter.NodeID) error {
	reqID := newRequestID()
	body, err := jsonBody(removeRequest{ID: id, ReqID: reqID})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ApplyTimeout)
	defer cancel()
	_, err = leaderDo(ctx, s,
		func(ctx context.Context) (Result, error) { return s.removeAsLeader(ctx, id, reqID) },
		func(ctx context.Context, api string) (Result, error) {
			return s.forward(ctx, api, pathRemove, body, true)
		})
	return err
}

// removeAsLeader takes a node out of Raft and the registry. The order keeps
// a retry possible: the registry entry (which names the node) goes last,
// except when the leader removes itself, since it stops leading once it is
// out of Raft.
func (s *Store) removeAsLeader(ctx context.Context, id filter.NodeID, reqID uint64) (Result, error) {
	if err := s.leaderReady(ctx); err != nil {
		return Result{}, err
	}
	if ar, ok := s.fsm.lookup(reqID); ok {
		return ar.res, ar.err // a retry of a removal that went through
	}
	n := s.fsm.current().Node(id)
	if n == nil {
		return Result{}, unknownNode(id)
	}
	cf := s.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return Result{}, fmt.Errorf("%w: %w", errNotLeader, err)
	}
	inRaft, otherVoters := false, 0
	for _, srv := range cf.Configuration().Servers {
		if srv.ID == raft.ServerID(n.Name) {
			inRaft = true
		} else if srv.Suffrage == raft.Voter {
			otherVoters++
		}
	}
	if inRaft && otherVoters == 0 {
		return Result{}, fmt.Errorf("%w: node %d (%s) is the last voter; a cluster cannot remove its last voter, stop the agent instead", ErrConflict, id, n.Name)
	}
	data, err := encodeEntry(&RemoveNode{ID: id}, reqID)
	if err != nil {
		return Result{}, err
	}
	removeServer := func() error {
		if !inRaft {
			return nil
		}
		return waitFuture(ctx, s.raft.RemoveServer(raft.ServerID(n.Name), 0, 0))
	}
	if n.Name == s.cfg.NodeName {
		res, err := s.applyLocal(ctx, data)
		if err != nil {
			return res, err
		}
		return res, removeServer()
	}
	if err := removeServer(); err != nil {
		return Result{}, err
	}
	res, err := s.applyLocal(ctx, data)
	if err != nil {
		return res, err
	}
	return res, nil
}

// Close stops Raft and closes the transport and storage. The local state
// stays readable.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closing.Store(true)
		close(s.closed)
		s.bg.Wait()
		var errs []error
		if s.raft != nil {
			errs = append(errs, s.raft.Shutdown().Error())
		}
		if s.trans != nil {
			errs = append(errs, s.trans.Close())
		}
		if s.bolt != nil {
			errs = append(errs, s.bolt.Close())
		}
		s.client.CloseIdleConnections()
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// hostAddrs returns the IPs in a list of host:port addresses, each once.
func hostAddrs(addrs ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		ap, err := netip.ParseAddrPort(a)
		if err != nil || ap.Addr().IsUnspecified() || slices.Contains(out, ap.Addr()) {
			continue
		}
		out = append(out, ap.Addr())
	}
	return out
}

// knownPeers returns the names and IP addresses of the nodes this node
// knows, from its Raft configuration and its registry; ok is false while it
// knows no cluster at all (it waits to be joined).
func (s *Store) knownPeers() (names map[string]bool, ips map[netip.Addr]bool, ok bool) {
	names, ips = map[string]bool{}, map[netip.Addr]bool{}
	addIP := func(hostport string) {
		if ap, err := netip.ParseAddrPort(hostport); err == nil {
			ips[ap.Addr().Unmap()] = true
		}
	}
	if s.raft != nil {
		if f := s.raft.GetConfiguration(); f.Error() == nil {
			for _, srv := range f.Configuration().Servers {
				names[string(srv.ID)] = true
				addIP(string(srv.Address))
			}
		}
	}
	for _, n := range s.fsm.current().Nodes {
		names[n.Name] = true
		addIP(n.RaftAddr)
		addIP(n.APIAddr)
		addIP(n.HeartbeatAddr)
	}
	return names, ips, len(names) > 0
}

// admitAddr says whether a Raft or peer-API connection from ip may go on:
// only from known nodes' addresses, or anyone while this node knows no
// cluster.
func (s *Store) admitAddr(ip netip.Addr) bool {
	_, ips, ok := s.knownPeers()
	return !ok || ips[ip.Unmap()]
}

// admitName says whether a peer whose certificate names name may talk Raft
// with this node.
func (s *Store) admitName(name string) bool {
	names, _, ok := s.knownPeers()
	return !ok || names[name]
}

// TLS returns the certificates the store uses for Raft and the peer API.
func (s *Store) TLS() *peer.Certs { return s.cfg.TLS }

// Halted reports whether this replica stopped applying the log, at which
// index and why (see fsm.Apply). The agent shows it in status and metrics.
func (s *Store) Halted() (Halt, bool) { return s.fsm.halted() }

// ReportCommandLevel re-registers this node when the registry holds a lower
// command level than this build's (the node was upgraded), so new command
// types become usable once every node has been, or another zone than the
// configured one.
func (s *Store) ReportCommandLevel(ctx context.Context) error {
	n := s.fsm.current().NodeByName(s.cfg.NodeName)
	if n == nil || n.level() >= CommandLevel && n.Zone == s.cfg.Zone {
		return nil
	}
	info := n.NodeInfo
	info.CommandLevel, info.Zone = CommandLevel, s.cfg.Zone
	_, err := s.Apply(ctx, &RegisterNode{Info: info})
	return err
}
