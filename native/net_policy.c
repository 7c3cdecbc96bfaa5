/* net_policy.c - a session's network egress policy: the operator's allow list (names, domain
 * suffixes, CIDRs, each with a port or any port), the operator's static host map, and the
 * addresses allowed names resolved to in this session (see net.h).
 *
 * connect is allowed to an address an allowed CIDR covers (with its port), or to an address that
 * an allowed name resolved to through the sandbox's resolver, on that name rule's port. A name's
 * DNS answer only counts when it is a public address: an allowed name whose DNS points at
 * 127.0.0.1, 10.0.0.0/8 or 169.254.169.254 (DNS rebinding) reaches nothing unless a CIDR allows
 * that address too. The operator's own map (ZEROBOOT_NETWORK_HOSTS) is not DNS and is trusted.
 */
#include "net.h"
#include "vm.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <fcntl.h>
#include <netdb.h>
#include <unistd.h>
#include <sys/socket.h>

zb_net *zb_net_new(void) {
    zb_net *n = calloc(1, sizeof *n);
    if (n && !(n->resolved = calloc(ZB_NET_MAX_RESOLVED, sizeof *n->resolved))) { free(n); return NULL; }
    return n;
}

void zb_net_free(zb_net *n) {
    if (!n) return;
    free(n->resolved);
    free(n);
}

int zb_net_name_normalize(const char *in, size_t len, char out[ZB_NET_NAME_MAX + 1]) {
    if (len && in[len - 1] == '.') len--;
    if (!len || len > ZB_NET_NAME_MAX) return -1;
    size_t label = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)in[i];
        if (c == '.') {
            if (!label) return -1;
            label = 0;
        } else if (isalnum(c) || c == '-' || c == '_') {
            if (++label > 63) return -1;
        } else {
            return -1;
        }
        out[i] = (char)tolower(c);
    }
    if (!label) return -1;
    out[len] = 0;
    return 0;
}

static int valid_family(int family) { return family == AF_INET || family == AF_INET6; }
static int addr_bytes(int family) { return family == AF_INET ? 4 : 16; }

int zb_net_allow(zb_net *n, int kind, const char *name, const uint8_t *addr, int prefix, int port, char *err) {
    if (n->nrules >= ZB_NET_MAX_RULES) { zb_seterr(err, "at most %d network rules", ZB_NET_MAX_RULES); return -1; }
    if (port < 0 || port > 65535) { zb_seterr(err, "port %d is not 0 (any) or 1-65535", port); return -1; }
    zb_net_rule r;
    memset(&r, 0, sizeof r);
    r.kind = kind;
    r.port = port;
    switch (kind) {
    case ZB_NET_NAME:
    case ZB_NET_SUFFIX:
        if (!name || zb_net_name_normalize(name, strlen(name), r.name) < 0) {
            zb_seterr(err, "%.80s is not a host name", name ? name : "(null)");
            return -1;
        }
        break;
    case ZB_NET_CIDR4:
    case ZB_NET_CIDR6: {
        r.addr.family = kind == ZB_NET_CIDR4 ? AF_INET : AF_INET6;
        int bits = 8 * addr_bytes(r.addr.family);
        if (!addr || prefix < 0 || prefix > bits) { zb_seterr(err, "prefix /%d out of range 0-%d", prefix, bits); return -1; }
        memcpy(r.addr.b, addr, (size_t)addr_bytes(r.addr.family));
        for (int i = prefix; i < bits; i++) r.addr.b[i / 8] &= (uint8_t)~(0x80u >> (i % 8));
        r.prefix = prefix;
        break;
    }
    default:
        zb_seterr(err, "unknown network rule kind %d", kind);
        return -1;
    }
    n->rules[n->nrules++] = r;
    return 0;
}

