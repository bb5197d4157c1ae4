package peer

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestHandshakesBounded: the peer API's listener takes at most
// maxHandshakes connections into their TLS handshake at once; one more is
// closed at once and counted, and once the handshakes in progress end, a
// peer's request is served again. A failed handshake is counted too.
func TestHandshakesBounded(t *testing.T) {
	certs := testCerts(t, "a", testKey)
	refusals := NewRefusals(nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }), "peer", refusals)
	go srv.Serve(Listener(ln, certs, refusals))
	t.Cleanup(func() { srv.Close() })
	addr := ln.Addr().String()

	// Connections that never send a ClientHello hold every slot.
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	for range maxHandshakes {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	extra, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	extra.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("a connection past %d handshakes in progress: read %v, want it closed (EOF)", maxHandshakes, err)
	}
	waitCount(t, func() bool { return refusals.Count("peer", RefuseTooMany) == 1 })

	// The held connections fail their handshake (closed): the slots free.
	for _, c := range held {
		c.Close()
	}
	held = nil
	waitCount(t, func() bool { return refusals.Count("peer", RefuseHandshake) == maxHandshakes })
	client := NewClient(testCerts(t, "b", testKey))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, URL(addr, "/x"), nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("a peer's request once the handshakes ended: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "ok" {
		t.Fatalf("body %q, want ok", body)
	}
}

func waitCount(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("not within 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
