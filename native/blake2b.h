/* blake2b.h - keyed BLAKE2b (RFC 7693), for the MAC of a spilled checkpoint's record
 * (zb_spill_write): the same function as Python's hashlib.blake2b(key=..., digest_size=...). */
#ifndef ZB_BLAKE2B_H
#define ZB_BLAKE2B_H
#include "util.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t h[8], t[2];
    uint8_t buf[128];
    size_t c, outlen;
} zb_blake2b;

/* outlen 1..64, keylen 0..64; -1 on bad lengths */
int zb_blake2b_init(zb_blake2b *s, size_t outlen, const void *key, size_t keylen);
void zb_blake2b_update(zb_blake2b *s, const void *in, size_t n);
void zb_blake2b_final(zb_blake2b *s, uint8_t *out);

#endif
