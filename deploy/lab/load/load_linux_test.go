package load

import (
	"context"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestRunCountsSYNRetransmissions: a listener whose accept queue is full
// drops SYNs, so a request that arrives then connects only when its SYN is
// retransmitted, a second later. It must count as delayed, not failed.
func TestRunCountsSYNRetransmissions(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a SYN retransmission (1 s)")
	}
	// Backlog 0: the accept queue holds one connection.
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		syscall.Close(fd)
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "listener")
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// Fill the queue: this connection completes and waits to be accepted.
	filler, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer filler.Close()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(NodeHeader, "node1")
	})}
	defer srv.Close()
	// Start accepting once the request's first SYN has been dropped.
	time.AfterFunc(300*time.Millisecond, func() { srv.Serve(ln) })
	res, err := Run(context.Background(), Options{URL: "http://" + ln.Addr().String() + "/", Requests: 1, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Successes != 1 || res.Delayed != 1 || len(res.DelayedList) != 1 || res.DelayedList[0].ConnectMS < 1000 || res.Timeline[0].Delayed != 1 {
		t.Errorf("successes %d, delayed %d %+v, connect p99 %.0f ms; want the one request delayed by a retransmitted SYN",
			res.Successes, res.Delayed, res.DelayedList, res.ConnectP99MS)
	}
	if res.Retransmits == nil || *res.Retransmits == 0 {
		t.Errorf("retransmits %v; want the dropped SYN counted", res.Retransmits)
	}
}

// TestRunRetransmitsNoneWhenSlow: a server that answers late makes the
// client wait, not retransmit: the count tells lost packets from a slow
// node.
func TestRunRetransmitsNoneWhenSlow(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(300 * time.Millisecond) // past the 200 ms minimum retransmission timeout
		w.Header().Set(NodeHeader, "node1")
	})}
	go srv.Serve(ln)
	defer srv.Close()
	res, err := Run(context.Background(), Options{URL: "http://" + ln.Addr().String() + "/", Requests: 4, Concurrency: 2, KeepAlive: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Successes != 4 || res.Connects != 2 || res.Retransmits == nil || *res.Retransmits != 0 {
		t.Errorf("successes %d, connects %d, retransmits %v; want 4 on 2 connections and none retransmitted", res.Successes, res.Connects, res.Retransmits)
	}
}
