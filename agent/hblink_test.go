package agent

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/shoalnet/shoal/heartbeat"
)

func TestHeartbeatLinkDropsAndCountsBadMessages(t *testing.T) {
	key := make([]byte, heartbeat.KeySize)
	other := make([]byte, heartbeat.KeySize)
	other[0] = 1
	l, err := listenHeartbeat("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan *heartbeat.Message, 4)
	go l.Receive(ctx, key, 7, out)

	to := l.conn.LocalAddr().(*net.UDPAddr).AddrPort()
	sender, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(to))
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Close()
	msg := &heartbeat.Message{ClusterID: 7, Node: 2, Incarnation: 1, Seq: 1}
	forged, _ := heartbeat.Encode(msg, other)
	foreign, _ := heartbeat.Encode(&heartbeat.Message{ClusterID: 8, Node: 2, Incarnation: 1, Seq: 1}, key)
	good, _ := heartbeat.Encode(msg, key)
	for _, b := range [][]byte{{}, {1, 2, 3}, forged, foreign, good} {
		if _, err := sender.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case got := <-out:
		if got.Node != 2 || got.ClusterID != 7 {
			t.Errorf("received %+v", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the valid heartbeat did not arrive")
	}
	st := l.Stats()
	rejected := uint64(0)
	for k, v := range st {
		if len(k) > 9 && k[:9] == "rejected_" {
			rejected += v
		}
	}
	if st["received"] != 1 || rejected != 4 {
		t.Errorf("stats %v: want 1 received and 4 rejected", st)
	}
}
