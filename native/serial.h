/* serial.h - the little binary writer/reader used to save and load snapshot state.
 * The reader never trusts the file: every read is bounds-checked, and after the first error all
 * reads return zeros and `err` stays set, so a corrupt template yields an error, never a crash. */
#ifndef ZB_SERIAL_H
#define ZB_SERIAL_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct zb_out {
    FILE *f;
    int err;
} zb_out;

typedef struct zb_in {
    const uint8_t *p;
    size_t len, pos;
    int err;
} zb_in;

static inline void out_bytes(zb_out *o, const void *p, size_t n) {
    if (!o->err && n && fwrite(p, 1, n, o->f) != n) o->err = 1;
}
static inline void out_u32(zb_out *o, uint32_t v) { out_bytes(o, &v, 4); }
static inline void out_u64(zb_out *o, uint64_t v) { out_bytes(o, &v, 8); }
static inline void out_str(zb_out *o, const char *s) {
    uint32_t n = s ? (uint32_t)strlen(s) : 0;
    out_u32(o, n);
    out_bytes(o, s, n);
}

static inline int in_bytes(zb_in *in, void *dst, size_t n) {
    if (in->err || n > in->len - in->pos) {
        in->err = 1;
        memset(dst, 0, n);
        return -1;
    }
    memcpy(dst, in->p + in->pos, n);
    in->pos += n;
    return 0;
}
static inline uint32_t in_u32(zb_in *in) { uint32_t v; in_bytes(in, &v, 4); return v; }
static inline uint64_t in_u64(zb_in *in) { uint64_t v; in_bytes(in, &v, 8); return v; }
/* A string of at most max bytes, malloc'd and NUL-terminated; NULL on error. */
static inline char *in_str(zb_in *in, size_t max) {
    uint32_t n = in_u32(in);
    if (in->err || n > max || n > in->len - in->pos) { in->err = 1; return NULL; }
    char *s = malloc((size_t)n + 1);
    if (!s) { in->err = 1; return NULL; }
    memcpy(s, in->p + in->pos, n);
    s[n] = 0;
    in->pos += n;
    return s;
}
/* Copy a string into a fixed buffer of cap bytes. */
static inline void in_str_into(zb_in *in, char *buf, size_t cap) {
    char *s = in_str(in, cap - 1);
    if (s) { memcpy(buf, s, strlen(s) + 1); free(s); }
    else buf[0] = 0;
}
#endif
