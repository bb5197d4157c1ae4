// SPDX-License-Identifier: (MIT OR GPL-2.0)
//
// shoal's XDP data plane: keep the VIP packets this node owns, drop the rest
// of the VIP traffic, pass everything else untouched. The rules are the Go
// reference classifier's (filter/classify.go, classify6.go); a differential
// test runs both on the same frames. Two parsers, IPv4 and IPv6, turn a
// packet into a struct flow, with one set of transport readers (ports,
// ICMP errors' quotes, later fragments) for both; one verdict core judges
// every flow. All tables exist three times (versions 0, 1 and 2); the
// loader fills an inactive version and then flips `active`, so a packet,
// which reads `active` once, is judged by one whole version. With three,
// the version written next is never the one the last flip retired, which
// packets may still be using: a push need not wait for the flip before it.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// Capacities; filter/xdp_linux.go has the same numbers.
#define MAX_VIPS 64    // a power of two: VIP indexes are masked with it
#define MAX_SLOTS 257  // rule slots: 0 is DefaultRule, 1..256 port rules
#define NUM_BUCKETS 4096
#define NUM_VERSIONS 3 // of every table: filter/xdp_linux.go tableVersions
#define NUM_PORTS 65536
#define FRAG_ENTRIES 16384 // datagrams whose first fragment's verdict is remembered
#define MAX_HB_PEERS 1024
#define MAX_EXT_HDRS 8   // IPv6 extension headers walked (filter.MaxExtHeaders)
#define MAX_L4_OFF 1024  // IPv6 transport header within this many bytes (filter.MaxL4Offset)
#define MAX_KEY 5        // flow key words: 2 for IPv4, 5 for IPv6

// Bucket states (filter.BucketState), in a bucket's low two bits; the six
// above are its hand-over index (filter.Tables.HandTo), 0 for none.
#define ST_NOT_OWNED 0
#define ST_OWNED 1
#define ST_OWNED_DIRTY 2
#define ST_DRAINING 3
#define ST_MASK 3
#define HAND_SHIFT 2
#define MAX_HAND 64 // hand-over MACs per version (filter.MaxHandTo)
// The hand-over index of a draining bucket about to be acquired here: the
// one kind of bucket a SYN handed over to this node is taken in
// (filter.HandPending).
#define HAND_PENDING (MAX_HAND - 1)
// The hand-over index of a bucket of a remapped rule whose SYNs that the
// previous tables take are still taken here (filter.HandKeep).
#define HAND_KEEP (MAX_HAND - 2)

// Counter indexes: 0 accepted, then filter.DropReason.
#define C_ACCEPTED 0
#define R_NOT_OWNED 1
#define R_DIRTY_NO_CONN 2
#define R_DRAIN_NO_CONN 3
#define R_DISABLED 4
#define R_MALFORMED 5
#define C_HANDED 6         // SYNs handed over to their bucket's new owner
#define C_HANDED_IN 7      // SYNs handed over here, taken
#define C_HANDED_REFUSED 8 // SYNs handed over here, dropped: taken already (the flooded copy), or the lease ended
#define C_FORWARDED 9      // forwarded to another node (routed mode)
#define NUM_COUNTERS 10

// Routed forwarding (filter.Tables.Forward): a VIP packet this node does
// not take goes, encapsulated in IPv4 (IP-in-IP, or IPv6-in-IPv4), to the
// node its forward table names; the outer header's id carries FWD_MARK and
// the hops made so far, and a packet that made MAX_HOPS is not forwarded
// again.
#define MAX_PEERS 64 // forward targets per version (filter.MaxForward)
#define MAX_HOPS 3   // filter.MaxHops
#define FWD_MARK 0x5e00
#define FWD_MARK_MASK 0xff00
#define IPPROTO_IPV6_ 41
#define ENCAP_LEN 20
// Forwarding counters (fwd_drops), filter.ForwardDrops' order.
#define F_FOREIGN 0   // encapsulated VIP traffic from an address that is no member's: dropped
#define F_NO_ROUTE 1  // no route or neighbour to the target: dropped
#define F_HOP_LIMIT 2 // not taken after MAX_HOPS hops, or the target is this node: dropped
#define F_TOO_BIG 3   // the packet plus the encapsulation exceeds the MTU: dropped
#define NUM_FWD_DROPS 4
// Per-peer counters (fwd_stats), filter.PeerCounters' order.
#define P_OUT 0    // forwarded to the peer, as its bucket's owner
#define P_SECOND 1 // forwarded to the peer, a previous owner (second chance)
#define P_IN 2     // received from the peer, decapsulated
#define NUM_PEER_COUNTERS 3

// Affinities (filter.Affinity).
#define AFF_NONE 0
#define AFF_SINGLE 1
#define AFF_NETWORK 2

#define ETH_P_8021Q_ 0x8100
#define ETH_P_IP_ 0x0800
#define ETH_P_IPV6_ 0x86DD
#define NH_HOPOPTS 0
#define NH_ROUTING 43
#define NH_FRAGMENT 44
#define NH_ICMPV6 58
#define NH_DSTOPTS 60
#define BPF_TCP_TIME_WAIT_ 6
#define BPF_TCP_LISTEN_ 10
#define IP_MF 0x2000
#define IP_OFFSET 0x1fff

#define VIP_DIR 256

struct vip_bucket {
	__u32 n;
	__u32 addr[MAX_VIPS]; // network byte order, as in the packet
	__u8 idx[MAX_VIPS];
};

struct vip6_bucket {
	__u32 n;
	__u32 addr[MAX_VIPS][4]; // network byte order, as in the packet
	__u8 idx[MAX_VIPS];
};

struct settings {
	__u32 seed;
	__u8 mac[6];
	__u8 prev;   // 1 + the version of filter.Tables.Prev; 0: none
	__u8 routed; // filter.Tables.Routed: frames to this node's MAC are its own, never hand-overs
};

struct rule_info {
	__u32 id; // filter.RuleID, for debugging
	__u8 affinity;
	__u8 disabled;
	__u8 remap; // filter.Tables.Remapped: a SYN is judged under prev first
	__u8 pad;
};

struct port_table {
	__u16 slot[NUM_PORTS]; // destination port -> rule slot
};

struct bucket_table {
	__u8 state[NUM_BUCKETS];
};

struct counters {
	__u64 n[NUM_COUNTERS];
};

// The MACs SYNs are handed over to, by hand-over index.
struct hand_table {
	__u8 mac[MAX_HAND][6];
};

// fwd[version]: this node's address as forwarding source (0: forwarding
// off), the targets by index (1..MAX_PEERS-1), the MTU of what leaves,
// and the MSS this node's SYN-ACKs from a VIP advertise at most (IPv4 and
// IPv6 clients; 0: left alone).
struct fwd_table {
	__be32 self;
	__be32 peer[MAX_PEERS];
	__u8 mac[MAX_PEERS][6]; // the next hop's MAC to each: its own, or the gateway's
	__u16 mtu;
	__u16 mss4;
	__u16 mss6;
	__u16 pad;
};

struct peer_counters {
	__u64 n[NUM_PEER_COUNTERS];
};

// active[0] is the version (0, 1 or 2) packets are judged by.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} active SEC(".maps");

// settings[version]: hash seed and the interface MAC accepted frames get.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NUM_VERSIONS);
	__type(key, __u32);
	__type(value, struct settings);
} settings SEC(".maps");

// vips[version*VIP_DIR + last octet of the address]: the VIPs ending in
// that octet and their indexes. An array lookup and a compare or two cost
// less than a hash map lookup, and every packet, VIP or not, pays this one.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NUM_VERSIONS * VIP_DIR);
	__type(key, __u32);
	__type(value, struct vip_bucket);
} vips SEC(".maps");

// vips6[version*VIP_DIR + last byte of the address]: the IPv6 VIPs, as
// vips holds the IPv4 ones. VIP indexes are shared by both families.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NUM_VERSIONS * VIP_DIR);
	__type(key, __u32);
	__type(value, struct vip6_bucket);
} vips6 SEC(".maps");

// ports[(version*MAX_VIPS + vip index)*2 + (0 tcp, 1 udp)]: port -> slot.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NUM_VERSIONS * MAX_VIPS * 2);
	__type(key, __u32);
	__type(value, struct port_table);
} ports SEC(".maps");

// rules[version*MAX_SLOTS + slot]: the rule's affinity and whether it is disabled.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NUM_VERSIONS * MAX_SLOTS);
	__type(key, __u32);
	__type(value, struct rule_info);
} rules SEC(".maps");

