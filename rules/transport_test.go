package rules

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func listenTestStream(t *testing.T, key []byte) *authStream {
	t.Helper()
	a, err := listenAuthStream("127.0.0.1:0", nil, key, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func TestAuthStream(t *testing.T) {
	server := listenTestStream(t, testKey)
	addr := raft.ServerAddress(server.Addr().String())

	t.Run("same key", func(t *testing.T) {
		client := listenTestStream(t, testKey)
		c, err := client.Dial(addr, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		accepted := make(chan net.Conn, 1)
		go func() {
			sc, err := server.Accept()
			if err == nil {
				accepted <- sc
			}
		}()
		if _, err := c.Write([]byte("append")); err != nil {
			t.Fatal(err)
		}
		select {
		case sc := <-accepted:
			defer sc.Close()
			got := make([]byte, 6)
			if _, err := io.ReadFull(sc, got); err != nil || string(got) != "append" {
				t.Errorf("server read %q, %v; want the bytes after the handshake", got, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("server never accepted an authenticated connection")
		}
	})

	t.Run("wrong key", func(t *testing.T) {
		client := listenTestStream(t, bytes.Repeat([]byte{9}, KeySize))
		if _, err := client.Dial(addr, time.Second); !errors.Is(err, ErrAuth) {
			t.Errorf("dial with the wrong key: err = %v, want ErrAuth", err)
		}
	})

	t.Run("garbage is dropped", func(t *testing.T) {
		c, err := net.Dial("tcp", string(addr))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("GET / HTTP/1.0\r\nHost: raft\r\n\r\n")) // longer than a hello
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(make([]byte, 64)); err == nil {
			t.Errorf("server answered %d bytes to a stranger", n)
		}
	})

	t.Run("unspecified bind needs advertise", func(t *testing.T) {
		if _, err := listenAuthStream("0.0.0.0:0", nil, testKey, slog.New(slog.DiscardHandler)); !errors.Is(err, ErrInvalid) {
			t.Errorf("bind 0.0.0.0 without advertise: err = %v, want ErrInvalid", err)
		}
	})
}

// TestClusterIgnoresRaftStranger checks a node with another key cannot
// reach the cluster's Raft port, and the cluster keeps working.
func TestClusterIgnoresRaftStranger(t *testing.T) {
	nodes := newCluster(t, 2)
	stranger := listenTestStream(t, bytes.Repeat([]byte{9}, KeySize))
	trans := raft.NewNetworkTransport(stranger, 1, time.Second, io.Discard)
	defer trans.Close()
	var resp raft.AppendEntriesResponse
	err := trans.AppendEntries("x", raft.ServerAddress(nodes[0].raftAddr), &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ID: []byte("x"), Addr: []byte(stranger.Addr().String())},
		Term:      1 << 40,
	}, &resp)
	if err == nil {
		t.Fatal("a stranger's AppendEntries went through")
	}
	mustApply(t, nodes[1], &PutVIP{VIP: vip1})
	waitConverged(t, nodes)
}
