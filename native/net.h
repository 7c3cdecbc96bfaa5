/* net.h - the network layer: a session's egress policy (net_policy.c) and the sandbox's DNS
 * resolver (net_dns.c). Pure data: nothing here knows a sandbox; the socket file kind
 * (file_inet.c) and its syscalls (sys_inet.c) ask these whether and where a guest may connect.
 *
 * The policy is built by the host only (zeroboot_kernel/network_policy.py parses ZEROBOOT_NETWORK
 * and calls zb_net_allow / zb_net_add_host), then installed on the engine (zb_engine_set_network);
 * nothing the guest does can change it. It also holds what the session learned: the addresses
 * that allowed names resolved to through the sandbox's resolver (the only names connect trusts),
 * and the counters %sandbox stats shows.
 */
#ifndef ZB_NET_H
#define ZB_NET_H
#include "util.h"

#include <netinet/in.h>
#include <sys/socket.h>

/* The resolver the guest's /etc/resolv.conf names (TEST-NET-1: never routed anywhere): UDP
 * datagrams to it are answered by the engine, nothing else reaches it. */
#define ZB_NET_RESOLVER_V4 0xc0000235u /* 192.0.2.53, host byte order */
#define ZB_NET_RESOLVER_PORT 53

#define ZB_NET_MAX_RULES 256
#define ZB_NET_MAX_HOSTS 256
#define ZB_NET_MAX_RESOLVED 4096   /* remembered addresses (oldest forgotten first) */
#define ZB_NET_MAX_ANSWERS 8       /* addresses in one DNS answer (fits 512 bytes) */
#define ZB_NET_NAME_MAX 253

/* An address of either family: v4 addresses are held in the first 4 bytes. */
typedef struct zb_net_addr {
    int family;              /* AF_INET or AF_INET6 */
    uint8_t b[16];
} zb_net_addr;

typedef struct zb_net_rule {
    int kind;                /* ZB_NET_NAME, ZB_NET_SUFFIX, ZB_NET_CIDR4, ZB_NET_CIDR6 */
    char name[ZB_NET_NAME_MAX + 1]; /* names: lower case, no trailing dot; suffixes without "*." */
    zb_net_addr addr;        /* CIDRs: the network (host bits zero) */
    int prefix;
    int port;                /* 1-65535, or 0 for any port */
} zb_net_rule;

typedef struct zb_net_host {  /* the operator's static name -> address map (ZEROBOOT_NETWORK_HOSTS) */
    char name[ZB_NET_NAME_MAX + 1];
    zb_net_addr addr;
} zb_net_host;

typedef struct zb_net_resolved {
    zb_net_addr addr;
    int rule;                /* the name rule that allowed the query */
    int from_hosts;          /* the answer came from the operator's map, not from DNS */
    char name[ZB_NET_NAME_MAX + 1];
} zb_net_resolved;

struct zb_net {
    zb_net_rule rules[ZB_NET_MAX_RULES];
    int nrules;
    zb_net_host hosts[ZB_NET_MAX_HOSTS];
    int nhosts;
    zb_net_resolved *resolved; /* a ring of ZB_NET_MAX_RESOLVED */
    int nresolved, next_resolved;
    zb_net_stats stats;
    char last_refused_name[ZB_NET_NAME_MAX + 1]; /* the resolver's last refusal note (A and AAAA ask twice) */
    int max_connections;     /* host connections open at once, all sandboxes together (0: no limit) */
    uint64_t rate;           /* bytes per second sent and received together (0: no limit) */
    double tokens;           /* the rate's token bucket (at most one second's worth) */
    int64_t tokens_ns;       /* when it was last filled */
    /* the host's DNS server the engine asks for allowed names (zb_net_set_resolver, else the
     * first nameserver of the host's /etc/resolv.conf, read at the first lookup) */
    struct sockaddr_storage upstream;
    socklen_t upstream_len;  /* 0: not known yet */
    int upstream_tried;      /* /etc/resolv.conf was read (it may have named none) */
};