// buckets[version*MAX_SLOTS + slot]: this node's state for each bucket.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NUM_VERSIONS * MAX_SLOTS);
	__type(key, __u32);
	__type(value, struct bucket_table);
} buckets SEC(".maps");

// hand[version]: the hand-over MACs of that version's buckets.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NUM_VERSIONS);
	__type(key, __u32);
	__type(value, struct hand_table);
} hand SEC(".maps");

// fwd[version]: the forwarding settings (struct fwd_table).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NUM_VERSIONS);
	__type(key, __u32);
	__type(value, struct fwd_table);
} fwd SEC(".maps");

// fwd_buckets[version*MAX_SLOTS + slot]: per bucket, the index in
// fwd.peer of the node a packet this node does not take goes to; 0: none.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NUM_VERSIONS * MAX_SLOTS);
	__type(key, __u32);
	__type(value, struct bucket_table);
} fwd_buckets SEC(".maps");

// fwd_stats[member address]: the cluster's members, the only sources an
// encapsulated packet is taken from, with per-peer counters.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, MAX_HB_PEERS);
	__type(key, __be32);
	__type(value, struct peer_counters);
} fwd_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NUM_FWD_DROPS);
	__type(key, __u32);
	__type(value, __u64);
} fwd_drops SEC(".maps");

// counters[slot], per CPU. Slots keep their rule across versions.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_SLOTS);
	__type(key, __u32);
	__type(value, struct counters);
} counters SEC(".maps");

// lease[0]: the data-plane lease, a bpf_ktime_get_ns (CLOCK_MONOTONIC)
// deadline the agent pushes forward every heartbeat period; 0 means no
// lease. Once it passes, owned and owned-dirty buckets count as draining:
// a stalled agent takes no new connections but keeps its own.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lease SEC(".maps");

// A datagram's first fragment is judged by its ports like any packet; its
// verdict is remembered here for the other fragments, which carry no
// ports. Every node sees the same fragments, so the decisions agree. An
// IPv4 datagram is named by addresses, protocol and 16-bit id (the
// addresses in src[0] and dst[0]); an IPv6 one by addresses, the fragment
// header's next header and its 32-bit identification.
struct frag_key {
	__be32 src[4], dst[4];
	__be32 id;
	__u8 proto;
	__u8 family; // 4 or 6
	__u16 pad;
};

struct frag_verdict {
	__u16 slot;
	__u8 accept;
	__u8 reason;
	__be32 to; // forwarded there (routed mode); 0: not forwarded
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FRAG_ENTRIES);
	__type(key, struct frag_key);
	__type(value, struct frag_verdict);
} frags SEC(".maps");

// Heartbeats: UDP to hb_conf's address and port (this node's heartbeat
// socket) passes only from an address and port in hb_peers, the registered
// peers' heartbeat sockets; the rest is dropped and counted in hb_drops.
// Port 0 turns the check off.
struct hb_conf {
	__be32 addr; // 0: any local address
	__be16 port;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct hb_conf);
} hb_conf SEC(".maps");

struct hb_peer {
	__be32 addr;
	__be16 port;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_HB_PEERS);
	__type(key, struct hb_peer);
	__type(value, __u8);
} hb_peers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} hb_drops SEC(".maps");

// The loader updates barrier[0] after a flip: the kernel waits for every
// running BPF program when a map-in-map element changes, so once that
// returns no packet is still being judged by the old version, and the
// loader may overwrite it (it waits in the background, and before it writes
// a version again). The program never reads it.
struct barrier_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} barrier_inner SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct barrier_inner);
} barrier SEC(".maps") = {
	.values = {[0] = &barrier_inner},
};

// shoal_hash mirrors filter.HashWords: MurmurHash3 x86_32 of n key words.
static __always_inline __u32 rotl32(__u32 x, int r)
{
	return (x << r) | (x >> (32 - r));
}

static __always_inline __u32 murmur_round(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51;
	k = rotl32(k, 15);
	k *= 0x1b873593;
	h ^= k;
	h = rotl32(h, 13);
	return h * 5 + 0xe6546b64;
}

static __always_inline __u32 shoal_hash(__u32 seed, const __u32 *k, __u32 n)
{
	__u32 h = seed;
#pragma unroll
	for (int i = 0; i < MAX_KEY; i++)
		if (i < n)
			h = murmur_round(h, k[i]);
	h ^= n * 4;
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

// A packet's flow, as the verdict core needs it; the parsers fill it in.
struct flow {
	__u32 slot;
	__u32 key[MAX_KEY]; // key words
	__u32 nkey;
	__u8 tcp;    // TCP with a known 4-tuple (or an ICMP error about one)
	__u8 syn;
	__u8 fin; // a TCP FIN, itself (not quoted by ICMP)
	__u8 cookie; // a TCP ACK (no SYN, no RST) that may complete a SYN-cookie handshake
	__u8 v6;
	__u8 first_frag; // judge, and remember the verdict under fk
	__u8 later_frag; // take the verdict remembered under fk, if any
	__u8 has_th;     // th_off is set: a TCP header for the SYN-cookie check
	__u8 hops;       // forwarded this many times before it came here
	// What shoal_forward needs of a packet not taken: its bucket, why it
	// was not taken, whether the bucket is this node's (acquired, or being
	// acquired: pending), and for a later fragment the node its first went
	// to.
	__u16 bucket;
	__u8 reason;
	__u8 second;
	__u8 pending;
	__be32 fwd_addr;
	__be32 from;     // forwarded by this member (the outer source); 0: from the network
	__u16 ip_len;    // the IP packet's length, headers included
	__be16 client_port, vip_port;
	__u16 l3_off, th_off; // the IP and TCP headers' offsets in the frame
	__be32 client_ip[4], vip_ip[4]; // IPv4: [0] only
	struct frag_key fk;
};

// What a parser says of a packet.
#define P_JUDGE 0     // VIP traffic: judge the flow
#define P_PASS 1      // not VIP traffic, or Neighbor Discovery: pass untouched
#define P_MALFORMED 2 // VIP traffic with a broken header: drop, count
#define P_HB_DROP 3   // a heartbeat from a stranger: drop, count apart
#define P_FOREIGN 4   // forwarded by no member: drop, count apart

static __always_inline int count(__u32 slot, __u32 idx)
{
	struct counters *c = bpf_map_lookup_elem(&counters, &slot);
	if (c && idx < NUM_COUNTERS)
		c->n[idx]++;
	return 0;
}

static __always_inline int drop(__u32 slot, __u32 reason)
{
	count(slot, reason);
	return XDP_DROP; // V_DROP
}

// port_slot returns the rule slot for (vip index, proto 0 tcp / 1 udp, port).
static __always_inline __u32 port_slot(__u32 version, __u32 vip_idx, __u32 proto, __u16 port)
{
	__u32 key = (version * MAX_VIPS + vip_idx) * 2 + proto;
	struct port_table *pt = bpf_map_lookup_elem(&ports, &key);
	if (!pt)
		return 0;
	return pt->slot[port];
}

static __always_inline void key4(struct flow *f, __u8 aff, __u32 ip, __u16 port)
{
	f->nkey = 2;
	if (aff == AFF_NONE) {
		f->key[0] = ip;
		f->key[1] = port;
	} else if (aff == AFF_NETWORK) {
		f->key[0] = ip & 0xffffff00;
		f->key[1] = 0;
	} else {
		f->key[0] = ip;
		f->key[1] = 0;
	}
}

// key6 keys an IPv6 client address a (16 bytes within the packet): the
// /128 and the port, the /128, or the /64.
static __always_inline void key6(struct flow *f, __u8 aff, __u8 *a, __u16 port)
{
	f->nkey = 5;
	f->key[0] = bpf_ntohl(*(__u32 *)a);
	f->key[1] = bpf_ntohl(*(__u32 *)(a + 4));
	if (aff == AFF_NETWORK) {
		f->key[2] = 0;
		f->key[3] = 0;
	} else {
		f->key[2] = bpf_ntohl(*(__u32 *)(a + 8));
		f->key[3] = bpf_ntohl(*(__u32 *)(a + 12));
	}
	f->key[4] = aff == AFF_NONE ? port : 0;
}

static __always_inline void copy16(__be32 *dst, __u8 *a)
{
	dst[0] = *(__u32 *)a;
	dst[1] = *(__u32 *)(a + 4);
	dst[2] = *(__u32 *)(a + 8);
	dst[3] = *(__u32 *)(a + 12);
}

// holds_conn asks the socket table whether this node holds a connection:
// a socket that is not a listener, and not in TIME_WAIT but for a FIN (a
// closed connection: another packet may belong to a new one on the same
// ports, held by another node, which the TIME_WAIT socket's answer would
// reset; but a socket the server closed first waits in TIME_WAIT's
// FIN_WAIT2 substate for the client's FIN, which the socket table cannot
// tell apart), or, for an ACK that finds only the listener, a valid SYN
// cookie (the kernel answered the SYN with a cookie under SYN-flood
// pressure and keeps no request socket). The IP and TCP headers are at f's
// offsets in the frame (no TCP header when the flow comes from an ICMP
// error).
static __always_inline int holds_conn(void *ctx, struct flow *f, __u8 *data, void *data_end)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;
	if (f->v6) {
		__builtin_memcpy(t.ipv6.saddr, f->client_ip, 16);
		__builtin_memcpy(t.ipv6.daddr, f->vip_ip, 16);
		t.ipv6.sport = f->client_port;
		t.ipv6.dport = f->vip_port;
		sk = bpf_skc_lookup_tcp(ctx, &t, sizeof(t.ipv6), BPF_F_CURRENT_NETNS, 0);
	} else {
		t.ipv4.saddr = f->client_ip[0];
		t.ipv4.daddr = f->vip_ip[0];
		t.ipv4.sport = f->client_port;
		t.ipv4.dport = f->vip_port;
		sk = bpf_skc_lookup_tcp(ctx, &t, sizeof(t.ipv4), BPF_F_CURRENT_NETNS, 0);
	}
	if (!sk)
		return 0;
	int held = sk->state != BPF_TCP_LISTEN_ && (sk->state != BPF_TCP_TIME_WAIT_ || f->fin);
	__u32 l3_off = f->l3_off, th_off = f->th_off;
	if (!held && f->cookie && f->has_th && l3_off <= 64 && th_off <= 2048) {
		__u8 *l3 = data + l3_off, *th = data + th_off;
		if (th + 20 <= (__u8 *)data_end) {
			if (f->v6) {
				if (l3 + 40 <= (__u8 *)data_end)
					held = bpf_tcp_check_syncookie(sk, l3, 40, (void *)th, 20) == 0;
			} else if (l3 + 20 <= (__u8 *)data_end) {
				held = bpf_tcp_check_syncookie(sk, l3, 20, (void *)th, 20) == 0;
			}
		}
	}
	bpf_sk_release(sk);
	return held;
}

