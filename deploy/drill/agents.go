package drill

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// agentAPI reads an agent's control API on its Unix socket. It decodes only
// the fields a drill needs, so the drill does not import the agent.
type agentAPI struct {
	socket string
	http   *http.Client
}

func newAgentAPI(socket string) *agentAPI {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	return &agentAPI{socket: socket, http: &http.Client{Transport: tr, Timeout: 2 * time.Second}}
}

func (a *agentAPI) get(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://shoal"+path, nil)
	if err != nil {
		return err
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return fmt.Errorf("agent on %s: %w", a.socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("agent on %s: GET %s: %s", a.socket, path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// params is the part of GET /v1/params a drill reads.
type params struct {
	Packets map[string]struct {
		Accepted uint64 `json:"accepted"`
	} `json:"packets"`
}

// accepted returns the packets the node's XDP program accepted, over all
// its rules.
func (a *agentAPI) accepted(ctx context.Context) (uint64, error) {
	var p params
	if err := a.get(ctx, "/v1/params", &p); err != nil {
		return 0, err
	}
	var n uint64
	for _, c := range p.Packets {
		n += c.Accepted
	}
	return n, nil
}

// query is the part of GET /v1/query a drill reads.
type query struct {
	Nodes []struct {
		ID       uint32 `json:"id"`
		Name     string `json:"name"`
		Eligible bool   `json:"eligible"`
	} `json:"nodes"`
	Settings struct {
		HeartbeatPeriod    string `json:"heartbeat_period"`
		HeartbeatTolerance int    `json:"heartbeat_tolerance"`
	} `json:"settings"`
}

func (a *agentAPI) query(ctx context.Context) (query, error) {
	var q query
	err := a.get(ctx, "/v1/query", &q)
	return q, err
}

// status is the part of GET /v1/status a drill reads.
type status struct {
	NodeID     uint32         `json:"node_id"`
	NodeName   string         `json:"node_name"`
	Admin      string         `json:"admin"`
	Converged  bool           `json:"converged"`
	RulesIndex uint64         `json:"rules_index"`
	Accepting  map[string]int `json:"accepting"`
	View       struct {
		Eligible []uint32 `json:"eligible"`
	} `json:"view"`
}

func (a *agentAPI) status(ctx context.Context) (status, error) {
	var s status
	err := a.get(ctx, "/v1/status", &s)
	return s, err
}

// sampler reads the agents' counters every interval until stopped.
type sampler struct {
	agents map[string]*agentAPI // by node name
	every  time.Duration

	mu      sync.Mutex
	samples []Sample
	stop    chan struct{}
	done    chan struct{}
}

func startSampler(ctx context.Context, agents map[string]*agentAPI, every time.Duration) *sampler {
	s := &sampler{agents: agents, every: every, stop: make(chan struct{}), done: make(chan struct{})}
	go s.run(ctx)
	return s
}

func (s *sampler) run(ctx context.Context) {
	defer close(s.done)
	tk := time.NewTicker(s.every)
	defer tk.Stop()
	for {
		s.take(ctx)
		select {
		case <-ctx.Done():
			return
		case <-s.stop:
			return
		case <-tk.C:
		}
	}
}

// take reads every agent at once; the sample's time is the middle of the
// reads.
func (s *sampler) take(ctx context.Context) {
	before := time.Now()
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		acc = map[string]uint64{}
	)
	for name, a := range s.agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(ctx, s.every)
			defer cancel()
			if n, err := a.accepted(rctx); err == nil {
				mu.Lock()
				acc[name] = n
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	at := before.Add(time.Since(before) / 2)
	s.mu.Lock()
	s.samples = append(s.samples, Sample{At: at, Accepted: acc})
	s.mu.Unlock()
}

// Stop ends sampling and returns the samples.
func (s *sampler) Stop() []Sample {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples
}

// post sends in as JSON to path; an error answer's body is returned as the
// error.
func (a *agentAPI) post(ctx context.Context, path string, in any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://shoal"+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	return doJSON(a.http, req, a.socket)
}

// doJSON runs req and turns a non-2xx answer into an error.
func doJSON(c *http.Client, req *http.Request, who string) error {
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", who, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s: %s %s: %s: %s", who, req.Method, req.URL.Path, resp.Status, bytes.TrimSpace(body))
	}
	return nil
}
