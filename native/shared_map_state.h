/* shared_map_state.h - the table of a sandbox's MAP_SHARED mappings of overlay files, as memory
 * bookkeeping (zb_memory, zb_mem_meta): its entries, lookups, and its snapshot form
 * (shared_map_state.c). What keeps mappings and files coherent is the file layer's (shared_map.h).
 */
#ifndef ZB_SHARED_MAP_STATE_H
#define ZB_SHARED_MAP_STATE_H
#include "util.h"
#include "memory.h"

#define ZB_SHMAP_MAX 1024 /* shared file mappings per sandbox (ENOMEM past it) */

typedef struct zb_shmap_entry {
    uint64_t addr, len;      /* guest range, page aligned */
    uint64_t off;            /* file offset of addr, page aligned */
    uint32_t ino;            /* overlay inode; the mapping holds an open reference on it */
    uint16_t writable;       /* mapped with PROT_WRITE: written back, and never overlapped */
    uint16_t aliases;        /* further mmaps of exactly this file range in this process, given this
                                same address (zb_shmap_alias); each munmap of it takes one back */
} zb_shmap_entry;

#define ZB_SHMAP_ALIASES_MAX 64 /* aliases of one mapping (EBUSY past it) */

struct zb_shmap {
    size_t n, cap;
    zb_shmap_entry *e;
};

struct zb_out;
struct zb_in;

/* Snapshot state (called by guest_memory.c's zb_mem_meta_*): an exact copy (NULL for none),
 * freeing, and the on-disk form. A load checks every range against the memory size. */
int zb_shmap_copy(const struct zb_shmap *src, struct zb_shmap **dst);
void zb_shmap_free(struct zb_shmap *t);
void zb_shmap_save(const struct zb_shmap *t, struct zb_out *o);
int zb_shmap_load(struct zb_shmap **t, uint64_t mem_size, struct zb_in *in);
int zb_shmap_same(const struct zb_shmap *a, const struct zb_shmap *b);

#endif
