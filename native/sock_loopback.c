/* sock_loopback.c - the addresses of TCP over the sandbox's own loopback.
 *
 * Without a network policy, socket(AF_INET or AF_INET6, SOCK_STREAM) is an in-memory stream socket
 * of sys_socket.c, like an AF_UNIX one, named by an internet address instead of a path: what a
 * notebook's local servers need (http.server with urllib, asyncio's start_server and
 * open_connection, multiprocessing's Listener(('localhost', port)), logging's socket handlers,
 * dask's local cluster). Only the sandbox's loopback exists: bind takes 127.0.0.0/8, ::1, the
 * wildcard addresses and their v4-mapped forms (EADDRNOTAVAIL otherwise); connect reaches a
 * listener of the sandbox's own processes (looked up in their fd tables, as AF_UNIX names are) or
 * fails: ECONNREFUSED on the loopback, ENETUNREACH elsewhere. Nothing here ever reaches a host
 * socket: the host's 127.0.0.1 services (a Jupyter server among them) are not the sandbox's.
 *
 * Ports are the family's own namespace: an explicit port is EADDRINUSE while another bound or
 * listening socket of the family holds it on an overlapping address (a wildcard overlaps every
 * address of its family, an AF_INET6 wildcard without IPV6_V6ONLY the AF_INET ones too, as Linux's
 * dual-stack sockets); port 0 (and a connect or listen without bind) takes a free one of Linux's
 * ephemeral range. Any port may be bound: the namespace is private, so the privileged ports need
 * no privilege. A name is kept as Linux returns it (sockaddr_in, 16 bytes, or sockaddr_in6, 28),
 * so snapshots and saves keep it unchanged (file_socket.c).
 */
#include "util.h"
#include "memory.h"
#include "sandbox_state.h"
#include "process.h"
#include "fs.h"

#include <netinet/in.h>
#include <stdatomic.h>
#include <sys/socket.h>

#define EPHEMERAL_FIRST 32768 /* Linux's net.ipv4.ip_local_port_range */
#define EPHEMERAL_LAST 60999
#define EPHEMERAL_TRIES 256   /* ports tried before EADDRNOTAVAIL: each try scans the family's fds */

static atomic_uint next_ephemeral;

/* An address in one form for both families: AF_INET's as v4-mapped (::ffff:a.b.c.d). */
typedef struct {
    uint8_t a6[16];
    uint16_t port; /* host byte order */
} lo_addr;

static const uint8_t V4_MAPPED[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

static int is_v4(const lo_addr *a) { return !memcmp(a->a6, V4_MAPPED, sizeof V4_MAPPED); }

static int is_any(const lo_addr *a) {
    static const uint8_t zero[16];
    return !memcmp(a->a6, zero, 16) || (is_v4(a) && !memcmp(a->a6 + 12, zero, 4));
}

static int is_local(const lo_addr *a) {
    static const uint8_t one6[16] = {[15] = 1};
    return is_any(a) || !memcmp(a->a6, one6, 16) || (is_v4(a) && a->a6[12] == 127);
}

/* a becomes its space's loopback address: 127.0.0.1 (v4-mapped) or ::1; its port stays. */
static void set_loopback(lo_addr *a, int v4) {
    memset(a->a6, 0, 16);
    if (v4) {
        memcpy(a->a6, V4_MAPPED, sizeof V4_MAPPED);
        a->a6[12] = 127;
    }
    a->a6[15] = 1;
}

int zb_lo_family(const zb_usock *u) {
    sa_family_t family;
    memcpy(&family, u->name, sizeof family);
    return family;
}

/* A name's bytes (written by this file, or loaded and checked by file_socket.c) as an lo_addr. */
static lo_addr from_name(const uint8_t *name) {
    lo_addr a = {{0}, 0};
    sa_family_t family;
    memcpy(&family, name, sizeof family);
    if (family == AF_INET) {
        struct sockaddr_in in;
        memcpy(&in, name, sizeof in);
        memcpy(a.a6, V4_MAPPED, sizeof V4_MAPPED);
        memcpy(a.a6 + 12, &in.sin_addr, 4);
        a.port = ntohs(in.sin_port);
    } else {
        struct sockaddr_in6 in6;
        memcpy(&in6, name, sizeof in6);
        memcpy(a.a6, &in6.sin6_addr, 16);
        a.port = ntohs(in6.sin6_port);
    }
    return a;
}

/* a as a name of a socket of `family` (an AF_INET one only holds v4 addresses: the caller's). */
static uint32_t to_name(const lo_addr *a, int family, uint8_t out[ZB_USOCK_NAME_MAX]) {
    memset(out, 0, ZB_USOCK_NAME_MAX);
    if (family == AF_INET) {
        struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons(a->port)};
        memcpy(&in.sin_addr, a->a6 + 12, 4);
        memcpy(out, &in, sizeof in);
        return sizeof in;
    }
    struct sockaddr_in6 in6 = {.sin6_family = AF_INET6, .sin6_port = htons(a->port)};
    memcpy(&in6.sin6_addr, a->a6, 16);
    memcpy(out, &in6, sizeof in6);
    return sizeof in6;
}

