// SPDX-License-Identifier: (MIT OR GPL-2.0)
//
// shoal's XDP data plane: keep the VIP packets this node owns, drop the rest
// of the VIP traffic, pass everything else untouched. The rules are the Go
// reference classifier's (filter/classify.go); a differential test runs both
// on the same frames. All tables exist twice (version 0 and 1); the loader
// fills the inactive version and then flips `active`, so a packet, which
// reads `active` once, is judged by one whole version.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// Capacities; filter/xdp_linux.go has the same numbers.
#define MAX_VIPS 64    // a power of two: VIP indexes are masked with it
#define MAX_SLOTS 257  // rule slots: 0 is DefaultRule, 1..256 port rules
#define NUM_BUCKETS 4096
#define NUM_PORTS 65536
#define FRAG_ENTRIES 16384 // datagrams whose first fragment's verdict is remembered
#define MAX_HB_PEERS 1024

// Bucket states (filter.BucketState).
#define ST_NOT_OWNED 0
#define ST_OWNED 1
#define ST_OWNED_DIRTY 2
#define ST_DRAINING 3

// Counter indexes: 0 accepted, then filter.DropReason.
#define C_ACCEPTED 0
#define R_NOT_OWNED 1
#define R_DIRTY_NO_CONN 2
#define R_DRAIN_NO_CONN 3
#define R_DISABLED 4
#define R_MALFORMED 5
#define NUM_COUNTERS 6

// Affinities (filter.Affinity).
#define AFF_NONE 0
#define AFF_SINGLE 1
#define AFF_NETWORK 2

#define ETH_P_8021Q_ 0x8100
#define ETH_P_IP_ 0x0800
#define BPF_TCP_LISTEN_ 10
#define IP_MF 0x2000
#define IP_OFFSET 0x1fff

#define VIP_DIR 256

struct vip_bucket {
	__u32 n;
	__u32 addr[MAX_VIPS]; // network byte order, as in the packet
	__u8 idx[MAX_VIPS];
};

struct settings {
	__u32 seed;
	__u8 mac[6];
	__u8 pad[2];
};

struct rule_info {
	__u32 id; // filter.RuleID, for debugging
	__u8 affinity;
	__u8 disabled;
	__u8 pad[2];
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

// active[0] is the version (0 or 1) packets are judged by.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} active SEC(".maps");

// settings[version]: hash seed and the interface MAC accepted frames get.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct settings);
} settings SEC(".maps");

// vips[version*VIP_DIR + last octet of the address]: the VIPs ending in
// that octet and their indexes. An array lookup and a compare or two cost
// less than a hash map lookup, and every packet, VIP or not, pays this one.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * VIP_DIR);
	__type(key, __u32);
	__type(value, struct vip_bucket);
} vips SEC(".maps");

// ports[(version*MAX_VIPS + vip index)*2 + (0 tcp, 1 udp)]: port -> slot.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * MAX_VIPS * 2);
	__type(key, __u32);
	__type(value, struct port_table);
} ports SEC(".maps");

// rules[version*MAX_SLOTS + slot]: the rule's affinity and whether it is disabled.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * MAX_SLOTS);
	__type(key, __u32);
	__type(value, struct rule_info);
} rules SEC(".maps");

// buckets[version*MAX_SLOTS + slot]: this node's state for each bucket.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * MAX_SLOTS);
	__type(key, __u32);
	__type(value, struct bucket_table);
} buckets SEC(".maps");

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
// ports. Every node sees the same fragments, so the decisions agree.
struct frag_key {
	__be32 src, dst;
	__be16 id;
	__u8 proto;
	__u8 pad;
};

