package lab

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalnet/shoal/rules"
)

// upSecurityLab builds shoal and a 3-node lab, removed in t.Cleanup.
func upSecurityLab(t *testing.T) (*Lab, context.Context) {
	t.Helper()
	needRoot(t)
	if testing.Short() {
		t.Skip("builds shoal and a 3-node lab; skipped with -short")
	}
	bin := buildShoal(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	l, err := Up(ctx, Options{Nodes: 3, Binary: bin, Base: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Down(context.Background()); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	return l, ctx
}

// TestSecurityKeyRotationUnderLoad runs the documented rotation
// (docs/SECURITY.md) on every node of a 3-node lab by editing each
// node's config and `shoal key reload`, while the client opens a new
// connection per request to the VIP: no failed request, no view change;
// afterwards a peer holding only the old key is refused and one holding
// the new key is not.
func TestSecurityKeyRotationUnderLoad(t *testing.T) {
	l, ctx := upSecurityLab(t)
	before := settled(ctx, t, l)
	oldKey := l.KeyFile
	newKey := filepath.Join(l.Dir, "cluster-new.key")
	var k [32]byte
	rand.Read(k[:])
	if err := os.WriteFile(newKey, []byte(hex.EncodeToString(k[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	steps := []struct {
		name    string
		primary string
		accept  []string
	}{
		{"1: accept the new key", oldKey, []string{newKey}},
		{"2: sign with the new key", newKey, []string{oldKey}},
		{"3: drop the old key", newKey, nil},
	}
	stopWatch := watchHosts(ctx, t, l, l.Nodes, func(s []NodeStatus) string { return diffStatus(before, s) })
	rotated := make(chan error, 1)
	var rotationTook time.Duration
	res, err := l.Load(ctx, LoadArgs{Duration: 15 * time.Second, Concurrency: 4, Rate: 200, Timeout: 2 * time.Second, OnStart: func() {
		go func() {
			start := time.Now()
			time.Sleep(time.Second) // load before the first step
			for _, s := range steps {
				for i := range l.Nodes {
					if err := reloadWith(ctx, t, l, i, s.primary, s.accept); err != nil {
						rotated <- fmt.Errorf("step %s: %w", s.name, err)
						return
					}
				}
				time.Sleep(time.Second) // heartbeats and connections under this step
			}
			rotationTook = time.Since(start)
			rotated <- nil
		}()
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-rotated:
		if err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatal("the rotation outlasted the load")
	}
	changes := stopWatch()
	t.Logf("rotation took %v under load: %d requests, %d failures, %d view changes", rotationTook.Round(time.Millisecond), res.Requests, res.Failures, changes)
	if res.Failures != 0 || res.Requests == 0 {
		t.Errorf("load during the rotation: %d requests, %d failures %v %v", res.Requests, res.Failures, res.Errors, res.FailureList)
	}
	if changes != 0 {
		t.Errorf("%d status samples during the rotation differed from before it", changes)
	}
	if d := diffStatus(before, settled(ctx, t, l)); d != "" {
		t.Errorf("after the rotation: %s", d)
	}

	// The old key alone is refused by every node; the new one is not.
	for _, n := range l.Nodes {
		peer := netip.AddrPortFrom(n.Addr, PeerPort).String()
		if err := peerPlug(t, l, oldKey, peer); err == nil {
			t.Errorf("%s accepted a peer request under the old key after the rotation", n.Name)
		} else {
			t.Logf("%s refuses the old key: %v", n.Name, err)
		}
		if err := peerPlug(t, l, newKey, peer); err != nil {
			t.Errorf("%s refused a peer request under the new key: %v", n.Name, err)
		}
	}
}

// reloadWith rewrites node i's config with primary and accept as its
// keys, runs `shoal key reload` and waits until the agent logs that it
// reloaded (and not that it failed to).
func reloadWith(ctx context.Context, t *testing.T, l *Lab, i int, primary string, accept []string) error {
	n := l.Nodes[i]
	c := l.AgentConfig(i, 0)
	c.KeyFile, c.AcceptKeyFiles = primary, accept
	b, err := c.Marshal()
	if err != nil {
		return err
	}
	if err := os.WriteFile(n.Config, b, 0o600); err != nil {
		return err
	}
	log := filepath.Join(l.Dir, n.Name+".agent.log")
	done0, failed0 := countLines(log, "cluster keys reloaded"), countLines(log, "keeping the ones in use")
	if _, err := l.CLI(ctx, n.Name, "key", "reload"); err != nil {
		return fmt.Errorf("%s: shoal key reload: %w", n.Name, err)
	}
	return Poll(ctx, 5*time.Second, 20*time.Millisecond, func() error {
		if countLines(log, "keeping the ones in use") > failed0 {
			return fmt.Errorf("%s failed to reload its keys: %s", n.Name, tail(log, 400))
		}
		if countLines(log, "cluster keys reloaded") == done0 {
			return fmt.Errorf("%s has not logged a reload", n.Name)
		}
		return nil
	})
}

func countLines(path, substr string) int {
	b, _ := os.ReadFile(path)
	return bytes.Count(b, []byte(substr))
}

// peerPlug sends a harmless plug request (restore, which is a no-op on a
// plugged node) to peer from the client, under the key in keyFile.
func peerPlug(t *testing.T, l *Lab, keyFile, peer string) error {
	key, err := readHexKey(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := rules.NewCerts(rules.TLSOptions{Name: "drill", Keys: [][]byte{key}})
	if err != nil {
		t.Fatal(err)
	}
	c := rules.NewPeerClient(certs)
	c.Timeout = 3 * time.Second
	c.Transport.(*http.Transport).DialContext = nsDialer(t, l.Client.Namespace)
	defer c.CloseIdleConnections()
	resp, err := c.Post(rules.PeerURL(peer, "/v1/peer/plug"), "application/json", strings.NewReader(`{"pulled":false}`))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %s", resp.Status, msg)
	}
	return nil
}

func readHexKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return hex.DecodeString(strings.TrimSpace(string(b)))
}

// watchHosts samples hosts' status every 100 ms until stop, which returns
// how many samples differ says were wrong.
func watchHosts(ctx context.Context, t *testing.T, l *Lab, hosts []Host, differ func([]NodeStatus) string) (stop func() int64) {
	var changes atomic.Int64
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for wctx.Err() == nil {
			if st, err := l.Statuses(wctx, hosts); err == nil {
				if d := differ(st); d != "" {
					changes.Add(1)
					t.Logf("status differs: %s", d)
				}
			}
			select {
			case <-wctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() int64 { cancel(); <-done; return changes.Load() }
}