// vip_index finds addr (network byte order) among the VIPs of version.
static __always_inline int vip_index(__u32 version, __u32 addr, __u32 *idx)
{
	__u32 key = version * VIP_DIR + (bpf_ntohl(addr) & 0xff);
	struct vip_bucket *vb = bpf_map_lookup_elem(&vips, &key);
	if (!vb)
		return 0;
	for (int i = 0; i < MAX_VIPS; i++) {
		if (i >= vb->n)
			break;
		if (vb->addr[i] == addr) {
			*idx = vb->idx[i] & (MAX_VIPS - 1);
			return 1;
		}
	}
	return 0;
}

#define PROTO_TCP_IDX 0
#define PROTO_UDP_IDX 1

static __always_inline int lease_expired(void)
{
	__u32 zero = 0;
	__u64 *d = bpf_map_lookup_elem(&lease, &zero);
	return d && *d && bpf_ktime_get_ns() > *d;
}

// heartbeat_ok judges IPv4 traffic that is not for a VIP: UDP to this
// node's heartbeat socket must come from a registered peer's.
static __always_inline int heartbeat_ok(__u8 *ip, void *data_end)
{
	if (ip[9] != IPPROTO_UDP)
		return 1;
	__u32 zero = 0;
	struct hb_conf *hc = bpf_map_lookup_elem(&hb_conf, &zero);
	if (!hc || !hc->port)
		return 1;
	if (hc->addr && hc->addr != *(__u32 *)(ip + 16))
		return 1;
	if (bpf_ntohs(*(__u16 *)(ip + 6)) & IP_OFFSET)
		return 1; // a later fragment: no ports
	__u32 ihl = (ip[0] & 0x0f) * 4;
	if (ihl < 20 || ihl > 60)
		return 1;
	__u8 *udp = ip + ihl;
	if (udp + 8 > (__u8 *)data_end)
		return 1;
	if (*(__u16 *)(udp + 2) != hc->port)
		return 1;
	struct hb_peer k = {.addr = *(__u32 *)(ip + 12), .port = *(__u16 *)udp};
	if (bpf_map_lookup_elem(&hb_peers, &k))
		return 1;
	__u64 *n = bpf_map_lookup_elem(&hb_drops, &zero);
	if (n)
		(*n)++;
	return 0;
}

// vip6_index finds the IPv6 address at a (16 bytes within the packet)
// among the IPv6 VIPs of version.
static __always_inline int vip6_index(__u32 version, __u8 *a, __u32 *idx)
{
	__u32 key = version * VIP_DIR + a[15];
	struct vip6_bucket *vb = bpf_map_lookup_elem(&vips6, &key);
	if (!vb)
		return 0;
	__u32 w0 = *(__u32 *)a, w1 = *(__u32 *)(a + 4), w2 = *(__u32 *)(a + 8), w3 = *(__u32 *)(a + 12);
	for (int i = 0; i < MAX_VIPS; i++) {
		if (i >= vb->n)
			break;
		if (vb->addr[i][0] == w0 && vb->addr[i][1] == w1 && vb->addr[i][2] == w2 && vb->addr[i][3] == w3) {
			*idx = vb->idx[i] & (MAX_VIPS - 1);
			return 1;
		}
	}
	return 0;
}

// The build's context, and whether an accepted frame gets the interface's
// MAC as destination (XDP) or keeps it (tc, which marks the skb instead).
#ifdef SHOAL_TC
typedef struct __sk_buff shoal_ctx;
#define REWRITE 0
#else
typedef struct xdp_md shoal_ctx;
#define REWRITE 1
#endif

// rule_affinity returns the affinity of the rule in slot.
static __always_inline __u8 rule_affinity(__u32 version, __u32 slot)
{
	__u32 rkey = version * MAX_SLOTS + slot;
	struct rule_info *ri = bpf_map_lookup_elem(&rules, &rkey);
	return ri ? ri->affinity : AFF_SINGLE;
}

// The transport readers below serve both parsers. An IP header ip holds
// the client's and the VIP's address at src_addr(v6, ip) and
// dst_addr(v6, ip) (a packet from a client), or the other way round (the
// packet an ICMP error quotes, which went from the VIP to the client).
// v6 is a constant at every call, so each inlined copy keeps one family.
static __always_inline __u8 *src_addr(int v6, __u8 *ip)
{
	return ip + (v6 ? 8 : 12);
}

static __always_inline __u8 *dst_addr(int v6, __u8 *ip)
{
	return ip + (v6 ? 24 : 16);
}

// key_client keys the client address at a (within the packet) and port
// by aff: key4's or key6's words.
static __always_inline void key_client(struct flow *f, int v6, __u8 aff, __u8 *a, __u16 port)
{
	if (v6)
		key6(f, aff, a, port);
	else
		key4(f, aff, bpf_ntohl(*(__u32 *)a), port);
}

// tcp_tuple marks f as TCP with the 4-tuple for the socket lookup: the
// client's and the VIP's address (within the packet) and port (network
// byte order).
static __always_inline void tcp_tuple(struct flow *f, int v6, __u8 *client, __u8 *vip, __be16 cport, __be16 vport)
{
	f->tcp = 1;
	if (v6) {
		copy16(f->client_ip, client);
		copy16(f->vip_ip, vip);
	} else {
		f->client_ip[0] = *(__u32 *)client;
		f->vip_ip[0] = *(__u32 *)vip;
	}
	f->client_port = cport;
	f->vip_port = vport;
}

// no_ports judges a flow whose ports are not known (a later fragment, or
// a protocol without ports) by the rule for port 0 of its protocol (slot 0
// when it is neither TCP nor UDP) and the client address at client alone,
// as every node judges it alike.
static __always_inline int no_ports(struct flow *f, int v6, __u32 version, __u32 vidx, __u8 proto, __u8 *client)
{
	if (proto == IPPROTO_TCP || proto == IPPROTO_UDP)
		f->slot = port_slot(version, vidx, proto == IPPROTO_TCP ? PROTO_TCP_IDX : PROTO_UDP_IDX, 0);
	key_client(f, v6, AFF_SINGLE, client, 0);
	return P_JUDGE;
}

