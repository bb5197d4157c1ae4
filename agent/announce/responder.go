package announce

import "sync/atomic"

// replyVerdict says what the ARP or the NDP responder did with a frame, so
// tests and counters can tell the cases apart.
type replyVerdict uint8

const (
	replied     replyVerdict = iota // a request (ARP) or solicitation (NDP) for a VIP, answered
	notForVIP                       // valid, not asking for a VIP
	malformed                       // not a parseable (and, for NDP, valid) Ethernet+ARP or Ethernet+IPv6+NS frame
	badSender                       // asks for a VIP, but from a sender no reply may go to
	rateLimited                     // would be answered, but over the reply rate
	numReplyVerdicts
)

// String names the verdict as the counters do.
func (v replyVerdict) String() string {
	switch v {
	case replied:
		return "replied"
	case notForVIP:
		return "ignored"
	case malformed:
		return "malformed"
	case badSender:
		return "bad_sender"
	case rateLimited:
		return "rate_limited"
	}
	return "unknown"
}

// replyStats counts a responder's verdicts; it outlives the sockets, which
// are reopened when they fail.
type replyStats struct {
	n [numReplyVerdicts]atomic.Uint64
}

func (s *replyStats) counters() map[string]uint64 {
	m := make(map[string]uint64, numReplyVerdicts)
	for v := range numReplyVerdicts {
		m[v.String()] = s.n[v].Load()
	}
	return m
}
