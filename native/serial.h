/* serial.h - the little binary writer/reader used to save and load snapshot state.
 *
 * Every field is fixed-width little-endian, written and read one at a time (no struct is ever
 * dumped whole: its padding and layout are the compiler's, not the format's). The state file is a
 * sequence of sections (out_section_begin/end, in_section), one per component, each a tag and a
 * length; a component's loader reads from a reader bounded to its own section and must consume it
 * exactly (in_section_done).
 *
 * The reader never trusts the file: every read is bounds-checked, and after the first error all
 * reads return zeros and `err` stays set, so a corrupt template yields an error, never a crash.
 * Counts and lengths read from the file are checked against a maximum before anything is
 * allocated for them (in_count).
 */
#ifndef ZB_SERIAL_H
#define ZB_SERIAL_H
#include <endian.h>
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
static inline void out_u8(zb_out *o, uint8_t v) { out_bytes(o, &v, 1); }
static inline void out_u16(zb_out *o, uint16_t v) { v = htole16(v); out_bytes(o, &v, 2); }
static inline void out_u32(zb_out *o, uint32_t v) { v = htole32(v); out_bytes(o, &v, 4); }
static inline void out_u64(zb_out *o, uint64_t v) { v = htole64(v); out_bytes(o, &v, 8); }
static inline void out_i64(zb_out *o, int64_t v) { out_u64(o, (uint64_t)v); }
static inline void out_str(zb_out *o, const char *s) {
    uint32_t n = s ? (uint32_t)strlen(s) : 0;
    out_u32(o, n);
    out_bytes(o, s, n);
}
/* A bitmap of 64-bit words, word by word. */
static inline void out_words(zb_out *o, const uint64_t *w, size_t nwords) {
    for (size_t i = 0; i < nwords; i++) out_u64(o, w[i]);
}

/* Start a section: its tag, and a length patched in by out_section_end. Returns where the length
 * is (or -1, with o->err set). */
static inline long out_section_begin(zb_out *o, uint32_t tag) {
    out_u32(o, tag);
    long at = o->err ? -1 : ftell(o->f);
    if (at < 0) o->err = 1;
    out_u64(o, 0);
    return at;
}
static inline void out_section_end(zb_out *o, long at) {
    if (o->err) return;
    long end = ftell(o->f);
    if (end < at + 8 || fseek(o->f, at, SEEK_SET) < 0) { o->err = 1; return; }
    out_u64(o, (uint64_t)(end - at - 8));
    if (fseek(o->f, end, SEEK_SET) < 0) o->err = 1;
}

static inline int in_bytes(zb_in *in, void *dst, size_t n) {
    if (!n) return in->err ? -1 : 0; /* dst may be NULL then */
    if (in->err || n > in->len - in->pos) {
        in->err = 1;
        memset(dst, 0, n);
        return -1;
    }
    memcpy(dst, in->p + in->pos, n);
    in->pos += n;
    return 0;
}
static inline uint8_t in_u8(zb_in *in) { uint8_t v; in_bytes(in, &v, 1); return v; }
static inline uint16_t in_u16(zb_in *in) { uint16_t v; in_bytes(in, &v, 2); return le16toh(v); }
static inline uint32_t in_u32(zb_in *in) { uint32_t v; in_bytes(in, &v, 4); return le32toh(v); }
static inline uint64_t in_u64(zb_in *in) { uint64_t v; in_bytes(in, &v, 8); return le64toh(v); }
static inline int64_t in_i64(zb_in *in) { return (int64_t)in_u64(in); }
static inline void in_words(zb_in *in, uint64_t *w, size_t nwords) {
    for (size_t i = 0; i < nwords; i++) w[i] = in_u64(in);
}
/* A count or length of at most max (0 and in->err set if more, or on an earlier error). */
static inline uint64_t in_count(zb_in *in, uint64_t max) {
    uint64_t n = in_u64(in);
    if (in->err || n > max) { in->err = 1; return 0; }
    return n;
}
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

/* The next section, which must carry `tag`: *sec becomes a reader of exactly its bytes, and `in`
 * moves past it. -1 (both readers in error) for another tag or a length beyond the input. */
static inline int in_section(zb_in *in, uint32_t tag, zb_in *sec) {
    uint32_t t = in_u32(in);
    uint64_t n = in_u64(in);
    if (in->err || t != tag || n > in->len - in->pos) {
        in->err = 1;
        *sec = (zb_in){NULL, 0, 0, 1};
        return -1;
    }
    *sec = (zb_in){in->p + in->pos, (size_t)n, 0, 0};
    in->pos += (size_t)n;
    return 0;
}
/* 1 if a section was read without error and to its last byte (a loader that reads less or more
 * than the saver wrote disagrees with it about the format). */
static inline int in_section_done(const zb_in *sec) { return !sec->err && sec->pos == sec->len; }
#endif