// l4_ports reads the TCP or UDP header at l4, l4len bytes long, of the
// packet ip from a client to the VIP vidx: the rule by destination port,
// the key by the rule's affinity and, for TCP, the 4-tuple, the flags and
// the header for the SYN-cookie check (th).
static __always_inline int l4_ports(struct flow *f, int v6, __u8 *ip, __u8 *l4, __u32 l4len, void *data_end,
				    __u32 version, __u32 vidx, __u8 proto, __u8 **th)
{
	int tcp = proto == IPPROTO_TCP;
	if (tcp) {
		if (l4len < 20)
			return P_MALFORMED;
		if (l4 + 20 > (__u8 *)data_end)
			return P_MALFORMED;
		__u32 doff = (l4[12] >> 4) * 4;
		if (doff < 20 || doff > l4len)
			return P_MALFORMED;
	} else {
		if (l4len < 8)
			return P_MALFORMED;
		if (l4 + 8 > (__u8 *)data_end)
			return P_MALFORMED;
	}
	__u16 sport = bpf_ntohs(*(__u16 *)l4);
	__u16 dport = bpf_ntohs(*(__u16 *)(l4 + 2));
	f->slot = port_slot(version, vidx, tcp ? PROTO_TCP_IDX : PROTO_UDP_IDX, dport);
	key_client(f, v6, rule_affinity(version, f->slot), src_addr(v6, ip), sport);
	if (tcp) {
		if (l4 + 20 > (__u8 *)data_end)
			return P_MALFORMED; // checked above; clang may merge the checks
		f->syn = (l4[13] & 0x12) == 0x02;
		f->fin = (l4[13] & 0x01) != 0;
		f->cookie = (l4[13] & 0x16) == 0x10; // ACK without SYN or RST
		*th = l4;
		tcp_tuple(f, v6, src_addr(v6, ip), dst_addr(v6, ip), *(__u16 *)l4, *(__u16 *)(l4 + 2));
	}
	return P_JUDGE;
}

// quoted_ports judges an ICMP error as the packets of the flow it quotes:
// e, the quoted IP header, elen bytes of quote, from the VIP evidx to a
// client; proto its transport, at off unless the quoted packet is a later
// fragment (later).
static __always_inline int quoted_ports(struct flow *f, int v6, __u8 *e, __u32 elen, __u32 off, int later, __u8 proto,
					void *data_end, __u32 version, __u32 evidx)
{
	__u8 *client = dst_addr(v6, e), *vip = src_addr(v6, e);
	if (later || (proto != IPPROTO_TCP && proto != IPPROTO_UDP))
		return no_ports(f, v6, version, evidx, proto, client);
	if (off > MAX_L4_OFF || off + 4 > elen)
		return P_MALFORMED;
	__u8 *ep = e + off;
	if (ep + 4 > (__u8 *)data_end)
		return P_MALFORMED;
	__u16 vport = bpf_ntohs(*(__u16 *)ep);
	__u16 cport = bpf_ntohs(*(__u16 *)(ep + 2));
	f->slot = port_slot(version, evidx, proto == IPPROTO_TCP ? PROTO_TCP_IDX : PROTO_UDP_IDX, vport);
	key_client(f, v6, rule_affinity(version, f->slot), client, cport);
	if (proto == IPPROTO_TCP)
		tcp_tuple(f, v6, client, vip, *(__u16 *)(ep + 2), *(__u16 *)ep);
	return P_JUDGE;
}

// parse4 reads the flow of the IPv4 packet ip (20 bytes of it are within
// the frame).
static __always_inline int parse4(__u8 *ip, void *data_end, __u32 version, struct flow *f, __u8 **th)
{
	__u32 vidx;
	if (!vip_index(version, *(__u32 *)(ip + 16), &vidx))
		return heartbeat_ok(ip, data_end) ? P_PASS : P_HB_DROP;

	__u32 avail = (__u32)((long)data_end - (long)ip);
	__u32 ihl = (ip[0] & 0x0f) * 4;
	__u32 total = bpf_ntohs(*(__u16 *)(ip + 2));
	if ((ip[0] >> 4) != 4 || ihl < 20 || total < ihl || total > avail)
		return P_MALFORMED;
	f->ip_len = total;

	__u8 proto = ip[9];
	__u32 l4len = total - ihl;
	__u8 *l4 = ip + ihl;
	__u16 fragoff = bpf_ntohs(*(__u16 *)(ip + 6));
	if (fragoff & (IP_MF | IP_OFFSET)) {
		f->fk.src[0] = *(__u32 *)(ip + 12);
		f->fk.dst[0] = *(__u32 *)(ip + 16);
		f->fk.id = *(__u16 *)(ip + 4);
		f->fk.proto = proto;
		f->fk.family = 4;
		f->first_frag = !(fragoff & IP_OFFSET);
	}

	if (fragoff & IP_OFFSET) {
		// A later fragment follows its datagram's first fragment; if that
		// was not seen (or forgotten): rule for port 0, key (client IP,
		// 0), as every node judges it alike.
		f->later_frag = 1;
		return no_ports(f, 0, version, vidx, proto, ip + 12);
	}

	if (proto == IPPROTO_TCP || proto == IPPROTO_UDP)
		return l4_ports(f, 0, ip, l4, l4len, data_end, version, vidx, proto, th);

	if (proto == IPPROTO_ICMP) {
		if (l4len < 8)
			return P_MALFORMED;
		if (l4 + 8 > (__u8 *)data_end)
			return P_MALFORMED;
		__u8 type = l4[0];
		if (type == 3 || type == 11 || type == 12) {
			// An error: judge it as the quoted flow's packets.
			__u8 *e = l4 + 8;
			__u32 elen = l4len - 8;
			if (elen < 20)
				return P_MALFORMED;
			if (e + 20 > (__u8 *)data_end)
				return P_MALFORMED;
			__u32 eihl = (e[0] & 0x0f) * 4;
			if ((e[0] >> 4) != 4 || eihl < 20 || eihl > elen)
				return P_MALFORMED;
			__u32 evidx;
			if (!vip_index(version, *(__u32 *)(e + 12), &evidx)) {
				key_client(f, 0, AFF_SINGLE, ip + 12, 0); // not about a VIP flow: like any other ICMP
				return P_JUDGE;
			}
			int later = bpf_ntohs(*(__u16 *)(e + 6)) & IP_OFFSET;
			return quoted_ports(f, 0, e, elen, eihl, later, e[9], data_end, version, evidx);
		}
	}
	// ICMP that is not an error, and other protocols.
	key_client(f, 0, AFF_SINGLE, ip + 12, 0);
	return P_JUDGE;
}

// What walk_ipv6 found.
struct walk {
	__u32 off;  // where the transport header starts
	__u8 nh;    // its protocol
	__u8 frag;  // a fragment header made the packet a fragment
	__u8 later; // a later fragment (offset not 0): the walk stopped there
	__u8 fnext; // the fragment header's next header
	__be32 fid; // its identification
};

// walk_ipv6 steps over the extension headers of the IPv6 packet at base
// (40 bytes of it within the frame), len bytes long (the payload length's,
// or an ICMPv6 error's quote's): at most MAX_EXT_HDRS of them, the
// transport header within MAX_L4_OFF bytes. It returns -1 when a header
// runs past len or a bound is broken (filter.walkIPv6).
static __always_inline int walk_ipv6(__u8 *base, __u32 len, void *data_end, struct walk *w)
{
	__u8 nh = base[6];
	__u32 off = 40;
#pragma unroll
	for (int i = 0; i <= MAX_EXT_HDRS; i++) {
		if (nh != NH_HOPOPTS && nh != NH_ROUTING && nh != NH_DSTOPTS && nh != NH_FRAGMENT)
			break;
		if (i == MAX_EXT_HDRS || off + 8 > len || off > MAX_L4_OFF)
			return -1;
		__u8 *h = base + off;
		if (h + 8 > (__u8 *)data_end)
			return -1;
		if (nh == NH_FRAGMENT) {
			__u16 fo = bpf_ntohs(*(__u16 *)(h + 2));
			nh = h[0];
			off += 8;
			if (fo & 0xfff9) { // an offset or more fragments: a fragment
				w->frag = 1;
				w->fnext = h[0];
				w->fid = *(__u32 *)(h + 4);
				if (fo & 0xfff8) {
					w->later = 1;
					break;
				}
			}
		} else {
			nh = h[0];
			off += (h[1] + 1) * 8;
		}
		if (off > len || off > MAX_L4_OFF)
			return -1;
	}
	w->nh = nh;
	w->off = off;
	return 0;
}

