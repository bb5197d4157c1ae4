package lab

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// PacketCheck compares, over a phase of traffic without a change, the IPv4
// packets the client sent with the packets the nodes' data planes took.
// Every node judges every packet, so the two are equal: more taken means
// some packet was taken by two nodes (a bucket owned twice), fewer that
// some was taken by none.
type PacketCheck struct {
	Sent  uint64 `json:"sent"`
	Taken uint64 `json:"taken"`
}

// Twice is the packets taken beyond those sent.
func (p PacketCheck) Twice() uint64 { return p.Taken - min(p.Taken, p.Sent) }

// Untaken is the packets sent that no node took.
func (p PacketCheck) Untaken() uint64 { return p.Sent - min(p.Taken, p.Sent) }

// packetMark is the client's and the nodes' counters at one moment.
type packetMark struct{ sent, taken uint64 }

// packetMark reads the client's IPv4 packets sent and every node's packets
// taken.
func (l *Lab) packetMark(ctx context.Context) (packetMark, error) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", l.Client.Namespace, "cat", "/proc/net/snmp").Output()
	if err != nil {
		return packetMark{}, fmt.Errorf("lab: the client's /proc/net/snmp: %w", err)
	}
	sent, err := snmpField(string(out), "Ip", "OutRequests")
	if err != nil {
		return packetMark{}, err
	}
	m := packetMark{sent: sent}
	for _, n := range l.Nodes {
		t, err := l.ctl.Taken(ctx, n.Socket)
		if err != nil {
			return packetMark{}, fmt.Errorf("lab: %s's packet counters: %w", n.Name, err)
		}
		m.taken += t
	}
	return m, nil
}

// packetsSince waits up to 2 s for the last packets of a phase that began
// at from to be counted everywhere (the counts equal), and returns them.
func (l *Lab) packetsSince(ctx context.Context, from packetMark) (PacketCheck, error) {
	var p PacketCheck
	var readErr error
	Poll(ctx, 2*time.Second, 100*time.Millisecond, func() error {
		now, err := l.packetMark(ctx)
		if readErr = err; err != nil {
			return err
		}
		p = PacketCheck{Sent: now.sent - from.sent, Taken: now.taken - from.taken}
		if p.Sent != p.Taken {
			return fmt.Errorf("sent %d, taken %d", p.Sent, p.Taken)
		}
		return nil
	})
	if ctx.Err() != nil {
		return p, ctx.Err()
	}
	return p, readErr // unequal after 2 s: the report says so
}

// snmpField reads group's field from /proc/net/snmp's text.
func snmpField(text, group, field string) (uint64, error) {
	var names []string
	for _, line := range strings.Split(text, "\n") {
		g, rest, ok := strings.Cut(line, ": ")
		if !ok || g != group {
			continue
		}
		if names == nil {
			names = strings.Fields(rest)
			continue
		}
		for i, v := range strings.Fields(rest) {
			if i < len(names) && names[i] == field {
				return strconv.ParseUint(v, 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("lab: no %s %s in /proc/net/snmp", group, field)
}