int zb_net_add_host(zb_net *n, const char *name, int family, const uint8_t *addr, char *err) {
    if (n->nhosts >= ZB_NET_MAX_HOSTS) { zb_seterr(err, "at most %d host map entries", ZB_NET_MAX_HOSTS); return -1; }
    if (!valid_family(family) || !addr) { zb_seterr(err, "address family %d is not AF_INET or AF_INET6", family); return -1; }
    zb_net_host *h = &n->hosts[n->nhosts];
    memset(h, 0, sizeof *h);
    if (!name || zb_net_name_normalize(name, strlen(name), h->name) < 0) {
        zb_seterr(err, "%.80s is not a host name", name ? name : "(null)");
        return -1;
    }
    h->addr.family = family;
    memcpy(h->addr.b, addr, (size_t)addr_bytes(family));
    n->nhosts++;
    return 0;
}


int zb_net_name_rule(const zb_net *n, const char *name) {
    size_t len = strlen(name);
    for (int i = 0; i < n->nrules; i++) {
        const zb_net_rule *r = &n->rules[i];
        if (r->kind == ZB_NET_NAME && !strcmp(r->name, name)) return i;
        if (r->kind == ZB_NET_SUFFIX) {
            size_t sl = strlen(r->name); /* "*.example.org" matches below example.org, not itself */
            if (len > sl + 1 && name[len - sl - 1] == '.' && !strcmp(name + len - sl, r->name)) return i;
        }
    }
    return -1;
}

static int same_addr(const zb_net_addr *a, const zb_net_addr *b) {
    return a->family == b->family && !memcmp(a->b, b->b, (size_t)addr_bytes(a->family));
}

void zb_net_remember(zb_net *n, int rule, const char *name, const zb_net_addr *a, int from_hosts) {
    for (int i = 0; i < n->nresolved; i++) {
        zb_net_resolved *e = &n->resolved[i];
        if (same_addr(&e->addr, a) && e->rule == rule && e->from_hosts == from_hosts) return;
    }
    zb_net_resolved *e = &n->resolved[n->next_resolved];
    memset(e, 0, sizeof *e);
    e->addr = *a;
    e->rule = rule;
    e->from_hosts = from_hosts;
    snprintf(e->name, sizeof e->name, "%s", name);
    n->next_resolved = (n->next_resolved + 1) % ZB_NET_MAX_RESOLVED;
    if (n->nresolved < ZB_NET_MAX_RESOLVED) n->nresolved++;
}

static int host_file_lookup(zb_net *n, int rule, const char *name, int family, zb_net_addr *out, int max);

int zb_net_resolve(zb_net *n, int rule, const char *name, int family, zb_net_addr *out, int max) {
    int got = 0, mapped = 0;
    for (int i = 0; i < n->nhosts; i++) {
        if (strcmp(n->hosts[i].name, name)) continue;
        mapped = 1; /* the operator's map names it: DNS is never asked */
        if (n->hosts[i].addr.family != family || got >= max) continue;
        out[got++] = n->hosts[i].addr;
        zb_net_remember(n, rule, name, &n->hosts[i].addr, 1);
    }
    if (mapped) return got;
    return host_file_lookup(n, rule, name, family, out, max);
}

/* The host's /etc/hosts (at most 64 KiB of it), as glibc's "files" source reads it: "address
 * name alias...", '#' comments. Its answers count as DNS answers (public addresses only reach
 * anything). The number of addresses of family, -1 for NXDOMAIN never (a name it does not list
 * asks DNS: ZB_NET_ASK_DNS). */
static int host_file_lookup(zb_net *n, int rule, const char *name, int family, zb_net_addr *out, int max) {
    static __thread char text[65536 + 1]; /* engines on other threads read theirs */
    int fd = open("/etc/hosts", O_RDONLY | O_CLOEXEC);
    ssize_t len = fd < 0 ? -1 : read(fd, text, sizeof text - 1);
    if (fd >= 0) close(fd);
    if (len <= 0) return ZB_NET_ASK_DNS;
    text[len] = 0;
    int got = 0, listed = 0;
    for (char *line = text, *next; line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *save = NULL, *addr_text = strtok_r(line, " \t\r", &save);
        if (!addr_text) continue;
        int named = 0;
        for (char *w = strtok_r(NULL, " \t\r", &save); w; w = strtok_r(NULL, " \t\r", &save)) {
            char norm[ZB_NET_NAME_MAX + 1];
            if (!zb_net_name_normalize(w, strlen(w), norm) && !strcmp(norm, name)) named = 1;
        }
        if (!named) continue;
        zb_net_addr a;
        memset(&a, 0, sizeof a);
        a.family = strchr(addr_text, ':') ? AF_INET6 : AF_INET;
        if (inet_pton(a.family, addr_text, a.b) != 1) continue;
        listed = 1;
        if (a.family != family || got >= max) continue;
        int dup = 0;
        for (int j = 0; j < got; j++) dup |= same_addr(&out[j], &a);
        if (dup) continue;
        out[got++] = a;
        zb_net_remember(n, rule, name, &a, 0);
    }
    return listed ? got : ZB_NET_ASK_DNS;
}

