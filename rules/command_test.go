package rules

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/shoalnet/shoal/filter"
)

// sampleCommands holds one command of every type.
func sampleCommands() []Command {
	seed, period, tol := uint32(7), 300*time.Millisecond, 4
	return []Command{
		&InitCluster{Settings: testSettings()},
		&PutVIP{VIP: vip1},
		&RemoveVIP{VIP: vip2},
		&PutRule{Rule: filter.Rule{VIP: vip1, PortLo: 80, PortHi: 90, Proto: filter.ProtoBoth, Mode: filter.ModeSingle, Affinity: filter.AffinityNetwork, State: filter.RuleDraining}},
		&PutRule{Rule: filter.Rule{ID: 3, PortLo: 1, PortHi: 65535, Proto: filter.ProtoTCP}},
		&RemoveRule{ID: 3},
		&SetRuleState{Rules: []filter.RuleID{1, 2}, Node: 4, State: filter.RuleDisabled},
		&SetWeight{Rule: 1, Node: 2, Weight: WeightEqual},
		&SetHandlingPriority{Rule: 1, Node: 2, Priority: 5},
		&SetHostPriority{Node: 2, Priority: 7},
		&RegisterNode{Info: nodeInfo("n5", 0), Admin: AdminSuspended},
		&RemoveNode{ID: 5},
		&SetAdminState{Node: 2, State: AdminDraining},
		&SetSettings{HashSeed: &seed, HeartbeatPeriod: &period, HeartbeatTolerance: &tol},
		&SetSettings{HashSeed: &seed},
		&SetMACMode{Mode: MACIGMP},
		NewSetWeight([]filter.RuleID{1, 3}, []filter.NodeID{2, 4}, 0), // new ones last: the seeds keep their numbers
	}
}

func TestCommandRoundTrip(t *testing.T) {
	seen := map[CommandType]bool{}
	for _, cmd := range sampleCommands() {
		seen[cmd.Type()] = true
		b, err := EncodeCommand(cmd)
		if err != nil {
			t.Fatalf("encode %T: %v", cmd, err)
		}
		if b[0] != byte(cmd.Type()) || b[1] != commandVersion || !bytes.Equal(b[2:entryHeader], make([]byte, 8)) {
			t.Errorf("%T: header % x, want type %d version %d, no request id", cmd, b[:entryHeader], cmd.Type(), commandVersion)
		}
		withID, err := encodeEntry(cmd, 0x0102030405060708)
		if err != nil {
			t.Fatal(err)
		}
		if _, id, err := decodeEntry(withID); err != nil || id != 0x0102030405060708 {
			t.Errorf("%T: request id round trip = %x, %v", cmd, id, err)
		}
		got, err := DecodeCommand(b)
		if err != nil {
			t.Fatalf("decode %T: %v", cmd, err)
		}
		if diff := cmp.Diff(cmd, got, stateOpts); diff != "" {
			t.Errorf("round trip %T (-want +got):\n%s", cmd, diff)
		}
	}
	for typ := range commandTable {
		if !seen[typ] {
			t.Errorf("command type %d has no sample", typ)
		}
	}
}

// TestWriteFuzzSeeds keeps testdata/fuzz/FuzzDecodeCommand in step with the
// commands: with SHOAL_WRITE_SEEDS=1 it writes one seed per sample command;
// otherwise it checks each is there.
func TestWriteFuzzSeeds(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecodeCommand")
	for i, cmd := range sampleCommands() {
		b, err := encodeEntry(cmd, uint64(i)<<40|0xbeef)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Join(dir, fmt.Sprintf("seed-%02d-%s", i, strings.TrimPrefix(fmt.Sprintf("%T", cmd), "*rules.")))
		content := "go test fuzz v1\n[]byte(" + strconv.Quote(string(b)) + ")\n"
		if os.Getenv("SHOAL_WRITE_SEEDS") != "" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if _, err := os.Stat(name); err != nil {
			t.Errorf("fuzz seed missing (run SHOAL_WRITE_SEEDS=1 go test -run TestWriteFuzzSeeds ./rules): %v", err)
		}
	}
}

// FuzzDecodeCommand checks the decoder never panics, and that whatever it
// accepts encodes back to an entry that decodes the same: two replicas can
// never read one entry two ways.
func FuzzDecodeCommand(f *testing.F) {
	for i, cmd := range sampleCommands() {
		b, err := encodeEntry(cmd, uint64(i)<<40|0xbeef)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cmd, reqID, err := decodeEntry(b)
		if err != nil {
			return
		}
		again, err := encodeEntry(cmd, reqID)
		if err != nil {
			t.Fatalf("decoded %T but cannot encode it: %v", cmd, err)
		}
		cmd2, reqID2, err := decodeEntry(again)
		if err != nil {
			t.Fatalf("re-encoded %T does not decode: %v", cmd, err)
		}
		if reqID2 != reqID {
			t.Fatalf("request id %x became %x", reqID, reqID2)
		}
		if diff := cmp.Diff(cmd, cmd2, stateOpts); diff != "" {
			t.Fatalf("decode/encode/decode differs (-first +second):\n%s", diff)
		}
		// Applying it must never panic, whatever the values.
		s := &State{}
		_ = s.Check(cmd)
	})
}

func TestDecodeRejects(t *testing.T) {
	for name, b := range map[string][]byte{
		"short":         {1},
		"no id":         {byte(TypePutVIP), 1, '{', '}'},
		"unknown type":  rawEntry(0, 1, `{}`),
		"version 0":     rawEntry(TypePutVIP, 0, `{}`),
		"version 2":     rawEntry(TypePutVIP, 2, `{}`),
		"trailing data": rawEntry(TypePutVIP, 1, `{"VIP":"198.18.0.1"} {}`),
		"bad vip":       rawEntry(TypePutVIP, 1, `{"VIP":"300.1.1.1"}`),
		"too long":      rawEntry(TypePutVIP, 1, string(make([]byte, maxCommandSize))),
	} {
		if _, err := DecodeCommand(b); err == nil {
			t.Errorf("%s: DecodeCommand accepted % x", name, b[:min(len(b), 16)])
		}
	}
	if _, err := DecodeCommand(rawEntry(TypePutVIP, 1, `{"VIP":"198.18.0.1"}`)); err != nil {
		t.Errorf("a valid raw entry does not decode: %v", err)
	}
}

// rawEntry builds a log entry by hand, request id 7.
func rawEntry(typ CommandType, version byte, payload string) []byte {
	return append([]byte{byte(typ), version, 0, 0, 0, 0, 0, 0, 0, 7}, payload...)
}

// FuzzDecodeSnapshot checks a snapshot that decodes is a valid state and
// that nothing panics on a damaged one.
func FuzzDecodeSnapshot(f *testing.F) {
	tf := seeded(f)
	snap, err := tf.f.Snapshot()
	if err != nil {
		f.Fatal(err)
	}
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		f.Fatal(err)
	}
	f.Add(sink.Bytes())
	f.Add([]byte("\x01{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := decodeSnapshot(bytes.NewReader(b))
		if err != nil {
			return
		}
		s := d.State
		if err := s.validate(); err != nil {
			t.Fatalf("decoded an invalid state: %v", err)
		}
		_ = s.FilterConfig()
	})
}