// embedded6 is shoal_embedded6's body, with the pointers made.
static __always_inline int embedded6(__u8 *e, __u32 elen, __u8 *src, void *data_end, __u32 version, struct flow *f)
{
	if (elen < 40)
		return P_MALFORMED;
	if (e + 40 > (__u8 *)data_end)
		return P_MALFORMED;
	if ((e[0] >> 4) != 6)
		return P_MALFORMED;
	__u32 evidx;
	if (!vip6_index(version, e + 8, &evidx)) {
		key6(f, AFF_SINGLE, src, 0); // not about a VIP flow: like any other ICMPv6
		return P_JUDGE;
	}
	struct walk w = {};
	if (walk_ipv6(e, elen, data_end, &w) < 0)
		return P_MALFORMED;
	return quoted_ports(f, 1, e, elen, w.off, w.later, w.nh, data_end, version, evidx);
}

// shoal_embedded6 reads the flow of the packet an ICMPv6 error quotes: e,
// elen bytes of the error's payload. The quoted packet went from a VIP to a
// client; src is the error's sender.
// It is a global function, at e_off and src_off in the frame, so the
// verifier checks it once rather than once for each way the outer
// extension-header walk can end.
// (At most five arguments: e_off and elen travel as e_off << 16 | elen.)
__attribute__((noinline)) int shoal_embedded6(shoal_ctx *ctx, struct flow *f, __u32 e, __u32 src_off, __u32 version)
{
	if (!f)
		return P_MALFORMED;
	__u32 e_off = e >> 16, elen = e & 0xffff;
	__u8 *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	version &= 3; // below NUM_VERSIONS already (the caller's check); bounded for the verifier
	if (e_off > 2048 || src_off > 64)
		return P_MALFORMED; // cannot happen: tells the verifier
	__u8 *src = data + src_off;
	if (src + 16 > (__u8 *)data_end)
		return P_MALFORMED;
	return embedded6(data + e_off, elen, src, data_end, version, f);
}

// parse6 reads the flow of the IPv6 packet ip (40 bytes of it are within
// the frame). Non-VIP IPv6 passes: heartbeats are IPv4.
static __always_inline int parse6(shoal_ctx *ctx, __u8 *data, __u8 *ip, void *data_end, __u32 version, struct flow *f, __u8 **th)
{
	__u32 vidx;
	if (!vip6_index(version, ip + 24, &vidx))
		return P_PASS;

	__u32 avail = (__u32)((long)data_end - (long)ip);
	__u32 plen = bpf_ntohs(*(__u16 *)(ip + 4));
	if ((ip[0] >> 4) != 6 || plen == 0 || plen + 40 > avail)
		return P_MALFORMED;
	__u32 total = plen + 40;
	f->ip_len = total;
	struct walk w = {};
	if (walk_ipv6(ip, total, data_end, &w) < 0)
		return P_MALFORMED;
	f->v6 = 1;
	if (w.frag) {
		copy16(f->fk.src, ip + 8);
		copy16(f->fk.dst, ip + 24);
		f->fk.id = w.fid;
		f->fk.proto = w.fnext;
		f->fk.family = 6;
		f->first_frag = !w.later;
	}
	if (w.later) {
		f->later_frag = 1;
		return no_ports(f, 1, version, vidx, w.fnext, ip + 8);
	}

	__u32 off = w.off;
	if (off > MAX_L4_OFF || off > total)
		return P_MALFORMED; // cannot happen after the walk; tells the verifier
	__u32 l4len = total - off;
	__u8 *l4 = ip + off;
	__u8 nh = w.nh;
	if (nh == IPPROTO_TCP || nh == IPPROTO_UDP)
		return l4_ports(f, 1, ip, l4, l4len, data_end, version, vidx, nh, th);
	if (nh == NH_ICMPV6) {
		if (l4len < 8)
			return P_MALFORMED;
		if (l4 + 8 > (__u8 *)data_end)
			return P_MALFORMED;
		__u8 type = l4[0];
		if (type >= 133 && type <= 137)
			return P_PASS; // Neighbor Discovery: the agent's and the kernel's
		if (type >= 1 && type <= 4)
			return shoal_embedded6(ctx, f, (__u32)((long)(l4 + 8) - (long)data) << 16 | ((l4len - 8) & 0xffff),
					       (long)(ip + 8) - (long)data, version);
	}
	// ICMPv6 that is not an error (echo requests...), and other protocols.
	key_client(f, 1, AFF_SINGLE, ip + 8, 0);
	return P_JUDGE;
}

// What the data plane decides: the frame passes untouched, is dropped, or
// is VIP traffic this node keeps.
#define V_DROP XDP_DROP
#define V_PASS XDP_PASS
#define V_TX XDP_TX
#define V_ACCEPT 100
#define V_FWD 101       // tc: forwarded (redirected)
#define V_NOT_TAKEN 102 // routed: not taken here; shoal_forward decides
#define TC_ACT_REDIRECT 7
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV4_ (1ULL << 7)
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV6_ (1ULL << 8)

// accept counts an accepted frame under slot and rewrites its destination
// MAC to mac when the build does.
static __always_inline int accept(shoal_ctx *ctx, __u32 slot, __u8 *mac)
{
	if (REWRITE) {
		struct ethhdr *eth = (void *)(long)ctx->data;
		if ((void *)(eth + 1) > (void *)(long)ctx->data_end)
			return V_PASS; // cannot happen: the parser read further
		__builtin_memcpy(eth->h_dest, mac, 6);
	}
	count(slot, C_ACCEPTED);
	return V_ACCEPT;
}

// to_me reports whether the frame of ctx is addressed to mac, this node's
// own: a SYN so addressed was handed over by its bucket's previous owner.
static __always_inline int to_me(shoal_ctx *ctx, __u8 *mac)
{
	struct ethhdr *eth = (void *)(long)ctx->data;
	if ((void *)(eth + 1) > (void *)(long)ctx->data_end)
		return 0;
	for (int i = 0; i < 6; i++)
		if (eth->h_dest[i] != mac[i])
			return 0;
	return 1;
}

// hand_over sends a SYN this node does not take, in a bucket it released,
// back out to the bucket's new owner (its MAC as destination, this node's
// as source), which takes it whatever its tables say (to_me): until the new
// owner's tables take the bucket, no SYN falls between the two. XDP sends
// it with XDP_TX, the tc build redirects it to the interface's egress.
// Without a MAC to hand to the SYN is dropped for reason.
// HAND_PENDING is no MAC: such a bucket is this node's to acquire.
static __always_inline int hand_over(shoal_ctx *ctx, __u32 version, __u32 slot, __u32 to, __u8 *mac, __u32 reason)
{
	struct hand_table *ht = bpf_map_lookup_elem(&hand, &version);
	struct ethhdr *eth = (void *)(long)ctx->data;
	if (!ht || to >= HAND_KEEP || (void *)(eth + 1) > (void *)(long)ctx->data_end)
		return drop(slot, reason);
	__u8 *dst = ht->mac[to];
	if (!(dst[0] | dst[1] | dst[2] | dst[3] | dst[4] | dst[5]))
		return drop(slot, reason);
	__builtin_memcpy(eth->h_dest, dst, 6);
	__builtin_memcpy(eth->h_source, mac, 6);
	count(slot, C_HANDED);
	return V_TX;
}

static __always_inline void fwd_drop_count(__u32 idx)
{
	__u64 *n = bpf_map_lookup_elem(&fwd_drops, &idx);
	if (n)
		(*n)++;
}

static __always_inline void peer_count(__be32 addr, __u32 idx)
{
	struct peer_counters *pc = bpf_map_lookup_elem(&fwd_stats, &addr);
	if (pc && idx < NUM_PEER_COUNTERS)
		pc->n[idx]++;
}

