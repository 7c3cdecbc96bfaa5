/* blake2b.c - BLAKE2b as in RFC 7693 (its reference code, restated), for blake2b.h. */
#include "blake2b.h"

#include <string.h>

static const uint64_t IV[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};

static const uint8_t SIGMA[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

static inline uint64_t rotr(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

static inline uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v; /* x86-64: little-endian, as BLAKE2b's words */
}

#define G(a, b, c, d, x, y)                 \
    do {                                    \
        v[a] = v[a] + v[b] + (x);           \
        v[d] = rotr(v[d] ^ v[a], 32);       \
        v[c] = v[c] + v[d];                 \
        v[b] = rotr(v[b] ^ v[c], 24);       \
        v[a] = v[a] + v[b] + (y);           \
        v[d] = rotr(v[d] ^ v[a], 16);       \
        v[c] = v[c] + v[d];                 \
        v[b] = rotr(v[b] ^ v[c], 63);       \
    } while (0)

static void compress(zb_blake2b *s, const uint8_t *block, int last) {
    uint64_t v[16], m[16];
    for (int i = 0; i < 8; i++) { v[i] = s->h[i]; v[i + 8] = IV[i]; }
    v[12] ^= s->t[0];
    v[13] ^= s->t[1];
    if (last) v[14] = ~v[14];
    for (int i = 0; i < 16; i++) m[i] = load64(block + 8 * i);
    for (int r = 0; r < 12; r++) {
        const uint8_t *p = SIGMA[r];
        G(0, 4, 8, 12, m[p[0]], m[p[1]]);
        G(1, 5, 9, 13, m[p[2]], m[p[3]]);
        G(2, 6, 10, 14, m[p[4]], m[p[5]]);
        G(3, 7, 11, 15, m[p[6]], m[p[7]]);
        G(0, 5, 10, 15, m[p[8]], m[p[9]]);
        G(1, 6, 11, 12, m[p[10]], m[p[11]]);
        G(2, 7, 8, 13, m[p[12]], m[p[13]]);
        G(3, 4, 9, 14, m[p[14]], m[p[15]]);
    }
    for (int i = 0; i < 8; i++) s->h[i] ^= v[i] ^ v[i + 8];
}

static void count(zb_blake2b *s, size_t n) {
    s->t[0] += n;
    if (s->t[0] < n) s->t[1]++;
}

int zb_blake2b_init(zb_blake2b *s, size_t outlen, const void *key, size_t keylen) {
    if (outlen == 0 || outlen > 64 || keylen > 64) return -1;
    memset(s, 0, sizeof *s);
    memcpy(s->h, IV, sizeof s->h);
    s->h[0] ^= 0x01010000ULL ^ ((uint64_t)keylen << 8) ^ outlen;
    s->outlen = outlen;
    if (keylen) {
        memcpy(s->buf, key, keylen); /* the key is a first block of its own, zero padded */
        s->c = 128;
    }
    return 0;
}

void zb_blake2b_update(zb_blake2b *s, const void *in, size_t n) {
    const uint8_t *p = in;
    while (n) {
        if (s->c == 128) { /* a full buffer is compressed only once more input follows (the last block is final) */
            count(s, 128);
            compress(s, s->buf, 0);
            s->c = 0;
        }
        if (s->c == 0) {
            while (n > 128) { /* whole blocks straight from the input, keeping the last one back */
                count(s, 128);
                compress(s, p, 0);
                p += 128;
                n -= 128;
            }
        }
        size_t k = 128 - s->c < n ? 128 - s->c : n;
        memcpy(s->buf + s->c, p, k);
        s->c += k;
        p += k;
        n -= k;
    }
}

void zb_blake2b_final(zb_blake2b *s, uint8_t *out) {
    count(s, s->c);
    memset(s->buf + s->c, 0, 128 - s->c);
    compress(s, s->buf, 1);
    uint8_t full[64];
    memcpy(full, s->h, 64);
    memcpy(out, full, s->outlen);
}
