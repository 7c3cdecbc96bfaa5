/* uart_fuzz.c - libFuzzer harness for the cell channel: the frame parser (zb_frame_check), the
 * frame assembler (zb_uart_write, fed in arbitrary pieces) and the 16550 register model.
 *
 * The input's first byte picks a mode:
 *   0  zb_frame_check on the whole input: its answer must agree with the frame format.
 *   1  the rest is a byte stream the guest writes in pieces whose sizes come from a second stream:
 *      the frames the assembler hands out must be exactly those a reference parser (below, written
 *      from docs/PROTOCOL.md) finds, and it must fail exactly where the reference says the stream
 *      becomes malformed.
 *   2  the rest is a program for the register model: port writes/reads of any offset and value,
 *      host input, frame consumption and state clones, checking the model's invariants.
 */
#include <assert.h>

#include "util.h"
#include "dev.h"

#define CHECK(cond)                                                                             \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "uart_fuzz: invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
            abort();                                                                            \
        }                                                                                       \
    } while (0)

static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

static void fuzz_check(const uint8_t *d, size_t n) {
    char err[ZB_ERRLEN];
    size_t total = 0;
    int st = zb_frame_check(d, n, &total, err);
    static const uint8_t want[6] = {0x4d, 0x46, 0x42, 0x5a, 0x01, 0x00};
    size_t bad = 0;
    while (bad < ZB_MIN(n, 6) && d[bad] == want[bad]) bad++;
    if (bad < ZB_MIN(n, 6)) { CHECK(st == -1); return; } /* a wrong magic/version byte */
    if (n < ZB_FRAME_HEADER) { CHECK(st == 0); return; }
    uint32_t len = rd32(d + 8);
    if (len > ZB_FRAME_MAX_PAYLOAD) { CHECK(st == -1); return; }
    CHECK(total == ZB_FRAME_HEADER + (size_t)len);
    CHECK(st == (n >= total));
}

/* The reference: frames of a stream, in order; stops at the first malformed byte. */
typedef struct { size_t start, total; } ref_frame;

static size_t reference(const uint8_t *s, size_t n, ref_frame *out, size_t max, int *malformed) {
    static const uint8_t want[6] = {0x4d, 0x46, 0x42, 0x5a, 0x01, 0x00};
    size_t pos = 0, k = 0;
    *malformed = 0;
    while (pos < n && k < max) {
        for (size_t i = 0; i < 6 && pos + i < n; i++)
            if (s[pos + i] != want[i]) { *malformed = 1; return k; }
        if (n - pos < ZB_FRAME_HEADER) return k;
        uint32_t len = rd32(s + pos + 8);
        if (len > ZB_FRAME_MAX_PAYLOAD) { *malformed = 1; return k; }
        size_t total = ZB_FRAME_HEADER + (size_t)len;
        if (n - pos < total) return k;
        out[k].start = pos;
        out[k].total = total;
        k++;
        pos += total;
    }
    return k;
}

static void fuzz_stream(const uint8_t *d, size_t n) {
    if (n < 2) return;
    /* the first half (rounded) is the stream, the rest gives the piece sizes */
    size_t slen = n / 2 + (d[0] & 1);
    const uint8_t *s = d, *pieces = d + slen;
    size_t npieces = n - slen;
    ref_frame ref[256];
    int malformed;
    size_t nref = reference(s, slen, ref, 256, &malformed);

    zb_uart u;
    zb_uart_init(&u);
    char err[ZB_ERRLEN];
    size_t pos = 0, got = 0, pi = 0;
    int failed = 0;
    while (pos < slen && got < 256) {
        size_t piece = npieces ? (size_t)pieces[pi++ % npieces] + 1 : slen - pos;
        piece = ZB_MIN(piece, slen - pos);
        size_t done = 0;
        while (done < piece) {
            long r = zb_uart_write(&u, s + pos + done, piece - done, err);
            if (r < 0) { failed = 1; break; }
            CHECK((size_t)r <= piece - done);
            done += (size_t)r;
            if (u.frame_ready) {
                CHECK(got < nref);
                CHECK(u.frame_ready == ref[got].total);
                CHECK(!memcmp(u.tx, s + ref[got].start, ref[got].total));
                CHECK(rd16(u.tx + 6) == rd16(s + ref[got].start + 6));
                got++;
                zb_uart_consume_frame(&u);
                CHECK(!u.frame_ready);
            } else {
                CHECK(r > 0 || piece - done == 0);
            }
            CHECK(u.tx_len <= ZB_FRAME_HEADER + (size_t)ZB_FRAME_MAX_PAYLOAD);
        }
        if (failed) break;
        pos += piece;
    }
    if (got < 256) {
        CHECK(got == nref);             /* every complete frame, no more */
        CHECK(failed == malformed);     /* fails exactly when the reference says so */
    }
    zb_uart_destroy(&u);
}

static void fuzz_ports(const uint8_t *d, size_t n) {
    zb_uart u, c;
    zb_uart_init(&u);
    char err[ZB_ERRLEN];
    int dead = 0;
    for (size_t i = 0; i + 2 < n; i += 3) {
        uint8_t op = d[i], arg = d[i + 1], val = d[i + 2];
        unsigned off = arg & 7;
        switch (op % 6) {
        case 0: case 1:
            if (!dead && !u.frame_ready && zb_uart_port_out(&u, off, val, err) < 0) dead = 1;
            break;
        case 2: {
            uint8_t v = zb_uart_port_in(&u, off);
            if (off == 5) CHECK(!!(v & 1) == !!zb_uart_rx_available(&u)); /* LSR.DR */
            break;
        }
        case 3: {
            uint8_t buf[64];
            memset(buf, val, sizeof buf);
            CHECK(zb_uart_push_input(&u, buf, (size_t)(arg % 64)) == 0);
            break;
        }
        case 4: {
            uint8_t buf[256];
            size_t avail = zb_uart_rx_available(&u);
            size_t r = zb_uart_read(&u, buf, arg);
            CHECK(r == ZB_MIN(avail, (size_t)arg));
            zb_uart_consume_frame(&u);
            break;
        }
        case 5:
            CHECK(zb_uart_clone(&c, &u) == 0);
            CHECK(zb_uart_rx_available(&c) == zb_uart_rx_available(&u));
            CHECK(c.tx_len == u.tx_len && (!u.tx_len || !memcmp(c.tx, u.tx, u.tx_len)));
            CHECK(c.lcr == u.lcr && c.ier == u.ier && c.mcr == u.mcr);
            zb_uart_destroy(&u);
            u = c; /* go on with the clone */
            break;
        }
        CHECK(u.rx_pos <= u.rx_len && u.rx_len <= u.rx_cap);
        CHECK(u.tx_len <= u.tx_cap || !u.tx);
        CHECK(u.frame_ready <= u.tx_len);
    }
    zb_uart_destroy(&u);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    switch (data[0] % 3) {
    case 0: fuzz_check(data + 1, size - 1); break;
    case 1: fuzz_stream(data + 1, size - 1); break;
    case 2: fuzz_ports(data + 1, size - 1); break;
    }
    return 0;
}