void zb_lo_unbound(zb_usock *u, int family) {
    lo_addr any = {{0}, 0};
    if (family == AF_INET) memcpy(any.a6, V4_MAPPED, sizeof V4_MAPPED);
    u->name_len = to_name(&any, family, u->name);
    u->peer_len = to_name(&any, family, u->peer);
}

int zb_lo_bound(const zb_usock *u) { return from_name(u->name).port != 0; }

long zb_lo_read_addr(zb_sandbox *sb, int family, uint64_t addr, uint64_t len, uint8_t out[ZB_USOCK_NAME_MAX],
                     uint32_t *out_len) {
    uint8_t raw[sizeof(struct sockaddr_in6)] = {0};
    uint64_t need = family == AF_INET ? sizeof(struct sockaddr_in) : 24; /* Linux's SIN6_LEN_RFC2133 */
    if ((int64_t)len < 0 || len < need || len > sizeof(struct sockaddr_storage)) return -EINVAL; /* as Linux */
    if (zb_copy_from_guest(sb, raw, addr, ZB_MIN(len, (uint64_t)sizeof raw)) < 0) return -EFAULT;
    sa_family_t got;
    memcpy(&got, raw, sizeof got);
    if (got != family) return -EAFNOSUPPORT;
    lo_addr a = from_name(raw);
    *out_len = to_name(&a, family, out); /* flow info and scope id dropped: one link, the loopback */
    return 0;
}

/* The address spaces a bound name takes: AF_INET's (v4) and AF_INET6's (v6). */
static void spaces(const zb_usock *u, const lo_addr *a, int *v4, int *v6) {
    int family = zb_lo_family(u);
    *v4 = family == AF_INET || is_v4(a) || (is_any(a) && !is_v4(a) && !u->v6only);
    *v6 = family == AF_INET6 && !is_v4(a);
}

static int overlap(const zb_usock *x, const lo_addr *a, const zb_usock *y, const lo_addr *b) {
    if (a->port != b->port) return 0;
    int x4, x6, y4, y6;
    spaces(x, a, &x4, &x6);
    spaces(y, b, &y4, &y6);
    int same = is_any(a) || is_any(b) || !memcmp(a->a6, b->a6, 16);
    return ((x4 && y4) || (x6 && y6)) && same;
}

typedef struct {
    const zb_usock *self;
    int (*fn)(const zb_usock *, const void *);
    const void *arg;
} inet_query;

static int inet_match(const zb_usock *u, const void *arg) {
    const inet_query *q = arg;
    return u != q->self && zb_lo_family(u) != AF_UNIX && q->fn(u, q->arg);
}

/* The first internet socket of sb's family (every process's fd table) but `self` that fn takes. */
static zb_file *each_inet(zb_sandbox *sb, const zb_usock *self, int (*fn)(const zb_usock *, const void *),
                          const void *arg) {
    const inet_query q = {self, fn, arg};
    return zb_usock_find(sb, inet_match, &q);
}

