/* memory.h - the memory layer: the guest's physical (= virtual) layout, the memory images a
 * mapping is built on, the guest mapping with its allocator, dirty bits and regions, its
 * snapshot bookkeeping, and validated guest pointers (guest_memory.c).
 */
#ifndef ZB_MEMORY_H
#define ZB_MEMORY_H
#include "util.h"
#include "guest_abi.h"

/* ---- guest physical (= virtual) layout; see guest_layout.c and docs/ARCHITECTURE.md ---- */
#define ZB_LOW_REGION ((unsigned long)ZB_LOW_REGION_BYTES) /* supervisor-only: page tables, GDT/IDT/TSS, CPL0 stubs */
#define ZB_MEM_MIN (64ul << 20)
#define ZB_MEM_MAX (64ul << 30)
#define ZB_STACK_SIZE (8ul << 20)
#define ZB_PIE_BASE (16ul << 20)

/* The snapshot state writer and reader (serial.h): each component saves and loads its own state
 * with them; snapshot_file.c calls them in order. */
struct zb_out;
struct zb_in;
/* A memory image a sandbox's mapping can be built on: a template's memory file, shared
 * read-only (MAP_PRIVATE) by every fork in every process that loads the template. */
typedef struct zb_image {
    atomic_int refs;
    int fd;
    uint64_t size;
    const uint8_t *map;      /* read-only view of the image, to compare pages with; NULL if unmappable */
    uint64_t *data;          /* bitmap: page holds data in the file (else it is a hole: zeros);
                                NULL if the file system cannot tell (then every page may hold data) */
} zb_image;
/* Does image page pfn read as zeros without reading it (a hole of the sparse image file)? */
int zb_image_page_is_hole(const zb_image *img, uint64_t pfn);
zb_image *zb_image_new(int fd, uint64_t size);
void zb_image_ref(zb_image *img);
void zb_image_unref(zb_image *img);

/* ---- guest memory (guest_memory.c) ---- */
typedef struct zb_region {   /* what the guest mapped where: for fault reports and munmap */
    uint64_t start, end;
    int prot;
    char name[96];
} zb_region;

struct zb_shmap;
/* A memory budget several guest mappings share: a process family's (issue 15; proc_family.c
 * makes it when process 1 first forks, with process 1's pages_limit as its limit). It reserves,
 * as Linux's strict overcommit accounting does: each member is charged every page it could come
 * to own privately on the host (zb_mem_charge), whether or not it has written it yet, so that the
 * family stays inside the limit even if every process rewrites all of its memory. Single
 * threaded: the family runs one process at a time (family_run.c). */
struct zb_memory;
typedef struct zb_mem_budget {
    const struct zb_memory *owner; /* process 1's memory: its pages_limit is the budget's limit (the
                                one setting, zb_sandbox_set_memory_limit; a restore brings it back) */
    uint64_t used;           /* pages: the sum of the members' charges */
    uint64_t shared_pages;   /* pages charged to the family as a whole, once: the live pages of the
                                stores its fork snapshots made (family_run.c). Hook for MAP_SHARED
                                memory shared across fork (the `mp` work): its pages are one host
                                copy for the whole family, so they belong here, not in a member's
                                zb_mem_charge */
    uint64_t peak;           /* the most used + shared_pages ever was (statistics) */
    uint64_t refusals;       /* allocations and forks refused because the family's use did not leave
                                room (within the process's own limit): the kernel tells the cell */
} zb_mem_budget;
/* Pages charged to b in all. */
static inline uint64_t zb_mem_budget_total(const zb_mem_budget *b) { return b->used + b->shared_pages; }

