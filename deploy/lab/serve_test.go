package lab

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestHandler(t *testing.T) {
	srv := httptest.NewServer(Handler("node7"))
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/any/path")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "node7\n" || resp.Header.Get(NodeHeader) != "node7" {
		t.Errorf("status %d body %q header %q", resp.StatusCode, body, resp.Header.Get(NodeHeader))
	}
}

func TestServeKeepAliveAndShutdown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, "node1", []string{addr}, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	var conns int
	tr := &http.Transport{DialContext: func(ctx context.Context, n, a string) (net.Conn, error) {
		conns++
		var d net.Dialer
		return d.DialContext(ctx, n, a)
	}}
	cl := &http.Client{Transport: tr, Timeout: time.Second}
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; i < 5; {
		resp, err := cl.Get("http://" + addr + "/")
		if err != nil {
			if time.Now().After(deadline) {
				t.Fatalf("server never answered: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.Header.Get(NodeHeader) != "node1" {
			t.Fatalf("header %q", resp.Header.Get(NodeHeader))
		}
		i++
	}
	if conns > 2 { // the first may have been refused before the server bound
		t.Errorf("%d connections for 5 keep-alive requests", conns)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve after cancel: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	done <- nil // for the cleanup
}
