package rules_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/netip"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/peer"
	"github.com/shoalnet/shoal/rules"
)

// This is how an agent uses the store: open it (here bootstrapping a new
// cluster), serve the peer API, follow changes, and write rules.
func Example() {
	key := make([]byte, peer.KeySize) // in real life: the cluster key file
	rand.Read(key)
	peerLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	store, err := rules.Open(rules.StoreConfig{
		NodeName:      "web1",
		DataDir:       "/var/lib/shoal",
		RaftBind:      "198.18.0.1:7000",
		HeartbeatAddr: "198.18.0.1:7946",
		APIAddr:       peerLn.Addr().String(),
		Key:           key,
		Bootstrap:     true, // only on the first node; the others call Join
	})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	mux := http.NewServeMux()
	mux.Handle(rules.PeerPathPrefix, store.PeerHandler())
	go http.Serve(peerLn, mux)

	changes, stop := store.Subscribe()
	defer stop()
	go func() {
		for range changes {
			st := store.State()
			cfg := st.FilterConfig() // what filter.Assign takes
			fmt.Println("rules index", st.Index, "rules", len(cfg.Rules))
		}
	}()

	ctx := context.Background()
	vip := netip.MustParseAddr("198.18.0.100")
	if _, err := store.Apply(ctx, &rules.PutVIP{VIP: vip}); err != nil {
		log.Fatal(err)
	}
	res, err := store.Apply(ctx, &rules.PutRule{Rule: filter.Rule{
		VIP: vip, PortLo: 80, PortHi: 80, Proto: filter.ProtoTCP, Affinity: filter.AffinitySingle,
	}})
	switch {
	case errors.Is(err, rules.ErrConflict):
		fmt.Println("fix the rule:", err) // e.g. it overlaps another rule
	case errors.Is(err, rules.ErrNoQuorum):
		fmt.Println("not now:", err) // the data plane keeps the last rules
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Println("rule", res.RuleID, "at index", res.Index)
	}

	// `shoal drain 198.18.0.100:80` on this node:
	st := store.State()
	ids, err := st.ResolveRules("198.18.0.100:80")
	if err != nil {
		log.Fatal(err)
	}
	me := st.NodeByName("web1")
	store.Apply(ctx, &rules.SetRuleState{Rules: ids, Node: me.ID, State: filter.RuleDraining})
}