typedef struct zb_memory {
    uint8_t *host;           /* host address of guest physical 0 */
    uint64_t size;           /* bytes, multiple of 2 MiB */
    uint64_t npages;
    uint64_t *allocated;     /* bitmap: page belongs to the guest (ELF, stack, brk, mmap) */
    uint64_t *host_dirty;    /* bitmap: pages changed by the engine (guest writes: KVM dirty log) */
    uint64_t *file_backed;   /* bitmap: page's host mapping is a file (the base image, a snapshot
                                store or a host file the guest mapped): MADV_DONTNEED would not
                                make it read zero */
    uint64_t *from_image;    /* bitmap: page's host mapping is the base image at the same offset,
                                so MADV_DONTNEED reverts it to the image's content */
    uint64_t pages_allocated, pages_limit;
    uint64_t mmap_top;       /* top-down mmap search starts below this */
    uint64_t brk_start, brk_end;
    zb_region *regions;
    size_t nregions, regions_cap;
    zb_image *image;         /* base image this mapping was forked from, or NULL */
    struct zb_reprotect *reprotect; /* when pages left writable after a snapshot are protected
                                again (page_reprotect.c); NULL until the first snapshot needs it */
    uint64_t unchanged_finds;  /* pages a snapshot or restore found logged as written but unchanged */
    uint64_t pages_reprotected; /* of which write-protected again (statistics) */
    uint64_t *stale;         /* bitmap: freed anonymous pages kept mapped for reuse (still holding
                                what the guest wrote): zeroed when handed out again, given back at
                                the next restore (zb_mem_free_for_reuse) */
    uint64_t stale_pages;
    uint64_t *dropped;       /* bitmap: pages an execve let go of without zeroing them (zb_mem_drop):
                                free, holding what they held then, zeroed when handed out again.
                                Unlike stale pages, they are not in the dirty set unless written,
                                so where they are not, they still hold the base's content */
    uint64_t dropped_pages;
    struct zb_shmap *shmap;  /* MAP_SHARED mappings of overlay files (shared_map.h), or NULL */
    uint64_t unlogged_lo, unlogged_hi; /* the unlogged window (below): guest physical [lo, hi),
                                2 MiB aligned, where big anonymous mappings go; lo == hi: none */
    uint64_t window_part_pages; /* the window is memslots of this many pages (the last shorter) */
    uint32_t window_parts;
    uint8_t *window_logged;  /* per part: 1 = it should be dirty-logged (it held still) */
    uint8_t *window_still;   /* per part: snapshots in a row that found its pages unchanged */
    zb_mem_budget *budget;   /* the family's budget this mapping is charged to, or NULL (alone) */
    uint64_t charged;        /* pages this mapping has charged to `budget` (zb_mem_charge as of the
                                last zb_mem_budget_sync) */
    uint64_t peak_charge;    /* the most zb_mem_charge ever was (ru_maxrss of a process) */
} zb_memory;

/* What m costs the host at most, in pages, counted toward its budget: every page the guest has
 * allocated (any of them may be written, so become a private copy) and the freed pages kept for
 * reuse or left by an execve (they still hold memory). Pages shared by the whole family are the
 * budget's shared_pages: MAP_SHARED memory shared across fork (the `mp` work) must be left out of
 * this count and charged there once, so that it counts once per family and not once per process. */
static inline uint64_t zb_mem_charge(const zb_memory *m) { return m->pages_allocated + m->stale_pages + m->dropped_pages; }
/* Bring m's charge to its budget up to date (after its pages changed; cheap, no-op alone). */
void zb_mem_budget_sync(zb_memory *m);
/* Can m take n more pages: under its own pages_limit and, in a family, under the family's budget.
 * Every allocation path asks this before zb_mem_mark (mmap, brk, mremap, the ELF loader). When the
 * family's budget is what refuses, m's kept freed pages (stale, dropped) are given back first: they
 * are a cache, and must not make an allocation fail. */
int zb_mem_fits(zb_memory *m, uint64_t n);
/* Charge m to budget b: -ENOMEM, and nothing charged, if that does not fit. */
int zb_mem_budget_join(zb_memory *m, zb_mem_budget *b);
/* Make b the budget owned by m (process 1), charged with m's pages. */
void zb_mem_budget_own(zb_memory *m, zb_mem_budget *b);
/* Take m's charge off its budget (before it is freed); m is alone afterwards. */
void zb_mem_budget_leave(zb_memory *m);

int zb_mem_init(zb_memory *m, uint64_t size, zb_image *image, char *err);
/* The unlogged window. KVM's dirty logging maps guest memory in 4 KiB pages, so a guest filling a
 * fresh 2 GiB array takes 524,288 shadow page faults (8-20 us each here); in a memslot without dirty
 * logging backed by transparent huge pages it takes 1,024. Big data mappings (zb_mem_alloc of
 * ZB_ALLOC_DATA, at least ZB_UNLOGGED_MIN_BYTES) are placed in such a window, 2 MiB aligned. The
 * window is a few memslots ("parts"), each either unlogged or logged:
 *  - unlogged, what changed there is found without KVM: every page the host has populated (present
 *    or swapped, zb_mem_populated) counts as possibly written at each dirty collection, and the
 *    snapshot's comparison drops those that did not change (snapshot.c);
 *  - a part whose pages two snapshots in a row found unchanged is logged from then on (comparing
 *    data that holds still costs ~0.5 s per GiB per snapshot; the log costs nothing until written);
 *  - a part gets unlogged again when a big mapping is made in it, or when a snapshot finds a
 *    quarter of it rewritten (zb_mem_window_observe).
 * The VM applies these wishes (zb_vm_sync_window); whatever a part's state, collecting is correct.
 * Guest memory gets a window while zb_mem_unlogged_window (zeroboot.h) is on, the default. */