// ip_csum returns the checksum of a 20-byte IPv4 header (its checksum
// field zero).
static __always_inline __u16 ip_csum(__u16 *h)
{
	__u32 sum = 0;
#pragma unroll
	for (int i = 0; i < 10; i++)
		sum += h[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum;
}

// outer_header fills the 20-byte IPv4 header of a forwarded packet: from
// this node to the target, IP-in-IP or IPv6-in-IPv4, don't fragment, the
// mark and hop count in its id.
static __always_inline void outer_header(__u8 *h, __be32 from, __be32 to, int v6, __u32 inner_len, __u8 hops)
{
	__u16 *w = (__u16 *)h;
	h[0] = 0x45;
	h[1] = 0;
	w[1] = bpf_htons(inner_len + ENCAP_LEN);
	w[2] = bpf_htons(FWD_MARK | hops);
	w[3] = bpf_htons(0x4000);
	h[8] = 64;
	h[9] = v6 ? IPPROTO_IPV6_ : IPPROTO_IPIP;
	w[5] = 0;
	*(__be32 *)(h + 12) = from;
	*(__be32 *)(h + 16) = to;
	w[5] = ip_csum(w);
}

// forward sends the frame of flow f, which this node does not take, to
// node to, encapsulated, from this node's address self: a hop more than
// it made, out by the interface it came in by, to the next hop's MAC the
// agent resolved (the target's, or its gateway's on another subnet), from
// this interface's (mac). second: to a previous owner of the bucket,
// counted as a second chance.
//
// It is a global function, verified once, not at every way to reach it.
// The target is index ti of the forward table of version or, for ti 0,
// the first index of address to_addr (a later fragment's: its first went
// there). how packs slot << 16 | reason << 8 | second.
__attribute__((noinline)) int shoal_forward(shoal_ctx *ctx, struct flow *f, __u32 version)
{
	if (!f)
		return V_DROP;
	__u32 slot = f->slot, reason = f->reason;
	int second = f->second;
	if (slot >= MAX_SLOTS)
		slot = 0;
	version &= 3;
	struct fwd_table *ft = bpf_map_lookup_elem(&fwd, &version);
	struct settings *s = bpf_map_lookup_elem(&settings, &version);
	if (!ft || !s || !ft->self)
		return drop(slot, reason);
	__u8 *mac = s->mac;
	__u32 ti = 0;
	if (f->fwd_addr) {
		for (__u32 i = 1; i < MAX_PEERS; i++) {
			if (ft->peer[i] == f->fwd_addr) {
				ti = i;
				break;
			}
		}
	} else {
		__u32 rkey = version * MAX_SLOTS + slot;
		struct bucket_table *fb = bpf_map_lookup_elem(&fwd_buckets, &rkey);
		if (fb)
			ti = fb->state[f->bucket & (NUM_BUCKETS - 1)];
	}
	if (ti == 0 || ti >= MAX_PEERS)
		return drop(slot, reason);
	asm volatile("%[v] &= 63" : [v] "+r"(ti)); // MAX_PEERS - 1, for the verifier: the compiler drops a C mask
	__be32 to = ft->peer[ti];
	if (!to)
		return drop(slot, reason);
	if (f->first_frag) {
		// The later fragments go where this one goes.
		struct frag_key fk = f->fk;
		struct frag_verdict fv = {.slot = slot, .accept = 0, .reason = reason, .to = to};
		bpf_map_update_elem(&frags, &fk, &fv, BPF_ANY);
	}
	// A SYN forwarded here by the node this one acquires the bucket from
	// (its forward target while pending) is handed over: taken, as the
	// multicast modes take a SYN handed over to this node's MAC.
	if (f->pending && f->syn && !f->first_frag && f->from == to && !lease_expired()) {
		count(slot, C_HANDED_IN);
		return V_ACCEPT;
	}
	__be32 self = ft->self;
	__u32 len = f->ip_len;
	if (f->hops >= MAX_HOPS || to == self || !self) {
		fwd_drop_count(F_HOP_LIMIT);
		return drop(slot, reason);
	}
	// A packet from the network sits right after an untagged Ethernet
	// header (802.1Q-tagged ones are not forwarded); one forwarded here
	// behind its outer header, which is rewritten.
	int again = f->from != 0;
	if (f->l3_off != sizeof(struct ethhdr) + (again ? ENCAP_LEN : 0)) {
		fwd_drop_count(F_NO_ROUTE);
		return drop(slot, reason);
	}
	__u8 *nh = ft->mac[ti];
	if (!(nh[0] | nh[1] | nh[2] | nh[3] | nh[4] | nh[5])) {
		fwd_drop_count(F_NO_ROUTE);
		return drop(slot, reason);
	}
#ifdef SHOAL_TC
	int gso = ctx->gso_segs > 1;
#else
	int gso = 0;
#endif
	if (!gso && ft->mtu && len + ENCAP_LEN > ft->mtu) {
		fwd_drop_count(F_TOO_BIG);
		return drop(slot, reason);
	}
	// The new Ethernet and IPv4 headers, from buf + 2: the IPv4 header's
	// words aligned on the stack.
	__u8 buf[2 + sizeof(struct ethhdr) + ENCAP_LEN] __attribute__((aligned(4)));
	__u8 *hdr = buf + 2;
	__builtin_memcpy(hdr, nh, 6);
	__builtin_memcpy(hdr + 6, mac, 6);
	hdr[12] = 0x08;
	hdr[13] = 0x00;
	outer_header(hdr + sizeof(struct ethhdr), self, to, f->v6, len, f->hops + 1);
#ifdef SHOAL_TC
	if ((!again && bpf_skb_adjust_room(ctx, ENCAP_LEN, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_ENCAP_L3_IPV4)) ||
	    bpf_skb_store_bytes(ctx, 0, hdr, sizeof(buf) - 2, 0)) {
		fwd_drop_count(F_NO_ROUTE);
		return drop(slot, reason);
	}
	peer_count(to, second ? P_SECOND : P_OUT);
	count(slot, C_FORWARDED);
	return bpf_redirect(ctx->ifindex, 0) == TC_ACT_REDIRECT ? V_FWD : V_DROP;
#else
	if (!again && bpf_xdp_adjust_head(ctx, -ENCAP_LEN)) {
		fwd_drop_count(F_NO_ROUTE);
		return drop(slot, reason);
	}
	__u8 *data = (void *)(long)ctx->data;
	if (data + sizeof(buf) - 2 > (__u8 *)(long)ctx->data_end)
		return V_DROP;
	__builtin_memcpy(data, hdr, sizeof(buf) - 2);
	peer_count(to, second ? P_SECOND : P_OUT);
	count(slot, C_FORWARDED);
	return XDP_TX;
#endif
}

// shoal_encap checks a packet forwarded to this node (an IPv4 header right
// after an untagged Ethernet header): that it comes from a member, and
// fills f's hops and source; the packet is judged as the one it carries,
// and keeps its outer header until taken (shoal_strip) or forwarded on
// (rewritten in place, no second encapsulation). P_PASS: not a packet
// forwarded to this node (another tunnel's); P_FOREIGN: dropped, counted.
// It is a global function, verified once; it changes no packet data.
__attribute__((noinline)) int shoal_encap(shoal_ctx *ctx, struct flow *f, __u32 version)
{
	if (!f)
		return P_FOREIGN;
	version &= 3;
	if (version >= NUM_VERSIONS)
		return P_PASS;
	void *data_end = (void *)(long)ctx->data_end;
	__u8 *ip = (__u8 *)(long)ctx->data + sizeof(struct ethhdr);
	if (ip + 20 > (__u8 *)data_end)
		return P_PASS;
	struct fwd_table *ft = bpf_map_lookup_elem(&fwd, &version);
	if (!ft || !ft->self || *(__be32 *)(ip + 16) != ft->self)
		return P_PASS;
	__u16 id = bpf_ntohs(*(__u16 *)(ip + 4));
	if (ip[0] != 0x45 || (id & FWD_MARK_MASK) != FWD_MARK)
		return P_PASS;
	__be32 from = *(__be32 *)(ip + 12);
	struct peer_counters *pc = bpf_map_lookup_elem(&fwd_stats, &from);
	if (!pc) {
		fwd_drop_count(F_FOREIGN);
		return P_FOREIGN;
	}
	pc->n[P_IN]++;
	f->from = from;
	f->hops = id & 0xff;
	return P_JUDGE;
}

// shoal_strip takes the outer header off a forwarded packet this node takes
// (f->v6: it carries IPv6). It returns nonzero when it cannot.
__attribute__((noinline)) int shoal_strip(shoal_ctx *ctx, struct flow *f)
{
	if (!f)
		return 1;
	int inner6 = f->v6;
	__be16 inner = inner6 ? bpf_htons(ETH_P_IPV6_) : bpf_htons(ETH_P_IP_);
#ifdef SHOAL_TC
	__u64 flags = inner6 ? BPF_F_ADJ_ROOM_DECAP_L3_IPV6_ : BPF_F_ADJ_ROOM_DECAP_L3_IPV4_;
	if (bpf_skb_adjust_room(ctx, -ENCAP_LEN, BPF_ADJ_ROOM_MAC, flags) &&
	    (inner6 || bpf_skb_adjust_room(ctx, -ENCAP_LEN, BPF_ADJ_ROOM_MAC, 0)))
		return 1;
	if (bpf_skb_store_bytes(ctx, offsetof(struct ethhdr, h_proto), &inner, 2, 0))
		return 1;
#else
	struct ethhdr eth;
	__u8 *data = (void *)(long)ctx->data;
	if (data + sizeof(eth) > (__u8 *)(long)ctx->data_end)
		return 1;
	__builtin_memcpy(&eth, data, sizeof(eth));
	eth.h_proto = inner;
	if (bpf_xdp_adjust_head(ctx, ENCAP_LEN))
		return 1;
	data = (void *)(long)ctx->data;
	if (data + sizeof(eth) > (__u8 *)(long)ctx->data_end)
		return 1;
	__builtin_memcpy(data, &eth, sizeof(eth));
#endif
	return 0;
}

// prev_takes reports whether the tables of version prev take the SYN of f
// (OWNED, OWNED_DIRTY): its rule and bucket under prev's mapping, as
// filter.Classifier.prevTakes finds them.
static __always_inline int prev_takes(struct flow *f, __u32 prev)
{
	__u32 vidx;
	if (f->v6) {
		if (!vip6_index(prev, (__u8 *)f->vip_ip, &vidx))
			return 0;
	} else if (!vip_index(prev, f->vip_ip[0], &vidx)) {
		return 0;
	}
	__u32 slot = port_slot(prev, vidx, PROTO_TCP_IDX, bpf_ntohs(f->vip_port));
	if (slot >= MAX_SLOTS)
		slot = 0;
	__u32 rkey = prev * MAX_SLOTS + slot;
	struct rule_info *ri = bpf_map_lookup_elem(&rules, &rkey);
	struct settings *ps = bpf_map_lookup_elem(&settings, &prev);
	struct bucket_table *bt = bpf_map_lookup_elem(&buckets, &rkey);
	if (!ri || ri->disabled || !ps || !bt)
		return 0;
	struct flow g = {};
	key_client(&g, f->v6, ri->affinity, (__u8 *)f->client_ip, bpf_ntohs(f->client_port));
	__u32 nkey = g.nkey;
	if (nkey > MAX_KEY)
		nkey = MAX_KEY;
	__u32 bucket = shoal_hash(ps->seed, g.key, nkey) & (NUM_BUCKETS - 1);
	__u8 st = bt->state[bucket] & ST_MASK;
	return st == ST_OWNED || st == ST_OWNED_DIRTY;
}

// shoal_verdict is the verdict core both parsers hand their flow to: the
// fragment memory, the bucket, its state, the socket lookup, the counters.
// (As a global function it would be verified once, but the per-packet call
// and the flow read through memory cost 8 ns on the owned path; inlined,
// the verifier still sees it only a few times, since the parsers' ways to
// reach it are few once shoal_embedded6 is a function of its own.)
static __always_inline int shoal_verdict(shoal_ctx *ctx, struct flow *f, __u32 version)
{
	if (f->later_frag) {
		struct frag_key fk = f->fk;
		struct frag_verdict *fv = bpf_map_lookup_elem(&frags, &fk);
		if (fv) {
			__u32 fslot = fv->slot;
			if (fslot >= MAX_SLOTS)
				fslot = 0;
			struct settings *fs = bpf_map_lookup_elem(&settings, &version);
			if (!fv->accept && fv->to && fs && fs->routed) {
				// The node the first fragment went to.
				f->fwd_addr = fv->to;
				f->slot = fslot;
				f->reason = fv->reason;
				f->second = 0;
				return V_NOT_TAKEN;
			}
			if (!fv->accept)
				return drop(fslot, fv->reason);
			if (!fs)
				return V_PASS;
			return accept(ctx, fslot, fs->mac);
		}
	}

	__u32 slot = f->slot;
	if (slot >= MAX_SLOTS)
		slot = 0;
	struct settings *s = bpf_map_lookup_elem(&settings, &version);
	if (!s)
		return V_PASS;
	__u32 nkey = f->nkey;
	if (nkey > MAX_KEY)
		nkey = MAX_KEY;
	__u32 bucket = shoal_hash(s->seed, f->key, nkey) & (NUM_BUCKETS - 1);

	__u32 reason = 0;
	__u32 rkey = version * MAX_SLOTS + slot;
	struct bucket_table *bt = bpf_map_lookup_elem(&buckets, &rkey);
	__u8 raw = bt ? bt->state[bucket] : ST_NOT_OWNED;
	__u8 st = raw & ST_MASK;
	__u32 to = raw >> HAND_SHIFT;
	// A SYN handed over by its bucket's previous owner is this node's
	// while its tables hold the bucket pending: draining, about to be
	// acquired. Not once they take the bucket's SYNs (it took the flooded
	// copy of the same SYN), nor when the bucket is not this node's at all
	// or drains because this node released it (the handing node's view is
	// older: the SYN would land on a node that neither serves nor
	// announces it, while the owner in the newer view takes the flooded
	// copy), nor on a stalled node (its lease ended), nor when the flooded
	// copy made a request socket here just before the tables let go.
	// Handed SYNs are counted apart, so every node still judges each
	// client frame once.
	if (f->syn && !f->first_frag && !s->routed && to_me(ctx, s->mac)) {
		if (st != ST_DRAINING || to != HAND_PENDING || lease_expired() ||
		    holds_conn(ctx, f, (void *)(long)ctx->data, (void *)(long)ctx->data_end)) {
			count(slot, C_HANDED_REFUSED);
			return V_DROP;
		}
		count(slot, C_HANDED_IN);
		return V_ACCEPT; // addressed to this host already
	}
	struct rule_info *ri = bpf_map_lookup_elem(&rules, &rkey);
	if (ri && ri->disabled) {
		reason = R_DISABLED;
		goto verdict;
	}
	if ((st == ST_OWNED || st == ST_OWNED_DIRTY) && lease_expired())
		st = ST_DRAINING;

	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	switch (st) {
	case ST_OWNED:
		break;
	case ST_OWNED_DIRTY:
		if (f->tcp && !f->syn && !holds_conn(ctx, f, data, data_end))
			reason = R_DIRTY_NO_CONN;
		break;
	case ST_DRAINING:
		// A SYN opens a new connection, never this node's here, even if it
		// finds the TIME_WAIT socket of an old one on the same ports.
		if (!f->tcp || f->syn || !holds_conn(ctx, f, data, data_end))
			reason = R_DRAIN_NO_CONN;
		break;
	default:
		reason = R_NOT_OWNED;
	}
	// A SYN in a rule the previous tables map otherwise: if they take it
	// (this node owned the flow), it is taken while the new owner cannot
	// take it and handed over once it can; otherwise these tables judge it
	// alone, and it is never handed over from here (its owner under the
	// previous mapping, this node or another, takes the flooded copy).
	if (ri && ri->remap && f->syn && !f->first_frag) {
		__u32 prev = s->prev;
		if (reason && prev >= 1 && prev <= NUM_VERSIONS && !lease_expired() && prev_takes(f, prev - 1)) {
			if (to == HAND_KEEP || to == HAND_PENDING)
				reason = 0;
			else if (to && !s->routed)
				return hand_over(ctx, version, slot, to, s->mac, reason);
		}
		goto verdict;
	}
	// A stalled node hands nothing over: its view, and so who the new owner
	// is, may be long out of date.
	if (to && !s->routed && f->syn && !f->first_frag && (reason == R_NOT_OWNED || reason == R_DRAIN_NO_CONN) && !lease_expired())
		return hand_over(ctx, version, slot, to, s->mac, reason);

verdict:
	if (f->first_frag) {
		struct frag_key fk = f->fk;
		struct frag_verdict fv = {.slot = slot, .accept = !reason, .reason = reason};
		bpf_map_update_elem(&frags, &fk, &fv, BPF_ANY);
	}
	// Routed: what this node does not take goes to its owner, or, from a
	// bucket this node owns (acquired, or about to be), to the previous
	// owner that may hold its connection: the second chance.
	if (reason && reason != R_DISABLED && s->routed) {
		f->slot = slot;
		f->reason = reason;
		f->bucket = bucket;
		f->second = st == ST_OWNED_DIRTY || to == HAND_PENDING;
		f->pending = st == ST_DRAINING && to == HAND_PENDING;
		return V_NOT_TAKEN;
	}
	if (reason)
		return drop(slot, reason);
	// Accept: make the frame this host's, then let the stack have it.
	return accept(ctx, slot, s->mac);
}

// shoal_judge parses the frame of ctx and judges it (shoal_verdict).
static __always_inline int shoal_judge(shoal_ctx *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return V_PASS;
	__u16 et = eth->h_proto;
	__u8 *ip = (__u8 *)(eth + 1);
	if (et == bpf_htons(ETH_P_8021Q_)) {
		if (ip + 4 > (__u8 *)data_end)
			return V_PASS;
		et = *(__u16 *)(ip + 2);
		ip += 4;
	}
	int v6 = et == bpf_htons(ETH_P_IPV6_);
	if (et != bpf_htons(ETH_P_IP_) && !v6)
		return V_PASS;
	if (ip + (v6 ? 40 : 20) > (__u8 *)data_end)
		return V_PASS;

	__u32 zero = 0;
	__u32 *ver = bpf_map_lookup_elem(&active, &zero);
	if (!ver)
		return V_PASS;
	__u32 version = *ver;
	if (version >= NUM_VERSIONS)
		return V_PASS;

	struct flow f = {};
	__u8 *th = 0; // the TCP header, for the SYN-cookie check
	int p;
	if (!v6 && (ip[9] == IPPROTO_IPIP || ip[9] == IPPROTO_IPV6_) && ip == (__u8 *)(eth + 1)) {
		// Forwarded here by a member (routed mode): judged as the packet
		// it carries, which must be VIP traffic.
		int inner6 = ip[9] == IPPROTO_IPV6_;
		p = shoal_encap(ctx, &f, version);
		if (p == P_FOREIGN)
			return V_DROP;
		data = (void *)(long)ctx->data;
		data_end = (void *)(long)ctx->data_end;
		eth = data;
		ip = (__u8 *)(eth + 1);
		if (ip + 20 > (__u8 *)data_end)
			return V_PASS; // cannot happen: checked above
		if (p == P_JUDGE) {
			ip += ENCAP_LEN;
			v6 = inner6;
			if (ip + 20 > (__u8 *)data_end)
				return drop(0, R_MALFORMED);
		}
	}
	if (v6) {
		if (ip + 40 > (__u8 *)data_end)
			return f.from ? drop(0, R_MALFORMED) : V_PASS;
		p = parse6(ctx, data, ip, data_end, version, &f, &th);
	} else {
		if (ip + 20 > (__u8 *)data_end)
			return V_PASS;
		p = parse4(ip, data_end, version, &f, &th);
	}
	if (f.from && (p == P_PASS || p == P_HB_DROP)) {
		fwd_drop_count(F_FOREIGN); // not VIP traffic: nothing a member forwards
		return V_DROP;
	}
	switch (p) {
	case P_PASS:
		return V_PASS;
	case P_HB_DROP:
		return V_DROP;
	case P_MALFORMED:
		return drop(0, R_MALFORMED);
	}
	// VIP traffic: counted, accepted or dropped.
	f.l3_off = (long)ip - (long)data;
	if (th) {
		f.th_off = (long)th - (long)data;
		f.has_th = 1;
	}
	int v = shoal_verdict(ctx, &f, version);
	if (v == V_NOT_TAKEN)
		v = shoal_forward(ctx, &f, version);
	if (v == V_ACCEPT && f.from && shoal_strip(ctx, &f))
		return V_DROP;
	return v;
}

#ifndef SHOAL_TC
SEC("xdp")
int shoal_xdp(struct xdp_md *ctx)
{
	int v = shoal_judge(ctx);
	return v == V_ACCEPT ? XDP_PASS : v;
}

#else
#define TC_ACT_OK_ 0
#define TC_ACT_SHOT_ 2
#define PACKET_HOST_ 0

// shoal_tc is the same data plane for tc ingress (clsact): an accepted
// frame keeps its destination MAC and the skb is marked as this host's
// (bpf_skb_change_type), which a tc program can do and XDP cannot; a
// handed-over SYN leaves by the interface it came in by. A non-linear skb
// is made linear first, as generic XDP does, so both judge the same bytes.
// It is a build of its own (-DSHOAL_TC, the shoalTc objects), loaded over
// the XDP build's maps where the driver has no native XDP (veth included).
SEC("tc")
int shoal_tc(struct __sk_buff *skb)
{
	if ((long)skb->data_end - (long)skb->data < (long)skb->len)
		bpf_skb_pull_data(skb, skb->len);
	int v = shoal_judge(skb);
	if (v == V_DROP)
		return TC_ACT_SHOT_;
	if (v == V_ACCEPT)
		bpf_skb_change_type(skb, PACKET_HOST_);
	if (v == V_TX)
		return bpf_redirect(skb->ifindex, 0);
	if (v == V_FWD)
		return TC_ACT_REDIRECT;
	return TC_ACT_OK_;
}

// clamp_mss lowers the MSS option of the TCP SYN-ACK at th (doff bytes of
// header, at th_off in the skb) to mss, fixing the checksum.
static __always_inline void clamp_mss(struct __sk_buff *skb, __u8 *th, __u32 th_off, __u32 doff, void *data_end, __u16 mss)
{
	__u32 off = 20;
#pragma unroll
	for (int i = 0; i < 8; i++) {
		if (off + 4 > doff || off > 56)
			return;
		__u8 *o = th + off;
		if (o + 4 > (__u8 *)data_end)
			return;
		if (o[0] == 0)
			return;
		if (o[0] == 1) {
			off++;
			continue;
		}
		if (o[0] == 2 && o[1] == 4) {
			__be16 old = *(__be16 *)(o + 2), new = bpf_htons(mss);
			if (bpf_ntohs(old) <= mss)
				return;
			bpf_l4_csum_replace(skb, th_off + 16, old, new, 2);
			bpf_skb_store_bytes(skb, th_off + off + 2, &new, 2, 0);
			return;
		}
		if (o[1] < 2)
			return;
		off += o[1];
	}
}

// shoal_mss (tc egress, routed forwarding on) makes the SYN-ACKs this node
// sends from a VIP advertise an MSS that leaves room for the encapsulation
// (fwd.mss4, fwd.mss6): a client's full-size segment, forwarded to its
// owner by whichever node ECMP gave it to, then still fits the MTU.
SEC("tc")
int shoal_mss(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return TC_ACT_OK_;
	__u32 zero = 0;
	__u32 *ver = bpf_map_lookup_elem(&active, &zero);
	if (!ver)
		return TC_ACT_OK_;
	__u32 version = *ver;
	if (version >= NUM_VERSIONS)
		return TC_ACT_OK_;
	struct fwd_table *ft = bpf_map_lookup_elem(&fwd, &version);
	if (!ft || !ft->self)
		return TC_ACT_OK_;
	__u8 *ip = (__u8 *)(eth + 1);
	__u32 idx;
	if (eth->h_proto == bpf_htons(ETH_P_IP_) && ft->mss4) {
		if (ip + 20 > (__u8 *)data_end || ip[9] != IPPROTO_TCP)
			return TC_ACT_OK_;
		__u32 ihl = (ip[0] & 0x0f) * 4;
		if (ihl < 20 || ihl > 60 || !vip_index(version, *(__u32 *)(ip + 12), &idx))
			return TC_ACT_OK_;
		__u8 *th = ip + ihl;
		if (th + 20 > (__u8 *)data_end || (th[13] & 0x12) != 0x12)
			return TC_ACT_OK_;
		clamp_mss(skb, th, sizeof(*eth) + ihl, (th[12] >> 4) * 4, data_end, ft->mss4);
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6_) && ft->mss6) {
		if (ip + 40 > (__u8 *)data_end || ip[6] != IPPROTO_TCP || !vip6_index(version, ip + 8, &idx))
			return TC_ACT_OK_;
		__u8 *th = ip + 40;
		if (th + 20 > (__u8 *)data_end || (th[13] & 0x12) != 0x12)
			return TC_ACT_OK_;
		clamp_mss(skb, th, sizeof(*eth) + 40, (th[12] >> 4) * 4, data_end, ft->mss6);
	}
	return TC_ACT_OK_;
}
#endif

#ifndef SHOAL_TC
// shoal_hash_probe exposes shoal_hash to the tests: the packet holds seed,
// the number of key words (2 or 5) and five key words (host-endian), and
// the program writes the hash after them.
// It is loaded with the data plane but never attached.
SEC("xdp")
int shoal_hash_probe(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 *w = data;

	if ((void *)(w + 8) > data_end)
		return XDP_ABORTED;
	__u32 n = w[1];
	if (n > MAX_KEY)
		return XDP_ABORTED;
	__u32 k[MAX_KEY] = {w[2], w[3], w[4], w[5], w[6]};
	w[7] = shoal_hash(w[0], k, n);
	return XDP_PASS;
}
#endif

char _license[] SEC("license") = "Dual MIT/GPL";
