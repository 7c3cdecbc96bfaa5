/* shared_map_state.c - the shared-map table as snapshot state: copied by snapshots, forks and
 * restores (zb_mem_meta_capture/apply), saved and loaded with the memory bookkeeping. No file
 * access here (the memory layer); the mappings' coherence with the files is shared_map.c's.
 */
#include "util.h"
#include "memory.h"
#include "shared_map_state.h"
#include "serial.h"

int zb_shmap_copy(const struct zb_shmap *src, struct zb_shmap **dst) {
    *dst = NULL;
    if (!src || !src->n) return 0;
    struct zb_shmap *t = calloc(1, sizeof *t);
    if (!t || !(t->e = malloc(src->n * sizeof *t->e))) { free(t); return -1; }
    memcpy(t->e, src->e, src->n * sizeof *t->e);
    t->n = t->cap = src->n;
    *dst = t;
    return 0;
}

void zb_shmap_free(struct zb_shmap *t) {
    if (t) free(t->e);
    free(t);
}

void zb_shmap_save(const struct zb_shmap *t, zb_out *o) {
    size_t n = t ? t->n : 0;
    out_u64(o, n);
    for (size_t i = 0; i < n; i++) {
        out_u64(o, t->e[i].addr);
        out_u64(o, t->e[i].len);
        out_u64(o, t->e[i].off);
        out_u32(o, t->e[i].ino);
        out_u32(o, t->e[i].writable);
        out_u32(o, t->e[i].aliases);
    }
}

int zb_shmap_load(struct zb_shmap **out, uint64_t mem_size, zb_in *in) {
    *out = NULL;
    uint64_t n = in_count(in, ZB_SHMAP_MAX);
    if (in->err) return -1;
    if (!n) return 0;
    struct zb_shmap *t = calloc(1, sizeof *t);
    if (!t || !(t->e = calloc(n, sizeof *t->e))) { free(t); return -1; }
    t->cap = n;
    for (uint64_t i = 0; i < n && !in->err; i++) {
        zb_shmap_entry *e = &t->e[i];
        e->addr = in_u64(in);
        e->len = in_u64(in);
        e->off = in_u64(in);
        e->ino = in_u32(in);
        uint32_t w = in_u32(in), aliases = in_u32(in);
        e->writable = (uint16_t)(w & 1);
        e->aliases = (uint16_t)ZB_MIN(aliases, (uint32_t)ZB_SHMAP_ALIASES_MAX); /* over it: refused below */
        t->n++;
        if ((e->addr | e->len | e->off) & (ZB_PAGE - 1) || !e->len || e->addr > mem_size ||
            e->len > mem_size - e->addr || e->off + e->len < e->off || !e->ino || w > 1 || aliases > ZB_SHMAP_ALIASES_MAX)
            in->err = 1;
    }
    if (in->err) { zb_shmap_free(t); return -1; }
    *out = t;
    return 0;
}

int zb_shmap_same(const struct zb_shmap *a, const struct zb_shmap *b) {
    size_t na = a ? a->n : 0, nb = b ? b->n : 0;
    return na == nb && (!na || !memcmp(a->e, b->e, na * sizeof *a->e));
}