typedef struct {
    const zb_usock *u;
    lo_addr a;
} lo_claim;

static int holds_port(const zb_usock *u, const void *arg) {
    return from_name(u->name).port == ((const lo_claim *)arg)->a.port;
}

static int bound_over(const zb_usock *u, const void *arg) {
    const lo_claim *c = arg;
    lo_addr held = from_name(u->name);
    return u->state != ZB_USOCK_CONNECTED && overlap(u, &held, c->u, &c->a);
}

/* A free ephemeral port (used by no internet socket of the family), or 0. */
static uint16_t ephemeral(zb_sandbox *sb, const zb_usock *self) {
    const unsigned range = EPHEMERAL_LAST - EPHEMERAL_FIRST + 1;
    for (int tries = 0; tries < EPHEMERAL_TRIES; tries++) {
        lo_claim c = {self, {{0}, (uint16_t)(EPHEMERAL_FIRST + atomic_fetch_add(&next_ephemeral, 1) % range)}};
        if (!each_inet(sb, self, holds_port, &c)) return c.a.port;
    }
    return 0;
}

long zb_lo_bind(zb_sandbox *sb, zb_usock *u, const uint8_t *name) {
    lo_addr a = from_name(name);
    if (!is_local(&a)) return -EADDRNOTAVAIL;
    if (zb_lo_family(u) == AF_INET6 && is_v4(&a) && u->v6only) return -EINVAL;
    if (!a.port) {
        if (!(a.port = ephemeral(sb, u))) return -EADDRNOTAVAIL;
    } else {
        lo_claim c = {u, a};
        if (each_inet(sb, u, bound_over, &c)) return -EADDRINUSE;
    }
    u->name_len = to_name(&a, zb_lo_family(u), u->name);
    return 0;
}

typedef struct {
    lo_addr target; /* normalised: a wildcard is the loopback */
    int v4;         /* the target is in AF_INET's space */
} lo_dial;

static int listens_for(const zb_usock *u, const void *arg) {
    const lo_dial *d = arg;
    lo_addr l = from_name(u->name);
    if (u->state != ZB_USOCK_LISTENING || l.port != d->target.port) return 0;
    int v4, v6;
    spaces(u, &l, &v4, &v6);
    if (!(d->v4 ? v4 : v6)) return 0;
    return is_any(&l) || !memcmp(l.a6, d->target.a6, 16);
}

long zb_lo_connect(zb_sandbox *sb, const zb_usock *u, const uint8_t *target_name, zb_file **listener,
                   zb_conn_names *names) {
    int family = zb_lo_family(u);
    lo_dial d = {from_name(target_name), 0};
    d.v4 = is_v4(&d.target);
    if (!is_local(&d.target)) {
        if (!sb->logged_no_network++)
            zb_log(sb, "connect to a non-loopback address refused with ENETUNREACH: the sandbox has no network; "
                       "its own loopback (127.0.0.1, ::1) works between its threads and processes");
        return -ENETUNREACH;
    }
    if (is_any(&d.target)) set_loopback(&d.target, d.v4); /* connect(0.0.0.0) is the local host, as in Linux */
    if (!(*listener = each_inet(sb, u, listens_for, &d))) return -ECONNREFUSED;
    lo_addr local = from_name(u->name);
    if (is_any(&local)) set_loopback(&local, d.v4); /* the loopback of the target's space (a v6 target is ::1) */
    if (!local.port && !(local.port = ephemeral(sb, u))) return -EADDRNOTAVAIL;
    names->own_len = to_name(&local, family, names->own);
    names->peer_len = to_name(&d.target, family, names->peer);
    int server_family = zb_lo_family(zb_usock_of(*listener));
    names->server_len = to_name(&d.target, server_family, names->server);
    names->server_peer_len = to_name(&local, server_family, names->server_peer);
    return 0;
}