struct frag_verdict {
	__u16 slot;
	__u8 accept;
	__u8 reason;
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
// loader may overwrite it. The program never reads it.
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

// shoal_hash mirrors filter.Hash: MurmurHash3 x86_32 of two words.
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

static __always_inline __u32 shoal_hash(__u32 seed, __u32 a, __u32 b)
{
	__u32 h = seed;
	h = murmur_round(h, a);
	h = murmur_round(h, b);
	h ^= 8;
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

// A packet's flow, as the state rules need it.
struct flow {
	__u32 slot;
	__u32 a, b;     // key words
	__u8 tcp;       // TCP with a known 4-tuple (or an ICMP error about one)
	__u8 syn;
	__u8 cookie;    // a TCP ACK (no SYN, no RST) that may complete a SYN-cookie handshake
	__be32 client_ip, vip_ip;
	__be16 client_port, vip_port;
};

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
	return XDP_DROP;
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

static __always_inline void flow_key(struct flow *f, __u8 aff, __u32 ip, __u16 port)
{
	if (aff == AFF_NONE) {
		f->a = ip;
		f->b = port;
	} else if (aff == AFF_NETWORK) {
		f->a = ip & 0xffffff00;
		f->b = 0;
	} else {
		f->a = ip;
		f->b = 0;
	}
}

// holds_conn asks the socket table whether this node holds a connection:
// a socket that is not a listener, or, for an ACK that finds only the
// listener, a valid SYN cookie (the kernel answered the SYN with a cookie
// under SYN-flood pressure and keeps no request socket). iph and th are the
// packet's IPv4 and TCP headers, 20 bytes each within the packet.
static __always_inline int holds_conn(struct xdp_md *ctx, struct flow *f, void *iph, void *th)
{
	struct bpf_sock_tuple t = {};
	t.ipv4.saddr = f->client_ip;
	t.ipv4.daddr = f->vip_ip;
	t.ipv4.sport = f->client_port;
	t.ipv4.dport = f->vip_port;
	struct bpf_sock *sk = bpf_skc_lookup_tcp(ctx, &t, sizeof(t.ipv4), BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return 0;
	int held = sk->state != BPF_TCP_LISTEN_;
	if (!held && f->cookie && th)
		held = bpf_tcp_check_syncookie(sk, iph, 20, th, 20) == 0;
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

SEC("xdp")
int shoal_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return XDP_PASS;
	__u16 et = eth->h_proto;
	__u8 *ip = (__u8 *)(eth + 1);
	if (et == bpf_htons(ETH_P_8021Q_)) {
		if (ip + 4 > (__u8 *)data_end)
			return XDP_PASS;
		et = *(__u16 *)(ip + 2);
		ip += 4;
	}
	if (et != bpf_htons(ETH_P_IP_))
		return XDP_PASS;
	if (ip + 20 > (__u8 *)data_end)
		return XDP_PASS;

	__u32 zero = 0;
	__u32 *ver = bpf_map_lookup_elem(&active, &zero);
	if (!ver)
		return XDP_PASS;
	__u32 version = *ver & 1;

	__u32 vidx;
	if (!vip_index(version, *(__u32 *)(ip + 16), &vidx))
		return heartbeat_ok(ip, data_end) ? XDP_PASS : XDP_DROP;

	// From here on the packet is VIP traffic: counted, accepted or dropped.
	__u32 avail = (__u32)((long)data_end - (long)ip);
	__u32 ihl = (ip[0] & 0x0f) * 4;
	__u32 total = bpf_ntohs(*(__u16 *)(ip + 2));
	if ((ip[0] >> 4) != 4 || ihl < 20 || total < ihl || total > avail)
		return drop(0, R_MALFORMED);

	struct flow f = {};
	__u32 src = bpf_ntohl(*(__u32 *)(ip + 12));
	__u8 proto = ip[9];
	__u32 l4len = total - ihl;
	__u8 *l4 = ip + ihl;
	struct rule_info *ri;
	__u32 rkey;
	__u8 *th = 0; // the TCP header, for the SYN-cookie check
	__u16 fragoff = bpf_ntohs(*(__u16 *)(ip + 6));
	int first_frag = (fragoff & (IP_MF | IP_OFFSET)) == IP_MF;
	struct frag_key fk = {};
	if (fragoff & (IP_MF | IP_OFFSET)) {
		fk.src = *(__u32 *)(ip + 12);
		fk.dst = *(__u32 *)(ip + 16);
		fk.id = *(__u16 *)(ip + 4);
		fk.proto = proto;
	}

	if (fragoff & IP_OFFSET) {
		// A later fragment follows its datagram's first fragment.
		struct frag_verdict *fv = bpf_map_lookup_elem(&frags, &fk);
		if (fv) {
			__u32 fslot = fv->slot;
			if (!fv->accept)
				return drop(fslot, fv->reason);
			struct settings *fs = bpf_map_lookup_elem(&settings, &version);
			if (!fs)
				return XDP_PASS;
			__builtin_memcpy(eth->h_dest, fs->mac, 6);
			count(fslot, C_ACCEPTED);
			return XDP_PASS;
		}
		// Its first fragment was not seen (or forgotten): rule for
		// port 0, key (client IP, 0), as every node judges it alike.
		if (proto == IPPROTO_TCP)
			f.slot = port_slot(version, vidx, PROTO_TCP_IDX, 0);
		else if (proto == IPPROTO_UDP)
			f.slot = port_slot(version, vidx, PROTO_UDP_IDX, 0);
		f.a = src;
		goto judge;
	}

	if (proto == IPPROTO_TCP || proto == IPPROTO_UDP) {
		if (proto == IPPROTO_TCP) {
			if (l4len < 20)
				return drop(0, R_MALFORMED);
			if (l4 + 20 > (__u8 *)data_end)
				return drop(0, R_MALFORMED);
			__u32 doff = (l4[12] >> 4) * 4;
			if (doff < 20 || doff > l4len)
				return drop(0, R_MALFORMED);
		} else {
			if (l4len < 8)
				return drop(0, R_MALFORMED);
			if (l4 + 8 > (__u8 *)data_end)
				return drop(0, R_MALFORMED);
		}
		__u16 sport = bpf_ntohs(*(__u16 *)l4);
		__u16 dport = bpf_ntohs(*(__u16 *)(l4 + 2));
		f.slot = port_slot(version, vidx, proto == IPPROTO_TCP ? PROTO_TCP_IDX : PROTO_UDP_IDX, dport);
		rkey = version * MAX_SLOTS + f.slot;
		ri = bpf_map_lookup_elem(&rules, &rkey);
		flow_key(&f, ri ? ri->affinity : AFF_SINGLE, src, sport);
		if (proto == IPPROTO_TCP) {
			f.tcp = 1;
			f.syn = (l4[13] & 0x12) == 0x02;
			f.cookie = (l4[13] & 0x16) == 0x10; // ACK without SYN or RST
			th = l4;
			f.client_ip = *(__u32 *)(ip + 12);
			f.vip_ip = *(__u32 *)(ip + 16);
			f.client_port = *(__u16 *)l4;
			f.vip_port = *(__u16 *)(l4 + 2);
		}
		goto judge;
	}

	if (proto == IPPROTO_ICMP) {
		if (l4len < 8)
			return drop(0, R_MALFORMED);
		if (l4 + 8 > (__u8 *)data_end)
			return drop(0, R_MALFORMED);
		__u8 type = l4[0];
		if (type == 3 || type == 11 || type == 12) {
			// An error: judge it as the quoted flow's packets.
			__u8 *e = l4 + 8;
			__u32 elen = l4len - 8;
			if (elen < 20)
				return drop(0, R_MALFORMED);
			if (e + 20 > (__u8 *)data_end)
				return drop(0, R_MALFORMED);
			__u32 eihl = (e[0] & 0x0f) * 4;
			if ((e[0] >> 4) != 4 || eihl < 20 || eihl > elen)
				return drop(0, R_MALFORMED);
			__u32 evidx;
			if (!vip_index(version, *(__u32 *)(e + 12), &evidx)) {
				f.a = src; // not about a VIP flow: like any other ICMP
				goto judge;
			}
			__u32 client = bpf_ntohl(*(__u32 *)(e + 16));
			__u8 eproto = e[9];
			if (eproto != IPPROTO_TCP && eproto != IPPROTO_UDP) {
				f.a = client;
				goto judge;
			}
			__u32 pidx = eproto == IPPROTO_TCP ? PROTO_TCP_IDX : PROTO_UDP_IDX;
			if (bpf_ntohs(*(__u16 *)(e + 6)) & 0x1fff) {
				f.slot = port_slot(version, evidx, pidx, 0);
				f.a = client;
				goto judge;
			}
			if (eihl + 4 > elen)
				return drop(0, R_MALFORMED);
			__u8 *ep = e + eihl;
			if (ep + 4 > (__u8 *)data_end)
				return drop(0, R_MALFORMED);
			__u16 vport = bpf_ntohs(*(__u16 *)ep);
			__u16 cport = bpf_ntohs(*(__u16 *)(ep + 2));
			f.slot = port_slot(version, evidx, pidx, vport);
			rkey = version * MAX_SLOTS + f.slot;
			ri = bpf_map_lookup_elem(&rules, &rkey);
			flow_key(&f, ri ? ri->affinity : AFF_SINGLE, client, cport);
			if (eproto == IPPROTO_TCP) {
				f.tcp = 1;
				f.client_ip = *(__u32 *)(e + 16);
				f.vip_ip = *(__u32 *)(e + 12);
				f.client_port = *(__u16 *)(ep + 2);
				f.vip_port = *(__u16 *)ep;
			}
			goto judge;
		}
	}
	// ICMP that is not an error, and other protocols.
	f.a = src;

judge:;
	__u32 slot = f.slot;
	if (slot >= MAX_SLOTS)
		slot = 0;
	struct settings *s = bpf_map_lookup_elem(&settings, &version);
	if (!s)
		return XDP_PASS;
	__u32 bucket = shoal_hash(s->seed, f.a, f.b) & (NUM_BUCKETS - 1);

	__u32 reason = 0;
	rkey = version * MAX_SLOTS + slot;
	ri = bpf_map_lookup_elem(&rules, &rkey);
	if (ri && ri->disabled) {
		reason = R_DISABLED;
		goto verdict;
	}
	struct bucket_table *bt = bpf_map_lookup_elem(&buckets, &rkey);
	__u8 st = bt ? bt->state[bucket] : ST_NOT_OWNED;
	if ((st == ST_OWNED || st == ST_OWNED_DIRTY) && lease_expired())
		st = ST_DRAINING;

	switch (st) {
	case ST_OWNED:
		break;
	case ST_OWNED_DIRTY:
		if (f.tcp && !f.syn && !holds_conn(ctx, &f, ip, th))
			reason = R_DIRTY_NO_CONN;
		break;
	case ST_DRAINING:
		// A SYN opens a new connection, never this node's here, even if it
		// finds the TIME_WAIT socket of an old one on the same ports.
		if (!f.tcp || f.syn || !holds_conn(ctx, &f, ip, th))
			reason = R_DRAIN_NO_CONN;
		break;
	default:
		reason = R_NOT_OWNED;
	}

verdict:
	if (first_frag) {
		struct frag_verdict fv = {.slot = slot, .accept = !reason, .reason = reason};
		bpf_map_update_elem(&frags, &fk, &fv, BPF_ANY);
	}
	if (reason)
		return drop(slot, reason);
	// Accept: make the frame this host's, then let the stack have it.
	__builtin_memcpy(eth->h_dest, s->mac, 6);
	count(slot, C_ACCEPTED);
	return XDP_PASS;
}

// shoal_hash_probe exposes shoal_hash to the tests: the packet holds seed,
// a and b (host-endian words) and the program writes the hash after them.
// It is loaded with the data plane but never attached.
SEC("xdp")
int shoal_hash_probe(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 *w = data;

	if ((void *)(w + 4) > data_end)
		return XDP_ABORTED;
	w[3] = shoal_hash(w[0], w[1], w[2]);
	return XDP_PASS;
}

char _license[] SEC("license") = "Dual MIT/GPL";
