/* dns_fuzz.c - libFuzzer harness for the sandbox's resolver (native/net_dns.c): every input is one
 * datagram a guest sends to 192.0.2.53:53, and also the response an upstream DNS server sends to
 * the engine's own query (zb_dns_host_reply). The policy allows one name, answered from the host
 * map (so no input makes the harness ask a server), and a suffix without a map entry is absent on
 * purpose for the same reason.
 *
 * Invariants of an answer: it fits the buffer and 512 bytes, it is a response with the query's id,
 * it holds at most one question and ZB_NET_MAX_ANSWERS records, an answer with records is NOERROR
 * for the allowed name, and its length is exactly the header, the question and the records.
 */
#include "util.h"
#include "net.h"

#include <sys/socket.h>

#define CHECK(cond)                                                                             \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "dns_fuzz: invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
            abort();                                                                            \
        }                                                                                       \
    } while (0)

static zb_net *policy(void) {
    static zb_net *net;
    if (net) return net;
    char err[ZB_ERRLEN];
    net = zb_net_new();
    static const uint8_t v4[4] = {127, 0, 0, 1}, v6[16] = {[15] = 1};
    CHECK(net && zb_net_allow(net, ZB_NET_NAME, "data.test", NULL, 0, 80, err) == 0);
    CHECK(zb_net_add_host(net, "data.test", AF_INET, v4, err) == 0);
    CHECK(zb_net_add_host(net, "data.test", AF_INET6, v6, err) == 0);
    return net;
}

/* The input as an upstream server's response to an A query for data.test (id: its first two
 * bytes, so that some inputs get past the id check): the guest's answer fits 512 bytes, keeps the
 * guest's id and question, and holds at most ZB_NET_MAX_ANSWERS A records. */
static void upstream_reply(const uint8_t *d, size_t n) {
    static const uint8_t guest_q[] = "\xab\xcd\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x04" "data" "\x04" "test" "\x00\x00\x01\x00\x01";
    zb_dns_question qn;
    memset(&qn, 0, sizeof qn);
    qn.qend = sizeof guest_q - 1;
    memcpy(qn.q, guest_q, qn.qend);
    snprintf(qn.name, sizeof qn.name, "data.test");
    qn.type = 1;
    uint8_t out[600];
    uint16_t id = n >= 2 ? (uint16_t)(d[0] << 8 | d[1]) : 0;
    size_t len = zb_dns_host_reply(policy(), &qn, id, d, n, out, sizeof out);
    CHECK(len >= qn.qend && len <= 512);
    CHECK(out[0] == 0xab && out[1] == 0xcd && (out[2] & 0x80) && !memcmp(out + 12, guest_q + 12, qn.qend - 12));
    unsigned an = (unsigned)(out[6] << 8 | out[7]);
    CHECK(an <= ZB_NET_MAX_ANSWERS && len == qn.qend + (size_t)an * 16);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    uint8_t out[600];
    char refused[ZB_NET_NAME_MAX + 1];
    zb_dns_question later;
    upstream_reply(d, n);
    size_t len = zb_dns_answer(policy(), d, n, out, sizeof out, refused, sizeof refused, &later);
    CHECK(!later.qend); /* every allowed name is mapped: nothing asks a server */
    if (!len) return 0;
    CHECK(n >= 12 && len >= 12 && len <= 512 && len <= sizeof out);
    CHECK(out[0] == d[0] && out[1] == d[1] && (out[2] & 0x80));
    unsigned qd = (unsigned)(out[4] << 8 | out[5]), an = (unsigned)(out[6] << 8 | out[7]);
    CHECK(qd <= 1 && an <= ZB_NET_MAX_ANSWERS && !out[8] && !out[9] && !out[10] && !out[11]);
    CHECK(strlen(refused) <= ZB_NET_NAME_MAX);
    if (an) {
        CHECK((out[3] & 0x0f) == 0 && qd == 1);
        size_t qlen = len - 12 - (size_t)an * 16;                       /* all A records, or */
        size_t q6 = len - 12 - (size_t)an * 28;                         /* all AAAA records */
        CHECK((len >= 12 + an * 16 && qlen == 11 + 4) || (len >= 12 + an * 28 && q6 == 11 + 4));
        CHECK(!memcmp(out + 12, "\x04" "data" "\x04" "test", 10) || !memcmp(out + 12, "\x04", 1));
    }
    return 0;
}