/* How long a host lookup may take before the guest gets SERVFAIL (the guest's libc, with the
 * sandbox's resolv.conf "timeout:2 attempts:1", gives up sooner): a lookup never blocks the engine,
 * it is a datagram the guest's socket waits for like any other (file_inet.c). */
#define ZB_NET_LOOKUP_TIMEOUT_NS (5 * (int64_t)1000000000)

/* A question that needs the host's DNS (zb_dns_answer's "later"): the guest's question section
 * (for the reply), and what to ask. */
typedef struct zb_dns_question {
    uint8_t q[12 + ZB_NET_NAME_MAX + 2 + 4]; /* the guest's header and question, as it sent them */
    size_t qend;
    char name[ZB_NET_NAME_MAX + 1];
    int rule, type;          /* the allowing name rule; T_A (1) or T_AAAA (28) */
} zb_dns_question;

/* Lower-case, validated copy of a host name (letters, digits, '-', '_', dots between labels of
 * 1-63 bytes, at most 253 bytes, one trailing dot dropped): 0, or -1 if it is no host name. */
int zb_net_name_normalize(const char *in, size_t len, char out[ZB_NET_NAME_MAX + 1]);
/* The index of the first name or suffix rule matching the (normalized) name, or -1. */
int zb_net_name_rule(const zb_net *n, const char *name);
/* Resolve an allowed name for the guest from the operator's map, else the host's /etc/hosts;
 * remembers what it found for connect. Returns the number of addresses of `family` written to
 * out (at most max), or ZB_NET_ASK_DNS when neither lists the name (the host's DNS server is
 * asked, without blocking: zb_dns_host_query). */
#define ZB_NET_ASK_DNS (-2)
int zb_net_resolve(zb_net *n, int rule, const char *name, int family, zb_net_addr *out, int max);
/* What connect trusts: addr is what the allowed name (of rule) resolved to. */
void zb_net_remember(zb_net *n, int rule, const char *name, const zb_net_addr *a, int from_hosts);
/* May the guest connect to addr:port? 0, or -EACCES with a sentence for the user in why. */
int zb_net_check(const zb_net *n, const zb_net_addr *addr, int port, char *why, size_t whylen);
/* An address as text (v6 in brackets when with_port is set), for notes and logs. */
void zb_net_addr_text(const zb_net_addr *a, int port, char *out, size_t len);
/* A public (globally routed unicast) address: only such an address may be reached through a name
 * that DNS answered (loopback, private, link-local, ... need a CIDR rule: no DNS rebinding). */
int zb_net_addr_public(const zb_net_addr *a);

/* net_dns.c: answer one query datagram from the guest into out (cap bytes, at least 512): the
 * response's length, or 0 to drop the datagram (too short to answer). Every field is checked;
 * compressed names, several questions and non-queries are refused (FORMERR / NOTIMP), names the
 * policy does not allow get NXDOMAIN and a line in refused (empty otherwise). */
size_t zb_dns_answer(zb_net *n, const uint8_t *q, size_t qlen, uint8_t *out, size_t cap, char *refused, size_t rlen,
                     zb_dns_question *later);
/* Names not in the operator's map nor the host's /etc/hosts need the host's DNS: then
 * zb_dns_answer returns 0 with later->qend set (0 otherwise), and the caller sends
 * zb_dns_host_query to the upstream server and, when its response arrives (or time is up:
 * response NULL), builds the guest's answer with zb_dns_host_reply (remembering the allowed
 * addresses for connect). Lengths, or 0 when nothing fits. */
size_t zb_dns_host_query(const zb_dns_question *qn, uint16_t id, uint8_t *out, size_t cap);
size_t zb_dns_host_reply(zb_net *n, const zb_dns_question *qn, uint16_t id, const uint8_t *response, size_t rlen,
                         uint8_t *out, size_t cap);
/* The upstream DNS server's address (net->upstream), read from /etc/resolv.conf if no resolver
 * was set: 0, or -1 if there is none. */
int zb_net_upstream(zb_net *n);

#endif
