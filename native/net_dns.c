/* net_dns.c - the sandbox's resolver: answers the DNS queries the guest's libc sends to
 * ZB_NET_RESOLVER (its /etc/resolv.conf) from the policy's names, never forwarding a packet: a
 * name only the host's DNS knows is asked with the engine's own query (zb_dns_host_query) and the
 * upstream server's response is parsed with the same care (zb_dns_host_reply).
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

static size_t with_addrs(zb_net *n, const uint8_t *q, size_t qend, uint8_t *out, size_t cap, unsigned type,
                         const zb_net_addr *addrs, int got);

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

size_t zb_dns_answer(zb_net *n, const uint8_t *q, size_t qlen, uint8_t *out, size_t cap, char *refused, size_t rlen,
                     zb_dns_question *later) {
    if (refused && rlen) refused[0] = 0;
    later->qend = 0;
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
    if (got == ZB_NET_ASK_DNS) {
        if (qend > sizeof later->q) return reply(q, 12, out, RC_FORMERR, 0); /* bounded above already */
        memcpy(later->q, q, qend);
        later->qend = qend;
        snprintf(later->name, sizeof later->name, "%s", name);
        later->rule = rule;
        later->type = (int)type;
        return 0;
    }
    if (got < 0) return reply(q, qend, out, RC_NXDOMAIN, 0);
    return with_addrs(n, q, qend, out, cap, type, addrs, got);
}

/* The reply to the question q[0..qend) with these addresses (of the question's type). */
static size_t with_addrs(zb_net *n, const uint8_t *q, size_t qend, uint8_t *out, size_t cap, unsigned type,
                         const zb_net_addr *addrs, int got) {
    size_t len = reply(q, qend, out, RC_OK, got);
    size_t rdlen = type == T_A ? 4 : 16;
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

/* ---- the host's DNS server, asked for allowed names (never with the guest's bytes) ---- */

size_t zb_dns_host_query(const zb_dns_question *qn, uint16_t id, uint8_t *out, size_t cap) {
    size_t nlen = strlen(qn->name);
    if (cap < 12 + nlen + 2 + 4) return 0;
    memset(out, 0, 12);
    put16(out, id);
    out[2] = 0x01; /* RD */
    put16(out + 4, 1);
    size_t at = 12;
    for (const char *label = qn->name; *label;) { /* a normalized name: labels of 1-63 bytes */
        const char *dot = strchr(label, '.');
        size_t len = dot ? (size_t)(dot - label) : strlen(label);
        out[at++] = (uint8_t)len;
        memcpy(out + at, label, len);
        at += len;
        label += len + (dot ? 1 : 0);
    }
    out[at++] = 0;
    put16(out + at, (unsigned)qn->type);
    put16(out + at + 2, C_IN);
    return at + 4;
}

/* Skip a (possibly compressed) name at r[*at]: 0, or -1 if it leaves the packet. A pointer ends
 * the name, so no pointer is followed and no loop is possible. */
static int skip_name(const uint8_t *r, size_t rlen, size_t *at) {
    for (int labels = 0; labels < 128; labels++) {
        if (*at >= rlen) return -1;
        unsigned len = r[*at];
        if ((len & 0xc0) == 0xc0) {
            if (*at + 2 > rlen) return -1;
            *at += 2;
            return 0;
        }
        if (len & 0xc0) return -1;
        *at += 1 + len;
        if (!len) return 0;
    }
    return -1;
}

size_t zb_dns_host_reply(zb_net *n, const zb_dns_question *qn, uint16_t id, const uint8_t *r, size_t rlen,
                         uint8_t *out, size_t cap) {
    if (cap < 512) return 0;
    if (!r) return reply(qn->q, qn->qend, out, RC_SERVFAIL, 0); /* no answer in time */
    /* the server's response is data from the network too: every field within rlen */
    if (rlen < 12 || get16(r) != id || !(r[2] & 0x80)) return reply(qn->q, qn->qend, out, RC_SERVFAIL, 0);
    unsigned rcode = r[3] & 0x0f;
    if (rcode == RC_NXDOMAIN) return reply(qn->q, qn->qend, out, RC_NXDOMAIN, 0);
    if (rcode != RC_OK || (r[2] & 0x02)) return reply(qn->q, qn->qend, out, RC_SERVFAIL, 0); /* an error, or TC */
    size_t at = 12;
    for (unsigned i = 0, qd = get16(r + 4); i < qd; i++) {
        if (skip_name(r, rlen, &at) < 0 || at + 4 > rlen) return reply(qn->q, qn->qend, out, RC_SERVFAIL, 0);
        at += 4;
    }
    zb_net_addr addrs[ZB_NET_MAX_ANSWERS];
    int got = 0;
    unsigned want = (unsigned)qn->type, rdlen_want = want == T_A ? 4 : 16;
    for (unsigned i = 0, an = get16(r + 6); i < an && got < ZB_NET_MAX_ANSWERS; i++) {
        if (skip_name(r, rlen, &at) < 0 || at + 10 > rlen) break;
        unsigned type = get16(r + at), klass = get16(r + at + 2), rdlen = get16(r + at + 8);
        at += 10;
        if (rdlen > rlen - at) break;
        if (type == want && klass == C_IN && rdlen == rdlen_want) { /* CNAMEs are skipped: their targets' records follow */
            zb_net_addr a;
            memset(&a, 0, sizeof a);
            a.family = want == T_A ? AF_INET : AF_INET6;
            memcpy(a.b, r + at, rdlen);
            int dup = 0;
            for (int j = 0; j < got; j++) dup |= !memcmp(addrs[j].b, a.b, rdlen);
            if (!dup) {
                addrs[got++] = a;
                zb_net_remember(n, qn->rule, qn->name, &a, 0);
            }
        }
        at += rdlen;
    }
    return with_addrs(n, qn->q, qn->qend, out, cap, want, addrs, got);
}