int zb_net_set_resolver(zb_net *n, int family, const uint8_t *addr, int port, char *err) {
    if (!valid_family(family) || !addr) { zb_seterr(err, "address family %d is not AF_INET or AF_INET6", family); return -1; }
    if (port < 1 || port > 65535) { zb_seterr(err, "resolver port %d is not 1-65535", port); return -1; }
    memset(&n->upstream, 0, sizeof n->upstream);
    if (family == AF_INET) {
        struct sockaddr_in *sa = (struct sockaddr_in *)&n->upstream;
        sa->sin_family = AF_INET;
        sa->sin_port = htons((uint16_t)port);
        memcpy(&sa->sin_addr, addr, 4);
        n->upstream_len = sizeof *sa;
    } else {
        struct sockaddr_in6 *sa = (struct sockaddr_in6 *)&n->upstream;
        sa->sin6_family = AF_INET6;
        sa->sin6_port = htons((uint16_t)port);
        memcpy(&sa->sin6_addr, addr, 16);
        n->upstream_len = sizeof *sa;
    }
    n->upstream_tried = 1;
    return 0;
}

int zb_net_upstream(zb_net *n) {
    if (n->upstream_tried) return n->upstream_len ? 0 : -1;
    n->upstream_tried = 1;
    static __thread char text[16384 + 1];
    int fd = open("/etc/resolv.conf", O_RDONLY | O_CLOEXEC);
    ssize_t len = fd < 0 ? -1 : read(fd, text, sizeof text - 1);
    if (fd >= 0) close(fd);
    if (len <= 0) return -1;
    text[len] = 0;
    for (char *line = text, *next; line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        char *save = NULL, *key = strtok_r(line, " \t\r", &save), *value = key ? strtok_r(NULL, " \t\r", &save) : NULL;
        if (!key || !value || strcmp(key, "nameserver")) continue;
        uint8_t b[16];
        int family = strchr(value, ':') ? AF_INET6 : AF_INET;
        char *pct = strchr(value, '%'); /* a v6 scope: not supported, skip the entry */
        if (pct || inet_pton(family, value, b) != 1) continue;
        return zb_net_set_resolver(n, family, b, 53, NULL);
    }
    return -1;
}

static int in_prefix(const uint8_t *addr, const uint8_t *net, int prefix) {
    for (int i = 0; i < prefix; i++) {
        uint8_t bit = (uint8_t)(0x80u >> (i % 8));
        if ((addr[i / 8] & bit) != (net[i / 8] & bit)) return 0;
    }
    return 1;
}

