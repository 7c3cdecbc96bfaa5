/* snapshot.h - what a snapshot is made of; shared by snapshot.c (in memory) and
 * snapshot_file.c (on disk). Not part of the cffi contract. */
#ifndef ZB_SNAPSHOT_H
#define ZB_SNAPSHOT_H
#include "fs.h"

#define CHUNK_PAGES 512
#define MIN_MAP_RUN 64     /* store runs at least this long are mapped, shorter ones copied */
#define MAX_INPLACE_RUN 32 /* restore runs up to this long are rewritten in place (stay warm) */
#define STORE_WRITE_RUN 256 /* a snapshot writes its new pages in pwritev batches of at most 1 MiB */

enum { PAGE_IMAGE = 0, PAGE_ZERO, PAGE_STORED };

typedef struct zb_store {
    atomic_int refs;         /* page entries that point here, plus the snapshot that made it */
    int fd;
    uint8_t *map;
    uint64_t npages;
    uint32_t *page_refs;     /* per page: the page entries that point at it */
    uint64_t live_pages;     /* pages with page_refs > 0 */
    uint64_t born;           /* the number of snapshots taken in this process when it was made */
    uint64_t seen;           /* zb_snapshots_memory's pass that last met it ... */
    uint64_t *counted;       /* ... and the pages it counted in that pass (freed after it) */
    /* runs of its dead pages waiting to be punched out together (snapshot.c, "dead store pages
     * given back in batches"), and its place in the list of stores that have such runs */
    struct zb_page_run *dead;
    uint32_t ndead, capdead;
    uint64_t dead_pages;
    size_t dead_slot;
} zb_store;

/* Consecutive pages of a store, from `first`. */
typedef struct zb_page_run { uint32_t first, n; } zb_page_run;

/* A reference to a store that outlives the snapshots using it (the family's fork stores,
 * family_run.c): its live_pages stay up to date; zb_store_release drops it. */
void zb_store_hold(zb_store *s);
void zb_store_release(zb_store *s);

typedef struct zb_page {
    zb_store *store;
    uint32_t index;
    uint32_t kind;
} zb_page;

typedef struct zb_chunk {
    atomic_int refs;
    uint64_t seen;           /* zb_snapshots_memory's pass that last visited it */
    zb_page page[CHUNK_PAGES];
} zb_chunk;

typedef struct zb_guest_state {
    zb_cpu cpu;
    zb_signals sig;
    zb_threads threads;
    zb_process proc;
    zb_uart uart;
    uint64_t vdso_data;
    zb_fs *fs;
    zb_fdtable *fds;
    zb_mem_meta mem;
    zb_lost_children lost;   /* a checkpoint's: the children its restore leaves as zombies (process.h) */
} zb_guest_state;

struct zb_snapshot {
    atomic_int refs;
    zb_engine *engine;
    zb_image *image;
    uint64_t mem_size, nchunks;
    zb_chunk **chunks;  /* NULL: the whole chunk is the image's */
    zb_store *own;      /* the pages this snapshot copied */
    uint64_t *ws;       /* working set bitmap (zb_snapshot_learn_working_set), or NULL */
    uint64_t state_bytes; /* engine memory its copy of the sandbox's fd table and UART buffers holds,
                             counted in zb_snapshot_private_bytes with its own overlay metadata */
    zb_guest_state st;
};

const zb_page *zb_snapshot_page(const zb_snapshot *s, uint64_t pfn);
/* A snapshot of the sandbox as it is now, also inside one of its syscalls (a fork): what
 * zb_sandbox_snapshot takes once it has checked the sandbox has no other processes. */
zb_snapshot *zb_snapshot_take(zb_sandbox *sb, char *err);
/* zb_snapshot_fork for process 1 (child 0) or a child process (child 1): which executor's parked
 * memory the fork may take (snapshot.c, "parked memory"). */
zb_sandbox *zb_snapshot_fork_for(zb_snapshot *snap, int child, char *err);
/* Free every process of process 1's family but itself (family_run.c): it ended, is restored or freed. */
void zb_family_end(zb_sandbox *root);
void zb_guest_state_free(zb_guest_state *st);
/* Fill a snapshot made by a loader (all chunks the image's, no store yet) from an aligned spill
 * record (zb_spill_write), checked as untrusted input: the page records' words, of which `stored`
 * must be stored pages (not zero pages), and those pages' contents read from the file at offset
 * straight into the snapshot's store (through direct_fd, the file opened O_DIRECT, unless it is -1
 * or refuses the read; else through fd), added to mac (if any) as read; -1 with err (the caller
 * releases s and must not use it). */
int zb_snapshot_fill_index(zb_snapshot *s, const uint8_t *words, uint64_t nwords, uint64_t stored, int fd,
                           int direct_fd, uint64_t offset, zb_mac *mac, char *err);

#endif