#define ZB_UNLOGGED_MIN_BYTES (4ul << 20)
/* m has an unlogged window if and only if new memory of its size would get one now (memory kept
 * for another fork must be what zb_mem_init would make: zb_mem_unlogged_window may have changed). */
int zb_mem_window_as_new(const zb_memory *m);
/* Set in `dirty` (one bit per guest page) every page of [first, first+n) the host has populated.
 * If the host cannot say, every page of it. */
void zb_mem_populated(const zb_memory *m, uint64_t first, uint64_t n, uint64_t *dirty);
/* A snapshot is being taken and m->host_dirty holds the pages that changed since the last one:
 * update the parts' wishes (logged or not). */
void zb_mem_window_observe(zb_memory *m);
/* The window part of page pfn, or -1. */
int zb_mem_window_part(const zb_memory *m, uint64_t pfn);
void zb_mem_destroy(zb_memory *m);
/* The bookkeeping part of guest memory (which pages are the guest's, its regions, brk), as a
 * snapshot keeps it. */
typedef struct zb_mem_meta {
    uint64_t *allocated;
    uint64_t npages, pages_allocated, pages_limit, mmap_top, brk_start, brk_end;
    zb_region *regions;
    size_t nregions;
    struct zb_shmap *shmap;  /* a copy of zb_memory's, or NULL */
} zb_mem_meta;
/* Copy m's bookkeeping into a snapshot's (capture), or a snapshot's back into m (apply). */
int zb_mem_meta_capture(const zb_memory *m, zb_mem_meta *out);
int zb_mem_meta_apply(zb_memory *m, const zb_mem_meta *in);
void zb_mem_meta_free(zb_mem_meta *meta);

/* page_reprotect.c: a pass (one snapshot or restore) meets pages that were logged as written
 * (logged: in KVM's log or written by the engine since the base) or left writable earlier. For one
 * found holding what it should, zb_reprotect_unchanged says whether to write-protect it again now;
 * for one that changed (or is rewritten), zb_reprotect_changed restarts its count. */
void zb_reprotect_pass_begin(zb_memory *m);
int zb_reprotect_unchanged(zb_memory *m, uint64_t pfn, int logged);
void zb_reprotect_changed(zb_memory *m, uint64_t pfn, int logged);
void zb_reprotect_free(zb_memory *m);
/* On disk; a load refuses another page count than npages (the snapshot's memory size). */
void zb_mem_meta_save(const zb_mem_meta *m, struct zb_out *o);
int zb_mem_meta_load(zb_mem_meta *m, uint64_t npages, struct zb_in *in, char *err);
/* Validated access to guest memory: NULL unless [addr, addr+len) lies in guest-allocated user
 * pages. `write` marks the pages dirty. */
void *zb_guest_ptr(zb_sandbox *sb, uint64_t addr, uint64_t len, int write);
int zb_copy_from_guest(zb_sandbox *sb, void *dst, uint64_t addr, uint64_t len);
int zb_copy_to_guest(zb_sandbox *sb, uint64_t addr, const void *src, uint64_t len);
/* Copy a NUL-terminated guest string; -EFAULT or -ENAMETOOLONG. */
int zb_guest_string(zb_sandbox *sb, uint64_t addr, char *buf, size_t cap);
/* What a new mapping holds, which decides where zb_mem_alloc puts it. Only big data the guest is
 * about to fill belongs in the unlogged window: a library's image, a malloc arena or a thread stack
 * there would be written at nearly every snapshot, so its part would never be logged and every
 * populated page of the part (libraries' text included) would be compared at every snapshot and
 * fork (~1,700 pages of libpython, numpy and OpenBLAS in the template: ~1 ms a fork). */
