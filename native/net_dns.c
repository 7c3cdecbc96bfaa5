/* net_dns.c - the sandbox's resolver: answers the DNS queries the guest's libc sends to
 * ZB_NET_RESOLVER (its /etc/resolv.conf) from the policy's names, never forwarding a packet.
 *
 * A query is guest data: the header is read field by field within qlen, the one question's name
 * label by label, every label's length checked against what is left. Compression pointers are
 * refused in a question (a query has nothing to point back to), which also rules out pointer
 * loops; so is every other section but one additional record (EDNS0's OPT, ignored). Answers are
 * A or AAAA records for allowed names (at most ZB_NET_MAX_ANSWERS, so that every answer fits 512
 * bytes and the guest never falls back to TCP), NXDOMAIN for names the policy does not allow or
 * that do not exist, FORMERR / NOTIMP / REFUSED for the rest.
 */
#include "net.h"

#include <sys/socket.h>

enum { RC_OK = 0, RC_FORMERR = 1, RC_SERVFAIL = 2, RC_NXDOMAIN = 3, RC_NOTIMP = 4, RC_REFUSED = 5 };
enum { T_A = 1, T_AAAA = 28, C_IN = 1 };
#define ANSWER_TTL 60

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static void put16(uint8_t *p, unsigned v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }

/* The question's name at q[12...] as text; *end is the offset after it. 0, or an rcode. */
static int read_name(const uint8_t *q, size_t qlen, size_t *end, char name[ZB_NET_NAME_MAX + 1]) {
    size_t at = 12, used = 0;
    char raw[ZB_NET_NAME_MAX + 2];
    for (;;) {
        if (at >= qlen) return RC_FORMERR;
        unsigned len = q[at++];
        if (!len) break;
        if (len & 0xc0) return RC_FORMERR; /* compression (or the reserved label types) */
        if (len > qlen - at || used + len + 1 > ZB_NET_NAME_MAX + 1) return RC_FORMERR;
        for (unsigned i = 0; i < len; i++)
            if (q[at + i] == '.' || q[at + i] == 0) return RC_FORMERR;
        if (used) raw[used++] = '.';
        memcpy(raw + used, q + at, len);
        used += len;
        at += len;
    }
    if (!used) return RC_REFUSED; /* the root */
    if (zb_net_name_normalize(raw, used, name) < 0) return RC_FORMERR;
    *end = at;
    return 0;
}

/* A header-only reply (the question is copied when it was read whole). */
static size_t reply(const uint8_t *q, size_t qend, uint8_t *out, int rcode, int answers) {
    memcpy(out, q, qend);
    out[2] = (uint8_t)(0x80 | (q[2] & 0x79)); /* QR, the query's opcode and RD */
    out[3] = (uint8_t)(0x80 | rcode);         /* RA */
    put16(out + 4, qend > 12 ? 1 : 0);
    put16(out + 6, (unsigned)answers);
    put16(out + 8, 0);
    put16(out + 10, 0);
    return qend;
}

size_t zb_dns_answer(zb_net *n, const uint8_t *q, size_t qlen, uint8_t *out, size_t cap, char *refused, size_t rlen) {
    if (refused && rlen) refused[0] = 0;
    if (qlen < 12 || cap < 512) return 0;
    n->stats.dns_queries++;
    if (q[2] & 0x80) return 0;                               /* a response: never answer those */
    if ((q[2] >> 3) & 0x0f) return reply(q, 12, out, RC_NOTIMP, 0); /* not a standard query */
    if (get16(q + 4) != 1 || get16(q + 6) || get16(q + 8) || get16(q + 10) > 1) return reply(q, 12, out, RC_FORMERR, 0);
    char name[ZB_NET_NAME_MAX + 1];
    size_t at = 0;
    int rc = read_name(q, qlen, &at, name);
    if (rc) return reply(q, 12, out, rc, 0);
    if (qlen - at < 4) return reply(q, 12, out, RC_FORMERR, 0);
    unsigned type = get16(q + at), klass = get16(q + at + 2);
    size_t qend = at + 4;
    if (qend > 12 + ZB_NET_NAME_MAX + 2 + 4) return reply(q, 12, out, RC_FORMERR, 0);
    if (klass != C_IN) return reply(q, qend, out, RC_REFUSED, 0);
    int rule = zb_net_name_rule(n, name);
    if (rule < 0) {
        n->stats.dns_refused++;
        if (refused) snprintf(refused, rlen, "%s", name);
        return reply(q, qend, out, RC_NXDOMAIN, 0);
    }
    if (type != T_A && type != T_AAAA) return reply(q, qend, out, RC_OK, 0); /* no such records here */
    int family = type == T_A ? AF_INET : AF_INET6;
    zb_net_addr addrs[ZB_NET_MAX_ANSWERS];
    int got = zb_net_resolve(n, rule, name, family, addrs, ZB_NET_MAX_ANSWERS);
    if (got < 0) return reply(q, qend, out, RC_NXDOMAIN, 0);
    size_t len = reply(q, qend, out, RC_OK, got);
    size_t rdlen = family == AF_INET ? 4 : 16;
    for (int i = 0; i < got; i++) {
        if (len + 12 + rdlen > cap) break; /* cannot happen with ZB_NET_MAX_ANSWERS; kept for safety */
        uint8_t *r = out + len;
        put16(r, 0xc00c); /* the question's name */
        put16(r + 2, type);
        put16(r + 4, C_IN);
        put16(r + 6, 0);
        put16(r + 8, ANSWER_TTL);
        put16(r + 10, (unsigned)rdlen);
        memcpy(r + 12, addrs[i].b, rdlen);
        len += 12 + rdlen;
    }
    n->stats.dns_answers++;
    return len;
}