int zb_net_addr_public(const zb_net_addr *a) {
    static const struct { uint8_t net[4]; int prefix; } v4[] = {
        {{0, 0, 0, 0}, 8}, {{10, 0, 0, 0}, 8}, {{100, 64, 0, 0}, 10}, {{127, 0, 0, 0}, 8}, {{169, 254, 0, 0}, 16},
        {{172, 16, 0, 0}, 12}, {{192, 0, 0, 0}, 24}, {{192, 0, 2, 0}, 24}, {{192, 168, 0, 0}, 16},
        {{198, 18, 0, 0}, 15}, {{198, 51, 100, 0}, 24}, {{203, 0, 113, 0}, 24}, {{224, 0, 0, 0}, 3},
    };
    if (a->family == AF_INET) {
        for (size_t i = 0; i < sizeof v4 / sizeof v4[0]; i++)
            if (in_prefix(a->b, v4[i].net, v4[i].prefix)) return 0;
        return 1;
    }
    /* v6: only global unicast 2000::/3, minus documentation 2001:db8::/32; v4-mapped by its v4 */
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (!memcmp(a->b, mapped, 12)) {
        zb_net_addr v;
        memset(&v, 0, sizeof v);
        v.family = AF_INET;
        memcpy(v.b, a->b + 12, 4);
        return zb_net_addr_public(&v);
    }
    static const uint8_t doc[4] = {0x20, 0x01, 0x0d, 0xb8};
    return (a->b[0] & 0xe0) == 0x20 && memcmp(a->b, doc, 4) != 0;
}

void zb_net_addr_text(const zb_net_addr *a, int port, char *out, size_t len) {
    char t[INET6_ADDRSTRLEN] = "?";
    inet_ntop(a->family, a->b, t, sizeof t);
    if (port < 0) snprintf(out, len, "%s", t);
    else if (a->family == AF_INET6) snprintf(out, len, "[%s]:%d", t, port);
    else snprintf(out, len, "%s:%d", t, port);
}

static int port_ok(const zb_net_rule *r, int port) { return !r->port || r->port == port; }

int zb_net_check(const zb_net *n, const zb_net_addr *addr, int port, char *why, size_t whylen) {
    char text[INET6_ADDRSTRLEN + 8];
    zb_net_addr_text(addr, port, text, sizeof text);
    int cidr_other_port = 0;
    for (int i = 0; i < n->nrules; i++) {
        const zb_net_rule *r = &n->rules[i];
        if ((r->kind != ZB_NET_CIDR4 && r->kind != ZB_NET_CIDR6) || r->addr.family != addr->family) continue;
        if (!in_prefix(addr->b, r->addr.b, r->prefix)) continue;
        if (port_ok(r, port)) return 0;
        cidr_other_port = 1;
    }
    const zb_net_resolved *seen = NULL;
    for (int i = 0; i < n->nresolved; i++) {
        const zb_net_resolved *e = &n->resolved[i];
        if (!same_addr(&e->addr, addr)) continue;
        const zb_net_rule *r = &n->rules[e->rule];
        if (port_ok(r, port) && (e->from_hosts || zb_net_addr_public(addr))) return 0;
        if (!seen || port_ok(r, port)) seen = e;
    }
    if (seen && port_ok(&n->rules[seen->rule], port))
        snprintf(why, whylen, "%s is what the allowed name %s resolved to, but it is not a public address: names "
                 "may only lead to public addresses (no DNS rebinding); allow the address itself, e.g. "
                 "ZEROBOOT_NETWORK=...,%s", text, seen->name, text);
    else if (seen || cidr_other_port)
        snprintf(why, whylen, "%s is allowed, but not on port %d: add the port to its entry (NAME:%d) in "
                 "ZEROBOOT_NETWORK", text, port, port);
    else
        snprintf(why, whylen, "%s is not in the allow list: add it (or a host name that resolves to it, or a "
                 "CIDR) to ZEROBOOT_NETWORK in the kernelspec's env and restart the kernel", text);
    return -EACCES;
}

int zb_net_set_limits(zb_net *n, int max_connections, uint64_t bytes_per_second, char *err) {
    if (max_connections < 0 || max_connections > 100000) {
        zb_seterr(err, "max_connections %d is not 0 (no limit) to 100000", max_connections);
        return -1;
    }
    n->max_connections = max_connections;
    n->rate = bytes_per_second;
    n->tokens = (double)bytes_per_second;
    n->tokens_ns = zb_now_ns();
    return 0;
}

void zb_engine_set_network(zb_engine *e, zb_net *net) {
    zb_net_free(e->net);
    e->net = net;
}

void zb_engine_network_stats(zb_engine *e, zb_net_stats *out) {
    if (e->net) *out = e->net->stats;
    else memset(out, 0, sizeof *out);
}
