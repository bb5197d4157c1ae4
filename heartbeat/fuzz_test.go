package heartbeat

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// FuzzDecode feeds arbitrary bytes to Decode, both as they are and signed
// with the key (so the fuzzer reaches the body parser): it must never panic,
// and whatever it accepts must encode back to an equal message.
func FuzzDecode(f *testing.F) {
	seed, _ := Encode(sampleMessage(), simRing)
	f.Add(seed, false)
	f.Add(seed[:len(seed)-macSize], true)
	small, _ := Encode(&Message{ClusterID: 42, Node: 1}, simRing)
	f.Add(small[:len(small)-macSize], true)
	acked, _ := Encode(&Message{ClusterID: 42, Node: 1, Leaving: true, RestartWindow: time.Second, Acks: []Ack{{Node: 2, Incarnation: 3, Seq: 4}}}, simRing)
	f.Add(acked[:len(acked)-macSize], true)
	compact, _ := Encode(&Message{ClusterID: 42, Node: 1, Acks: []Ack{{Node: 2, Incarnation: 3, Seq: 4}, {Node: 5, Incarnation: 6, Seq: 7, Age: 1}}, CompactAcks: true}, simRing)
	f.Add(compact[:len(compact)-macSize], true)
	f.Fuzz(func(t *testing.T, b []byte, sign bool) {
		if sign && len(b) > 0 {
			b, _ = hmacAppend(b)
		}
		msg, err := Decode(b, simRing, 42)
		if err != nil {
			return
		}
		again, err := Encode(msg, simRing)
		if err != nil {
			t.Fatalf("accepted message does not encode: %v", err)
		}
		msg2, err := Decode(again, simRing, 42)
		if err != nil {
			t.Fatalf("re-encoded message rejected: %v", err)
		}
		if diff := cmp.Diff(msg, msg2); diff != "" {
			t.Fatalf("re-encode changed the message (-want +got):\n%s", diff)
		}
	})
}