typedef enum { ZB_ALLOC_OTHER, ZB_ALLOC_DATA } zb_alloc_kind;
uint64_t zb_mem_alloc(zb_memory *m, uint64_t len, zb_alloc_kind kind); /* top-down; 0 if none */
int zb_mem_range_free(const zb_memory *m, uint64_t addr, uint64_t len);
int zb_mem_range_allocated(const zb_memory *m, uint64_t addr, uint64_t len);
void zb_mem_mark(zb_memory *m, uint64_t addr, uint64_t len, int allocated);
/* Give pages back: contents read as zero afterwards. */
int zb_mem_zero(zb_memory *m, uint64_t addr, uint64_t len);
/* The guest freed [addr, addr+len): like zb_mem_zero, but a big anonymous range keeps its host
 * pages (and the VM's mappings of them) until the next restore, and is zeroed in place if the
 * guest allocates it again (zb_mem_mark): a freed 80 MB temporary costs one memset instead of
 * 20,000 first-touch faults. Snapshots record such pages as zero pages (they are logged as
 * written and not allocated). The caller marks the range free. */
int zb_mem_free_for_reuse(zb_memory *m, uint64_t addr, uint64_t len);
/* Give back every page kept for reuse (before a restore: memory then holds exactly what the
 * snapshot says, and nothing freed survives a rollback, a rewind or an isolated cell's reset). */
int zb_mem_release_stale(zb_memory *m);
/* An execve lets go of the old program's pages [addr, addr+len) (allocated ones): marked free and
 * dropped, without touching them. Zeroing ~300 MB of a Python image there made every exec'd child
 * dirty all of it, so its memory could not serve the next fork (snapshot.c, parked memory): each
 * `!cmd` then ran on new memory with cold shadow page tables (~1,000 faults, 35 ms). Dropped pages
 * are zeroed when handed out again (zb_mem_mark), given back before a snapshot records the memory
 * (zb_mem_release_dropped: a free page must be a zero page there), and forgotten by a restore, which
 * rewrites every page in the dirty set and leaves the others, which hold the base's content. */
void zb_mem_drop(zb_memory *m, uint64_t addr, uint64_t len);
int zb_mem_release_dropped(zb_memory *m);
/* Both kinds of kept freed pages given back (stale, then dropped): when a budget is tight. */
int zb_mem_release_kept(zb_memory *m);
/* After a restore made the memory equal to a snapshot: nothing is dropped any more. */
void zb_mem_forget_dropped(zb_memory *m);
/* Host-side prefault of a new anonymous guest mapping the guest is about to fill (numpy arrays,
 * pandas frames): transparent huge pages where allowed, then MADV_POPULATE_WRITE, so the guest's
 * first touch of each page costs ~1.5 us instead of 8-20 us. Best effort: errors are ignored. */
void zb_mem_prefault_anonymous(zb_memory *m, uint64_t addr, uint64_t len);
/* Map len bytes of host fd at offset (page aligned) copy-on-write at guest addr. */
int zb_mem_map_file(zb_memory *m, uint64_t addr, uint64_t len, int fd, uint64_t offset);
/* Make [addr, addr+len) read the base image's bytes again (no-op copy where already mapped). */
int zb_mem_revert_to_image(zb_memory *m, uint64_t addr, uint64_t len);
/* Give back the host's private copies of pages mapped from the image at their own offset that
 * hold the image's bytes again (CPython raises and lowers reference counts, so most pages a cell
 * writes end as they were): the guest then reads the same bytes from the image's shared page
 * cache, and a later write copies the page again. Content-preserving, so snapshots, restores and
 * dirty tracking are unaffected. Only while the sandbox does not run. Pages released, or -errno. */
int64_t zb_mem_release_image_copies(zb_memory *m);
void zb_mem_dirty(zb_memory *m, uint64_t addr, uint64_t len);
void zb_region_add(zb_memory *m, uint64_t start, uint64_t end, int prot, const char *name);
void zb_region_remove(zb_memory *m, uint64_t start, uint64_t end);
void zb_region_set_prot(zb_memory *m, uint64_t start, uint64_t end, int prot);
const zb_region *zb_region_find(const zb_memory *m, uint64_t addr);
static inline int zb_bit(const uint64_t *b, uint64_t i) { return (b[i >> 6] >> (i & 63)) & 1; }
static inline void zb_bit_set(uint64_t *b, uint64_t i) { b[i >> 6] |= 1ull << (i & 63); }
static inline void zb_bit_clear(uint64_t *b, uint64_t i) { b[i >> 6] &= ~(1ull << (i & 63)); }
void zb_bits_set_range(uint64_t *b, uint64_t first, uint64_t n, int value);

#endif
